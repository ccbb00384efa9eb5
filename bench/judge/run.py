"""Judgements per second: Flywheel's reward judge (Rank: the group in one call per
presentation order, judgement cache in PostgreSQL) against a naive LiteLLM loop (one
call per judgement, no cache), both against the same scripted OpenAI-compatible server
with a fixed delay per call; then the same workload again, to count the calls the cache
saves on a repeated run.

    python bench/judge/run.py [--quick] [--delay-ms 200] [--concurrency 8]

Real NATS, PostgreSQL and S3 start under a temporary folder (the service checks them for
readiness), the judge's schema is migrated, and `python -m flywheel.reward_judge` serves
with its LLM pointed at `flywheel.reward_judge.testing.scripted_llm` in its own process.
Each contestant sends the same P prompts x G responses with the same number of LLM calls
in flight (``--concurrency``; Flywheel gets half as many Rank requests in flight, since
each has its two calls in flight at once):

- flywheel: `Rank(prompt, G responses)` over gRPC. The service judges the group in two
  orders (its position-bias countermeasure: 2 LLM calls per group, whatever G is),
  parses strictly, and caches the result by content hash.
- naive_litellm: `litellm.acompletion` once per (prompt, response) with the same judge
  prompt for one response, `json.loads` on the answer; nothing cached.

The scripted server counts the calls it answers (GET /stats). Every process started here
is stopped by pid, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import grpc

from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb
from flywheel.api.reward.v1 import reward_judge_service_pb2_grpc as pb_grpc
from flywheel.reward_judge import rubric
from flywheel.reward_judge.prompts import judge_messages
from flywheel.stack import benchstamp
from flywheel.stack.servers import free_port
from flywheel.stack.services import ServiceProcess, migrate
from flywheel.stack.stack import Servers

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parents[1] / "bench" / "results" / "judge.json"
FULL = {"prompts": 150, "group": 4}
QUICK = {"prompts": 30, "group": 4}
GOALS = {"flywheel_vs_naive_litellm": 1.5, "flywheel_repeat_vs_naive_litellm": 10.0, "calls_saved_on_repeat": 0.95}
# Versions recorded with the results.
PACKAGES = ("litellm", "grpcio", "aiohttp", "sqlalchemy", "asyncpg")
MODEL = "openai/scripted-judge"


def log(*args: object) -> None:
    print(*args, file=sys.stderr, flush=True)


def workload(prompts: int, group: int) -> list[tuple[str, list[str]]]:
    words = ["latency", "cache", "tokens", "judge", "rubric", "answer", "prompt", "policy", "reward", "arm"]
    out = []
    for p in range(prompts):
        responses = [
            " ".join(words[(p + r + k) % len(words)] for k in range(10 + 15 * r)) + f" (answer {r} to {p})"
            for r in range(group)
        ]
        out.append((f"Question {p}: how should the platform trade {words[p % len(words)]} against quality?", responses))
    return out


def llm_calls(stats_url: str) -> int:
    with urllib.request.urlopen(stats_url, timeout=5) as resp:  # noqa: S310 - our own loopback server
        return int(json.load(resp)["calls"])


async def run_flywheel(address: str, work: list[tuple[str, list[str]]], concurrency: int) -> tuple[float, int, int]:
    """(seconds, judgements, fallbacks) for Rank over every group."""
    gate = asyncio.Semaphore(concurrency)
    fallbacks = 0
    async with grpc.aio.insecure_channel(address) as channel:
        stub = pb_grpc.RewardJudgeServiceStub(channel)

        async def one(prompt: str, responses: list[str]) -> int:
            nonlocal fallbacks
            async with gate:
                r = await stub.Rank(pb.RankRequest(prompt=prompt, responses=responses), timeout=120)
            fallbacks += r.fallback_used
            return len(r.judgements)

        started = time.perf_counter()
        counts = await asyncio.gather(*(one(p, rs) for p, rs in work))
        return time.perf_counter() - started, sum(counts), fallbacks


async def run_naive(api_base: str, work: list[tuple[str, list[str]]], concurrency: int) -> tuple[float, int, int]:
    """(seconds, judgements, failures): one LiteLLM call per judgement."""
    import litellm

    rb = rubric.presets()["default"]
    gate = asyncio.Semaphore(concurrency)
    failures = 0

    async def one(prompt: str, response: str) -> None:
        nonlocal failures
        async with gate:
            resp = await litellm.acompletion(
                model=MODEL,
                messages=judge_messages(rb, prompt, [response]),
                temperature=0.0,
                api_base=api_base,
                api_key="sk-bench",
                timeout=60,
            )
        try:
            json.loads(resp.choices[0].message.content)
        except (TypeError, ValueError):
            failures += 1

    started = time.perf_counter()
    await asyncio.gather(*(one(p, r) for p, rs in work for r in rs))
    return time.perf_counter() - started, sum(len(rs) for _, rs in work), failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--delay-ms", type=float, default=200.0, help="the scripted LLM's delay per call")
    parser.add_argument("--concurrency", type=int, default=8, help="LLM calls in flight, for both contestants")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the temporary folder (logs)")
    args = parser.parse_args()
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    params = {**(QUICK if args.quick else FULL), "quick": args.quick}
    params.update(delay_ms=args.delay_ms, concurrency=args.concurrency, rubric="default", model=MODEL)
    work = workload(params["prompts"], params["group"])

    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-judge-"))
    servers = Servers.create(root / "servers")
    llm_proc: subprocess.Popen[bytes] | None = None
    judge: ServiceProcess | None = None
    try:
        log("starting NATS, PostgreSQL, S3 ...")
        servers.start()
        port = free_port()
        with (root / "scripted_llm.log").open("ab") as out:
            llm_proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "flywheel.reward_judge.testing.scripted_llm",
                    "--port",
                    str(port),
                    "--delay-ms",
                    str(args.delay_ms),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        api_base, stats_url = f"http://127.0.0.1:{port}/v1", f"http://127.0.0.1:{port}/stats"
        env = {
            **servers.env(namespace="bjudge", schema="bench_judge", bucket_prefix="bjudge"),
            "FLYWHEEL_REWARD_JUDGE_LLM_MODEL": MODEL,
            "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": api_base,
            "FLYWHEEL_REWARD_JUDGE_LLM_API_KEY": "sk-bench",
            "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
            "FLYWHEEL_REWARD_JUDGE_LOG_LEVEL": "WARNING",
        }
        migrate("reward_judge", env)
        judge = ServiceProcess("reward_judge", env=env, log_dir=root / "logs")
        judge.start()
        judge.wait_serving(60)
        deadline = time.monotonic() + 10
        while True:
            try:
                llm_calls(stats_url)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

        figures: dict[str, Any] = {}
        log("naive LiteLLM loop ...")
        before = llm_calls(stats_url)
        secs, n, failures = asyncio.run(run_naive(api_base, work, args.concurrency))
        figures["naive_litellm"] = {
            "judgements": n,
            "seconds": round(secs, 3),
            "judgements_per_s": round(n / secs, 2),
            "llm_calls": llm_calls(stats_url) - before,
            "unparsed": failures,
        }
        for run in ("flywheel", "flywheel_repeat"):
            log(f"{run} ...")
            before = llm_calls(stats_url)
            # Each Rank has its two orders' calls in flight at once: half the requests keep the
            # same number of LLM calls in flight as the naive loop.
            secs, n, fallbacks = asyncio.run(run_flywheel(judge.address, work, max(1, args.concurrency // 2)))
            figures[run] = {
                "judgements": n,
                "seconds": round(secs, 3),
                "judgements_per_s": round(n / secs, 2),
                "llm_calls": llm_calls(stats_url) - before,
                "fallbacks": fallbacks,
            }
        cold, warm, naive = figures["flywheel"], figures["flywheel_repeat"], figures["naive_litellm"]
        figures["calls_saved_on_repeat"] = cold["llm_calls"] - warm["llm_calls"]
        ratios = {
            "flywheel_vs_naive_litellm": round(cold["judgements_per_s"] / naive["judgements_per_s"], 3),
            "flywheel_repeat_vs_naive_litellm": round(warm["judgements_per_s"] / naive["judgements_per_s"], 3),
            "calls_saved_on_repeat": round(figures["calls_saved_on_repeat"] / max(cold["llm_calls"], 1), 3),
            "llm_calls_per_judgement_flywheel_vs_naive": round(
                (cold["llm_calls"] / cold["judgements"]) / (naive["llm_calls"] / naive["judgements"]), 3
            ),
        }
        figures["goals_met"] = {k: bool(ratios[k] >= v) for k, v in GOALS.items()}
        pg_version = "embedded" if servers.postgres else "external"
        result = {
            "name": "judge",
            "machine": {**benchstamp.machine(PACKAGES), "postgresql": str(pg_version)},
            "params": params,
            "figures": figures,
            "ratios": ratios,
            "goals": GOALS,
        }
        print(f"\n{'contestant':<18}{'judgements':>11}{'seconds':>9}{'judg/s':>9}{'LLM calls':>11}")
        for name in ("naive_litellm", "flywheel", "flywheel_repeat"):
            f = figures[name]
            print(
                f"{name:<18}{f['judgements']:>11}{f['seconds']:>9.2f}{f['judgements_per_s']:>9.1f}{f['llm_calls']:>11}"
            )
        print(f"\ncalls saved by the cache on the repeated run: {figures['calls_saved_on_repeat']}")
        for k, v in ratios.items():
            goal = GOALS.get(k)
            mark = "" if goal is None else f"   (goal >= {goal}: {'met' if v >= goal else 'MISSED'})"
            print(f"{k:<44}{v:>8}{mark}")
        benchstamp.write_results("judge", result, out=args.out, packages=PACKAGES)
    finally:
        if judge is not None:
            judge.stop()
        if llm_proc is not None and llm_proc.poll() is None:
            llm_proc.terminate()
            llm_proc.wait(10)
        servers.stop()
        if args.keep:
            log(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
