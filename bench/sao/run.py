"""Does SAO help? SmolLM2-135M-Instruct before and after DPO on its own SAO pairs, on held-out prompts.

    python bench/sao/run.py           # full: 32 personas, 32 held-out prompts (15 min on 2 cores at load 5-7)
    python bench/sao/run.py --quick   # 8 personas, 8 held-out prompts, short answers (a smoke run, ~18 min at load 9)

1. One SAO round with the society's library (``flywheel.society.sao.run_round``): seeded
   personas, one prompt each, two responses at temperature 0.6, the model's own ranking, the
   reward judge service's Rank in both orders, the library's filters. The policy model is
   SmolLM2-135M-Instruct in this process (``policy.BatchedLlm``: the model server's weights,
   concurrent calls batched); the judge is the real ``reward_judge`` process.
2. DPO with LoRA on the kept pairs through the trainer's training library
   (``bench/learning``'s ``train_dpo``: ``flywheel.trainer.training.run.train``).
3. Greedy answers of the base and the trained policy to held-out prompts (``heldout.py``, a
   fixed hand-written list no round sees), each pair judged by the reward judge in both
   orders; a win or a loss only when both orders agree. Wilson 95% interval of the win rate
   and a sign test.

Writes ``bench/results/sao.json`` (``--quick``: ``bench/.cache/sao-quick.json``), prints a
table, then that JSON as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import json
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "bench" / "results" / "sao.json"
QUICK_RESULTS = ROOT / "bench" / ".cache" / "sao-quick.json"
sys.path.insert(0, str(HERE))

import heldout  # noqa: E402
import policy  # noqa: E402
import winrate  # noqa: E402
from policy import generate  # noqa: E402  (bench/learning/generate.py)

from flywheel.stack import benchstamp  # noqa: E402


def _learning_run() -> Any:
    """bench/learning/run.py under another name (both benches have a run.py): its
    ``train_dpo`` and ``machine`` are reused."""
    spec = importlib.util.spec_from_file_location("learning_run", ROOT / "bench" / "learning" / "run.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


FULL = {
    # SAO round (SaoConfig fields)
    "n_personas": 32,
    "temperature": 0.6,
    "min_response_length": 50,
    "similarity_threshold": 0.9,
    "max_persona_tokens": 16,
    "max_prompt_tokens": 24,
    "max_response_tokens": 40,
    "batch_size": 64,  # calls in flight: every response of the round in one batch
    "judge": "heuristic",  # the reward judge kind that ranks SAO pairs and judges the held-out answers
    "check_judge": "embedding",  # a second reward judge kind, never used for training
    # DPO
    "dpo_epochs": 2,
    "dpo_max_steps": 200,
    "dpo_batch_size": 4,
    "dpo_learning_rate": 2e-4,
    "dpo_beta": 0.1,
    "lora_r": 16,
    "lora_alpha": 32,
    "max_length": 128,
    # held-out evaluation
    "held_out": 32,
    "eval_max_tokens": 40,
}
QUICK = {
    **FULL,
    "n_personas": 8,
    "batch_size": 16,
    "max_persona_tokens": 16,
    "max_prompt_tokens": 24,
    "max_response_tokens": 32,
    "min_response_length": 20,
    "dpo_epochs": 2,
    "dpo_max_steps": 4,
    "dpo_batch_size": 2,
    "max_length": 128,
    "held_out": 8,
    "eval_max_tokens": 32,
}
JUDGE_KINDS = {"heuristic": "JUDGE_KIND_HEURISTIC", "embedding": "JUDGE_KIND_EMBEDDING", "llm": "JUDGE_KIND_LLM"}


class KindRanker:
    """The SAO library's Ranker over ``JudgeClient.rank`` with a chosen judge kind."""

    def __init__(self, client: Any, kind: str) -> None:
        from flywheel.api.reward.v1 import reward_judge_service_pb2 as pb

        self.client, self.kind = client, kind
        self._judge = getattr(pb, JUDGE_KINDS[kind])

    async def rank(self, prompt: str, responses: list[str], rubric: str = "") -> list[float]:
        return await self.client.rank(prompt, responses, rubric, judge=self._judge)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="8 personas, 8 held-out prompts, short answers")
    parser.add_argument("--seed", type=int, default=0, help="persona, sampling and training seed")
    parser.add_argument("--personas", type=int, help="override: personas in the SAO round")
    parser.add_argument("--held-out", type=int, help=f"override: held-out prompts (at most {len(heldout.PROMPTS)})")
    parser.add_argument("--out", type=Path)
    parser.add_argument("--keep", action="store_true", help="keep the stack's data, the adapter and the raw texts")
    args = parser.parse_args(argv)
    for var, value in (
        ("HF_HUB_OFFLINE", "1"),
        ("TRANSFORMERS_OFFLINE", "1"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    ):
        os.environ.setdefault(var, value)
    p: dict[str, Any] = {**(QUICK if args.quick else FULL), "quick": args.quick, "seed": args.seed}
    if args.personas:
        p["n_personas"] = args.personas
    if args.held_out:
        p["held_out"] = min(args.held_out, len(heldout.PROMPTS))
    out_path = args.out or (QUICK_RESULTS if args.quick else RESULTS)
    learning = _learning_run()

    started = time.monotonic()
    seconds: dict[str, float] = {}
    cpu_seconds: dict[str, float] = {}
    cpu_mark = [time.process_time()]

    def phase(name: str, since: float) -> float:
        now, cpu = time.monotonic(), time.process_time()
        seconds[name] = round(now - since, 1)
        cpu_seconds[name] = round(cpu - cpu_mark[0], 1)
        cpu_mark[0] = cpu
        print(f"  {name}: {seconds[name]} s wall, {cpu_seconds[name]} s CPU", flush=True)
        return now

    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-sao-"))
    stack = None
    raw: dict[str, Any] = {}
    try:
        t = time.monotonic()
        print("starting NATS, PostgreSQL, S3 and the reward judge ...", flush=True)
        stack = start_stack(root / "stack")
        t = phase("stack_start", t)
        gen = generate.load()
        t = phase("model_load", t)

        sao = asyncio.run(sao_round(stack, gen, p))
        t = phase("sao_round", t)
        held = held_out_prompts(sao["result"].prompts, p)
        base_answers = [
            a[0] for a in generate.generate(gen, held, max_new_tokens=p["eval_max_tokens"], batch_prompts=len(held))
        ]
        t = phase("base_eval", t)
        del gen
        gc.collect()

        records = sao["result"].records
        if not records:
            raise SystemExit("the SAO round kept no pair: nothing to train on (see the round stats above)")
        rows = [{"prompt": r.prompt, "chosen": r.chosen, "rejected": r.rejected} for r in records]
        p["dpo_steps"] = min(p["dpo_max_steps"], max(1, math.ceil(p["dpo_epochs"] * len(rows) / p["dpo_batch_size"])))
        train_result = learning.train_dpo(rows, root / "dpo", p)
        t = phase("dpo_train", t)

        tuned = generate.load(train_result.adapter_dir)
        trained_answers = [
            a[0] for a in generate.generate(tuned, held, max_new_tokens=p["eval_max_tokens"], batch_prompts=len(held))
        ]
        t = phase("trained_eval", t)
        del tuned
        gc.collect()

        verdicts = asyncio.run(judge_held_out(stack, held, base_answers, trained_answers, p))
        phase("judge_held_out", t)
        raw = {
            "records": [r.to_dict() for r in records],
            "held_out": held,
            "base": base_answers,
            "trained": trained_answers,
            "sao_prompts": sao["result"].prompts,
        }
        if args.keep:
            (ROOT / "bench" / ".cache").mkdir(parents=True, exist_ok=True)
            (ROOT / "bench" / ".cache" / "sao-raw.json").write_text(json.dumps(raw, ensure_ascii=False))
            kept = ROOT / "bench" / ".cache" / "sao-adapter"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(train_result.adapter_dir, kept)
    finally:
        if stack is not None:
            stack.down()
        if args.keep:
            print(f"stack data and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    seconds["total"] = round(time.monotonic() - started, 1)
    cpu_seconds["total"] = round(time.process_time(), 1)
    cpu_seconds["services_and_servers"] = round(sum(resource.getrusage(resource.RUSAGE_CHILDREN)[:2]), 1)

    result = build_result(p, learning.machine(), sao, raw, verdicts, train_result, seconds, cpu_seconds)
    print(report(result))
    benchstamp.write_results("sao", result, out=out_path, packages=learning.PACKAGES)
    if not args.quick or args.out:
        plot(result, out_path.with_suffix(".png"))
    return 0


def start_stack(root: Path) -> Any:
    """The reward judge as a real process (with NATS, PostgreSQL and S3 under it). No LLM
    judge is configured: SmolLM2 as the judge's LLM answers no Rank parseably (README)."""
    from flywheel.stack.stack import Stack

    stack = Stack.create(root, services=("reward_judge",))
    stack.up(timeout_s=180)
    return stack


def sao_config(p: dict[str, Any]) -> Any:
    from flywheel.society.sao import SaoConfig

    return SaoConfig(
        n_personas=p["n_personas"],
        temperature=p["temperature"],
        min_response_length=p["min_response_length"],
        similarity_threshold=p["similarity_threshold"],
        iterative_rounds=1,
        batch_size=p["batch_size"],
        seed=p["seed"],
        max_persona_tokens=p["max_persona_tokens"],
        max_prompt_tokens=p["max_prompt_tokens"],
        max_response_tokens=p["max_response_tokens"],
        llm_timeout_s=3600.0,  # batched on a loaded CPU: a call waits for its batch
    )


async def sao_round(stack: Any, gen: Any, p: dict[str, Any]) -> dict[str, Any]:
    """One SAO round, the policy batched in process, the reward judge process ranking."""
    from flywheel.core.judge_client import JudgeClient
    from flywheel.society.sao import run_round

    llm = policy.BatchedLlm(gen, seed=p["seed"], max_batch=max(p["batch_size"], 2 * p["n_personas"]))
    client = JudgeClient(stack.services["reward_judge"].address, timeout_s=120)
    try:
        result = await run_round(sao_config(p), llm=llm, judge=KindRanker(client, p["judge"]), iteration=1)
    finally:
        await client.close()
    s = result.stats
    print(
        f"  SAO round: {s.attempted} attempted, {s.kept} kept, dropped {s.dropped}, "
        f"order agreement {s.judge_order_agreement_rate:.3f}, self-judge agreement {s.self_judge_agreement_rate:.3f}, "
        f"prompt repetition {s.prompt_repetition_rate:.4f}",
        flush=True,
    )
    return {
        "result": result,
        "llm": {
            "calls": llm.calls,
            "batches": llm.batches,
            "generated_tokens": llm.generated_tokens,
            "self_ranking_letters": dict(llm.ranking_letters),
        },
    }


def held_out_prompts(round_prompts: list[str], p: dict[str, Any]) -> list[str]:
    """The first ``held_out`` shipped prompts that no round prompt comes near."""
    from flywheel.society.sao.filters import NearDuplicateIndex

    index = NearDuplicateIndex(p["similarity_threshold"])
    for prompt in round_prompts:
        index.add_if_new(prompt)
    kept = [q for q in heldout.PROMPTS if not index.is_duplicate(q)]
    p["held_out_dropped_as_near_round_prompts"] = len(heldout.PROMPTS) - len(kept)
    return kept[: p["held_out"]]


async def judge_held_out(
    stack: Any, prompts: list[str], base: list[str], trained: list[str], p: dict[str, Any]
) -> dict[str, list[dict[str, Any]]]:
    """Each held-out pair through the SAO library's ``judge_both_orders`` (Rank of (trained,
    base), then of (base, trained)), for the training judge and the check judge."""
    from flywheel.core.judge_client import JudgeClient
    from flywheel.society.sao.judge import judge_both_orders

    config = sao_config(p)
    client = JudgeClient(stack.services["reward_judge"].address, timeout_s=120)
    out: dict[str, list[dict[str, Any]]] = {}
    try:
        for kind in (p["judge"], p["check_judge"]):
            ranker = KindRanker(client, kind)
            verdicts = await asyncio.gather(
                *(judge_both_orders(ranker, q, t, b, config) for q, b, t in zip(prompts, base, trained, strict=True))
            )
            out[kind] = [
                {
                    "outcome": winrate.outcome(v, "A") if not v.failure else "failed",
                    "trained_scores": [v.forward[0], v.swapped[0]],
                    "base_scores": [v.forward[1], v.swapped[1]],
                    "failure": v.detail,
                }
                for v in verdicts
            ]
    finally:
        await client.close()
    return out


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _words(text: str) -> int:
    return len(text.split())


def build_result(
    p: dict[str, Any],
    machine: dict[str, Any],
    sao: dict[str, Any],
    raw: dict[str, Any],
    verdicts: dict[str, list[dict[str, Any]]],
    train_result: Any,
    seconds: dict[str, float],
    cpu_seconds: dict[str, float],
) -> dict[str, Any]:
    stats = sao["result"].stats
    records = raw["records"]
    judges = {}
    for kind, vs in verdicts.items():
        w = winrate.win_rate([v["outcome"] for v in vs if v["outcome"] != "failed"])
        judges[kind] = {
            **w.__dict__,
            "failed": sum(v["outcome"] == "failed" for v in vs),
            "mean_score_trained": _mean([sum(v["trained_scores"]) / 2 for v in vs]),
            "mean_score_base": _mean([sum(v["base_scores"]) / 2 for v in vs]),
        }
    primary = judges[p["judge"]]
    round_stats = stats.to_dict()
    figures = {
        "sao_round": round_stats,
        "sao_policy_calls": sao["llm"],
        "pairs": len(records),
        "pairs_chosen_longer": sum(len(r["chosen"]) > len(r["rejected"]) for r in records),
        "pairs_mean_judge_margin": _mean([r["chosen_score"] - r["rejected_score"] for r in records]),
        "held_out_n": len(raw["held_out"]),
        "held_out_source": "bench/sao/heldout.py (hand-written support prompts, no SAO round sees them)",
        "judges": judges,
        "answer_words": {
            "base": _mean([_words(a) for a in raw["base"]]),
            "trained": _mean([_words(a) for a in raw["trained"]]),
        },
        "identical_answers": sum(a == b for a, b in zip(raw["base"], raw["trained"], strict=True)),
        "dpo": {
            "steps": train_result.global_step,
            "epochs": round(train_result.global_step * p["dpo_batch_size"] / max(len(records), 1), 2),
            "final_loss": train_result.final_loss,
            "loss": train_result.loss,
            "reward_margin": train_result.reward,
            "runtime_s": train_result.runtime_s,
            "lora_target_modules": train_result.lora_target_modules,
        },
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "examples": [
            {"prompt": q, "base": b, "trained": t, "outcome": v["outcome"]}
            for q, b, t, v in list(
                zip(raw["held_out"], raw["base"], raw["trained"], verdicts[p["judge"]], strict=True)
            )[:8]
        ],
        "pair_examples": records[:3],
        "goal_met": bool(primary["ci_low"] > 0.5),
        "no_gpu": "no GPU is lent to this task: the larger GPU run of the issue is not done",
    }
    return {
        "name": "sao",
        "machine": machine,
        "params": p,
        "figures": figures,
        "ratios": {"trained_win_rate": primary["win_rate"], "trained_win_rate_ci_low": primary["ci_low"]},
        # The trained policy wins more held-out prompts than it loses, beyond noise.
        "goals": {"trained_win_rate": 0.5, "trained_win_rate_ci_low": 0.5},
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Wins, ties and losses of the trained policy per judge (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    judges = result["figures"]["judges"]
    names = list(judges)
    fig, ax = plt.subplots(figsize=(6.4, 2.5 + 0.5 * len(names)))
    for i, name in enumerate(names):
        j = judges[name]
        left = 0
        for count, colour, label in (
            (j["wins"], "#2a9d8f", "trained wins"),
            (j["ties"], "#cccccc", "tie / orders disagree"),
            (j["losses"], "#e76f51", "base wins"),
        ):
            ax.barh(i, count, left=left, color=colour, label=label if i == 0 else None)
            if count:
                ax.text(left + count / 2, i, str(count), ha="center", va="center", fontsize=9)
            left += count
        ax.text(
            left + 0.5,
            i,
            f"win rate {j['win_rate']:.2f} [{j['ci_low']:.2f}, {j['ci_high']:.2f}], p={j['sign_test_p']:.2g}",
            va="center",
            fontsize=8,
        )
    ax.set_yticks(range(len(names)), [f"{n} judge" for n in names])
    ax.set_xlim(0, result["figures"]["held_out_n"] * 1.9)
    ax.set_xlabel("held-out prompts")
    f = result["figures"]
    ax.set_title(
        f"SmolLM2-135M after DPO on {f['pairs']} SAO pairs vs its base"
        f" ({'quick' if result['params']['quick'] else 'full'})",
        fontsize=9,
    )
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.3), ncol=3, fontsize=7, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(r: dict[str, Any]) -> str:
    f, p = r["figures"], r["params"]
    s = f["sao_round"]
    lines = [
        "",
        f"sao: SmolLM2-135M-Instruct, DPO with LoRA on its own SAO pairs ({'quick' if p['quick'] else 'full'})",
        f"  SAO round: {s['attempted']} personas, {s['personas_from_model']} written by the model, "
        f"{s['prompts_generated']} prompts ({s['unique_prompts']} unique, repetition rate "
        f"{s['prompt_repetition_rate']:.4f}), {s['pairs_generated']} pairs generated, {s['judged']} judged, "
        f"kept {s['kept']}",
        f"  dropped: {s['dropped']}",
        f"  judge order agreement {s['judge_order_agreement_rate']:.3f}, self/judge agreement "
        f"{s['self_judge_agreement_rate']:.3f}, self-ranking letters {f['sao_policy_calls']['self_ranking_letters']}",
        f"  DPO: {f['dpo']['steps']} steps x {p['dpo_batch_size']} pairs ({f['dpo']['epochs']} epochs), "
        f"lr {p['dpo_learning_rate']}, beta {p['dpo_beta']}, final loss {f['dpo']['final_loss']:.4f}",
        "",
        f"  held out: {f['held_out_n']} prompts; answer words base {f['answer_words']['base']:.1f}, trained "
        f"{f['answer_words']['trained']:.1f}; identical answers {f['identical_answers']}",
        "  judge        wins  ties (disagree)  losses  win rate  95% CI (Wilson)   sign p   mean score trained/base",
    ]
    for kind, j in f["judges"].items():
        lines.append(
            f"  {kind:11s}  {j['wins']:4d}  {j['ties']:4d} ({j['order_disagreements']:3d})      {j['losses']:4d}    "
            f"{j['win_rate']:.3f}    [{j['ci_low']:.3f}, {j['ci_high']:.3f}]    {j['sign_test_p']:.3g}    "
            f"{j['mean_score_trained']:.3f}/{j['mean_score_base']:.3f}"
        )
    lines += [
        "",
        f"  trained_win_rate = {r['ratios']['trained_win_rate']:.3f} (goal > 0.5), CI low "
        f"{r['ratios']['trained_win_rate_ci_low']:.3f} (goal > 0.5): {'met' if f['goal_met'] else 'NOT met'}",
        "  wall seconds: " + ", ".join(f"{k} {v}" for k, v in f["seconds"].items()),
        "  CPU seconds: " + ", ".join(f"{k} {v}" for k, v in f["cpu_seconds"].items()),
        "",
        "  examples (held out):",
    ]
    lines += [
        f"    [{e['outcome']}] {e['prompt'][:60]!r}\n      base    {e['base'][:110]!r}"
        f"\n      trained {e['trained'][:110]!r}"
        for e in f["examples"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
