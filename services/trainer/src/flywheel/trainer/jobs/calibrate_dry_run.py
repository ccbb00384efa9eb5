"""Measure a few real training steps and print them beside the dry run's estimate, to calibrate
``dry_run.CPU`` (or check it)::

    OMP_NUM_THREADS=1 nice -n 10 python -m flywheel.trainer.jobs.calibrate_dry_run tiny sft 6
    python -m flywheel.trainer.jobs.calibrate_dry_run smollm2 dpo 3 --estimate-only

Steps are timed from ``on_progress`` (the first step, with its warm-up, is left out) in wall
seconds and in the process's CPU seconds. With one thread, CPU seconds stay meaningful on a
shared machine (with more, OpenMP's spin-waiting counts as CPU time). Peak memory is the
process's max RSS. Not part of the service: a tool for whoever revises the figures."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import statistics
import tempfile
import time
from typing import Any

from flywheel.trainer.jobs.dry_run import estimate
from flywheel.trainer.training import RewardFunction, TrainSpec, train


def rows_for(kind: str) -> list[dict[str, Any]]:
    """40 rows of ~43 SmolLM2 tokens (prompt + completion)."""
    prompts = [f"Question {i}: what is the capital of country number {i} in the list of nations?" for i in range(40)]
    answers = [f"The capital of country {i} is a city with a long and interesting history, called City{i}." for i in range(40)]  # fmt: skip  # noqa: E501
    if kind == "dpo":
        return [{"prompt": p, "chosen": a, "rejected": a[::-1]} for p, a in zip(prompts, answers, strict=True)]
    if kind == "grpo":
        return [{"prompt": p} for p in prompts]
    return [{"prompt": p, "completion": a} for p, a in zip(prompts, answers, strict=True)]


def spec_for(base: str, kind: str, steps: int) -> TrainSpec:
    common = {"base_model": base, "max_steps": steps, "device": "cpu", "save_steps": 1000}
    if kind == "grpo":
        reward = RewardFunction(fn=lambda prompts, completions, **_: [float(len(c)) for c in completions])
        online = {"batch_size": 2, "num_generations": 4, "max_completion_length": 32, "rewards": (reward,)}
        return TrainSpec(kind="grpo", **online, **common)
    return TrainSpec(kind=kind, batch_size=4, **common)  # type: ignore[arg-type]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base", help="'tiny', 'smollm2' or a model folder")
    parser.add_argument("kind", choices=("sft", "dpo", "grpo"))
    parser.add_argument("steps", type=int)
    parser.add_argument("--estimate-only", action="store_true", help="print the estimate, train nothing")
    args = parser.parse_args()
    spec, rows = spec_for(args.base, args.kind, args.steps), rows_for(args.kind)
    dry = estimate(spec, rows, [], device="cpu")
    out: dict[str, Any] = {
        "base": args.base,
        "kind": args.kind,
        "estimated_step_s": round(dry.seconds_per_step, 2),
        "estimated_memory_mb": round(dry.estimated_memory_bytes / 2**20),
        "memory_mb": {k: round(v / 2**20) for k, v in dry.memory.items()},
        "tokens_per_step": dry.tokens_per_step,
    }
    if not args.estimate_only:
        marks: list[tuple[float, float]] = []
        with tempfile.TemporaryDirectory() as folder:
            train(spec, rows, folder, on_progress=lambda p: marks.append((time.monotonic(), time.process_time())))
        wall = [b[0] - a[0] for a, b in itertools.pairwise(marks[1:])]
        cpu = [b[1] - a[1] for a, b in itertools.pairwise(marks[1:])]
        out |= {
            "measured_step_wall_s": round(statistics.fmean(wall), 2) if wall else None,
            "measured_step_cpu_s": round(statistics.fmean(cpu), 2) if cpu else None,
            "measured_max_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "load_average": os.getloadavg()[0],
            "torch_threads": __import__("torch").get_num_threads(),
        }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
