"""Does the loop learn? SmolLM2-135M-Instruct before and after DPO on its own judged traces.

    python bench/learning/run.py           # full: 195 countries, half held out, 4 + 4 samples, 40 DPO steps
    python bench/learning/run.py --quick   # 40 countries, 2 + 2 samples, 12 DPO steps of 4 pairs (~2 min)

1. Split the countries into training and held-out prompts (seeded) before anything else.
2. Greedy answers of the base model on the held-out prompts (the peer), and, as a reference
   point, of the base model given ``shots`` worked examples (training countries) first.
3. Answers per training prompt from the base model at ``temperature``: ``samples_plain`` to
   the plain question and ``samples_few_shot`` after the worked examples (two prompt variants
   of the product; the trace records the user's question either way). Each is scored by the
   reward judge service (reference judge) and published through the SDK as a trace with that
   reward; the trace store exports the preference pairs (best vs worst answer of each prompt,
   then second best vs second worst, ...).
4. DPO with LoRA on those pairs through the trainer's training library
   (``flywheel.trainer.training.run.train``, base ``smollm2``).
5. Greedy answers of the adapter to the plain held-out questions; exact match (the city alone)
   of both, the paired difference with a bootstrap 95% interval and McNemar's exact test.

Writes ``bench/results/learning.json``, prints a table, then that JSON as the last line.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "bench" / "results" / "learning.json"
sys.path.insert(0, str(HERE))

import generate  # noqa: E402
import loop  # noqa: E402
import stats  # noqa: E402
import task  # noqa: E402

from flywheel.stack import benchstamp  # noqa: E402

PACKAGES = ("torch", "transformers", "trl", "peft")
FULL = {
    "countries": None,  # all
    "held_out_fraction": 0.5,
    "samples_plain": 4,  # per training prompt, from the plain question
    "samples_few_shot": 4,  # per training prompt, from the question after `shots` worked examples
    "shots": 3,
    "temperature": 1.0,
    "max_new_tokens": 16,
    "min_margin": 0.1,
    "dpo_steps": 40,
    "dpo_batch_size": 8,
    "dpo_learning_rate": 1e-4,
    "dpo_beta": 0.1,
    "lora_r": 16,
    "lora_alpha": 32,
    "max_length": 96,
}
QUICK = {**FULL, "countries": 40, "samples_plain": 2, "samples_few_shot": 2, "dpo_steps": 12, "dpo_batch_size": 4}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="40 countries, 2 + 2 samples, 12 DPO steps of 4 pairs")
    parser.add_argument("--seed", type=int, default=0, help="split, sampling and training seed")
    parser.add_argument("--countries", type=int, help="override: N countries drawn at random (seeded)")
    parser.add_argument("--samples-plain", type=int, help="override: answers per training prompt, plain question")
    parser.add_argument("--samples-few-shot", type=int, help="override: answers per training prompt, few-shot arm")
    parser.add_argument("--dpo-steps", type=int, help="override: DPO steps")
    parser.add_argument("--dpo-batch-size", type=int, help="override: pairs per DPO step")
    parser.add_argument("--max-new-tokens", type=int, help="override: tokens per answer (sampling and evaluation)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--keep", action="store_true", help="keep the stack's data and the adapter")
    args = parser.parse_args(argv)
    for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(var, value)
    p: dict[str, Any] = {**(QUICK if args.quick else FULL), "quick": args.quick, "seed": args.seed}
    for name in ("countries", "samples_plain", "samples_few_shot", "dpo_steps", "dpo_batch_size", "max_new_tokens"):
        if getattr(args, name):
            p[name] = getattr(args, name)

    started = time.monotonic()
    seconds: dict[str, float] = {}
    # CPU seconds of this process per phase: on a shared machine wall time is inflated by the
    # other load, CPU time much less so (the services' own CPU is in the children's total).
    cpu_seconds: dict[str, float] = {}
    cpu_mark = [time.process_time()]

    def phase(name: str, since: float) -> float:
        now, cpu = time.monotonic(), time.process_time()
        seconds[name] = round(now - since, 1)
        cpu_seconds[name] = round(cpu - cpu_mark[0], 1)
        cpu_mark[0] = cpu
        print(f"  {name}: {seconds[name]} s wall, {cpu_seconds[name]} s CPU", flush=True)
        return now

    all_cases = task.cases()
    if p["countries"]:
        all_cases = random.Random(args.seed).sample(sorted(all_cases, key=lambda c: c.country), p["countries"])
    train_cases, held_out = task.split(all_cases, held_out_fraction=p["held_out_fraction"], seed=args.seed)
    print(f"{len(train_cases)} training prompts, {len(held_out)} held out (split before sampling, seed {args.seed})")

    root = Path(tempfile.mkdtemp(prefix="flywheel-bench-learning-"))
    stack = None
    try:
        t = time.monotonic()
        print("starting NATS, PostgreSQL, S3, the trace store and the reward judge ...", flush=True)
        stack = loop.start_stack(root / "stack")
        t = phase("stack_start", t)

        gen = generate.load()
        t = phase("model_load", t)
        shots = train_cases[: p["shots"]]  # worked examples for the few-shot arm: training countries only
        base_answers = [
            a[0] for a in generate.generate(gen, [c.prompt for c in held_out], max_new_tokens=p["max_new_tokens"])
        ]
        few_shot_answers = [
            a[0]
            for a in generate.generate(
                gen, [task.few_shot(c, shots) for c in held_out], max_new_tokens=p["max_new_tokens"]
            )
        ]
        t = phase("base_eval", t)

        samples = []
        for arm, prompts, k in (
            ("plain", [c.prompt for c in train_cases], p["samples_plain"]),
            ("few_shot", [task.few_shot(c, shots) for c in train_cases], p["samples_few_shot"]),
        ):
            sampled = generate.generate(
                gen,
                prompts,
                samples=k,
                temperature=p["temperature"],
                max_new_tokens=p["max_new_tokens"],
                seed=args.seed,
            )
            # The trace records the user's question whichever variant answered it: the pairs
            # then teach the plain question the behaviour of the better variant.
            samples += [
                loop.Sample(c.prompt, c.reference, text, arm=arm)
                for c, texts in zip(train_cases, sampled, strict=True)
                for text in texts
            ]
        t = phase("sampling", t)
        del gen
        gc.collect()

        asyncio.run(loop.judge(stack, samples))
        loop.publish(stack, samples)
        rows, export = asyncio.run(loop.export_preferences(stack, len(samples), min_margin=p["min_margin"]))
        t = phase("judge_trace_export", t)

        train_result = train_dpo(rows, root / "dpo", p)
        t = phase("dpo_train", t)

        if args.keep:  # the raw material, before anything that could still fail
            raw = {
                "base": base_answers,
                "few_shot": few_shot_answers,
                "samples": [vars(s) for s in samples],
                "rows": rows,
                "export": export,
            }
            (ROOT / "bench" / ".cache").mkdir(parents=True, exist_ok=True)
            (ROOT / "bench" / ".cache" / "learning-raw.json").write_text(json.dumps(raw))
        tuned = generate.load(train_result.adapter_dir)
        adapter_answers = [
            a[0] for a in generate.generate(tuned, [c.prompt for c in held_out], max_new_tokens=p["max_new_tokens"])
        ]
        phase("adapter_eval", t)
        del tuned
        gc.collect()
        if args.keep:
            kept = ROOT / "bench" / ".cache" / "learning-adapter"
            shutil.rmtree(kept, ignore_errors=True)
            shutil.copytree(train_result.adapter_dir, kept)
            print(f"adapter kept in {kept}")
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

    result = build_result(
        p,
        held_out,
        {"base": base_answers, "base_few_shot": few_shot_answers, "adapter": adapter_answers},
        samples,
        rows,
        export,
        train_result,
        seconds,
        cpu_seconds,
    )
    print(report(result))
    benchstamp.write_results("learning", result, out=args.out, packages=PACKAGES)
    return 0


def train_dpo(rows: list[dict[str, Any]], out: Path, p: dict[str, Any]) -> Any:
    """DPO with LoRA on the exported pairs, in the chat format the model answers in (the
    trace holds the user's question; TRL applies the chat template to message lists)."""
    from flywheel.trainer.training.run import train
    from flywheel.trainer.training.spec import LoraSettings, TrainSpec

    pairs = [
        {
            "prompt": [{"role": "user", "content": r["prompt"]}],
            "chosen": [{"role": "assistant", "content": r["chosen"]}],
            "rejected": [{"role": "assistant", "content": r["rejected"]}],
        }
        for r in rows
    ]
    spec = TrainSpec(
        kind="dpo",
        base_model="smollm2",
        max_steps=p["dpo_steps"],
        learning_rate=p["dpo_learning_rate"],
        batch_size=p["dpo_batch_size"],
        max_length=p["max_length"],
        save_steps=10_000,  # no intermediate checkpoints: the adapter is saved at the end
        seed=p["seed"],
        beta=p["dpo_beta"],
        lora=LoraSettings(r=p["lora_r"], alpha=p["lora_alpha"]),
        device="cpu",
    )
    return train(spec, pairs, out)


def build_result(
    p: dict[str, Any],
    held_out: list[task.Case],
    answers: dict[str, list[str]],
    samples: list[loop.Sample],
    rows: list[dict[str, Any]],
    export: dict[str, Any],
    train_result: Any,
    seconds: dict[str, float],
    cpu_seconds: dict[str, float],
) -> dict[str, Any]:
    base_answers, adapter_answers = answers["base"], answers["adapter"]
    few_shot_exact = [task.exact(a, c) for a, c in zip(answers["base_few_shot"], held_out, strict=True)]
    base_ok = [task.exact(a, c) for a, c in zip(base_answers, held_out, strict=True)]
    adapter_ok = [task.exact(a, c) for a, c in zip(adapter_answers, held_out, strict=True)]
    cmp = stats.paired(base_ok, adapter_ok, seed=p["seed"])
    lenient = stats.paired(
        [task.mentions(a, c) for a, c in zip(base_answers, held_out, strict=True)],
        [task.mentions(a, c) for a, c in zip(adapter_answers, held_out, strict=True)],
        seed=p["seed"],
    )
    by_prompt: dict[str, list[float]] = {}
    for s in samples:
        by_prompt.setdefault(s.prompt, []).append(s.score)
    ratio = cmp.adapter_accuracy / cmp.base_accuracy if cmp.base_accuracy else None
    figures = {
        "held_out_n": cmp.n,
        "train_prompts": len(by_prompt),
        "base_exact_match": cmp.base_accuracy,
        "adapter_exact_match": cmp.adapter_accuracy,
        "delta": cmp.delta,
        "delta_ci95": [cmp.ci_low, cmp.ci_high],
        "mcnemar_p": cmp.p_value,
        "discordant": {"adapter_only": cmp.only_adapter, "base_only": cmp.only_base},
        "lenient": {  # the accepted city anywhere in the answer: knowledge rather than format
            "base": lenient.base_accuracy,
            "adapter": lenient.adapter_accuracy,
            "delta": lenient.delta,
            "delta_ci95": [lenient.ci_low, lenient.ci_high],
            "mcnemar_p": lenient.p_value,
        },
        # A reference point, not the peer: the base model given worked examples in the prompt.
        "base_few_shot_exact_match": sum(few_shot_exact) / len(few_shot_exact),
        "adapter_vs_base_few_shot": stats.paired(few_shot_exact, adapter_ok, seed=p["seed"]).__dict__,
        "samples": len(samples),
        "samples_by_arm": {
            arm: {
                "n": sum(s.arm == arm for s in samples),
                "mean_judge_score": sum(s.score for s in samples if s.arm == arm)
                / max(1, sum(s.arm == arm for s in samples)),
                "exact": sum(s.score == 1.0 for s in samples if s.arm == arm),
            }
            for arm in ("plain", "few_shot")
        },
        "sample_mean_judge_score": sum(s.score for s in samples) / len(samples),
        "sample_exact_match": sum(s.score == 1.0 for s in samples) / len(samples),
        "prompts_with_an_exact_sample": sum(any(x == 1.0 for x in v) for v in by_prompt.values()),
        "pairs": len(rows),
        "export": export,
        "dpo": {
            "steps": train_result.global_step,
            "epochs": round(train_result.global_step * p["dpo_batch_size"] / max(len(rows), 1), 2),
            "final_loss": train_result.final_loss,
            "loss": train_result.loss,
            "reward_margin": train_result.reward,
            "runtime_s": train_result.runtime_s,
            "lora_target_modules": train_result.lora_target_modules,
        },
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "within_20_minutes": seconds["total"] <= 1200,
        "examples": [
            {"country": c.country, "expected": c.reference, "base": b, "base_few_shot": f, "adapter": a}
            for c, b, f, a in list(zip(held_out, base_answers, answers["base_few_shot"], adapter_answers, strict=True))[
                :12
            ]
        ],
        "goal_met": bool(cmp.ci_low > 0),
    }
    return {
        "name": "learning",
        "machine": machine(),
        "params": p,
        "figures": figures,
        "ratios": {"adapter_vs_base_exact_match": ratio, "adapter_minus_base_ci_low": cmp.ci_low},
        # A significant gain: the adapter beats the base and the difference's 95% interval excludes 0.
        "goals": {"adapter_vs_base_exact_match": 1.0, "adapter_minus_base_ci_low": 0.0},
    }


def machine() -> dict[str, Any]:
    """The machine (``benchstamp.machine``) plus torch's threads and the load at the end; the
    commit, date and command are in the stamp ``benchstamp.write_results`` adds."""
    import torch

    return {
        **benchstamp.machine(PACKAGES),
        "torch_threads": torch.get_num_threads(),
        "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
    }


def report(r: dict[str, Any]) -> str:
    f, p = r["figures"], r["params"]
    lo, hi = f["delta_ci95"]
    llo, lhi = f["lenient"]["delta_ci95"]
    ratio = r["ratios"]["adapter_vs_base_exact_match"]
    lines = [
        "",
        "learning: SmolLM2-135M-Instruct, DPO with LoRA on its own judged traces"
        f" ({'quick' if p['quick'] else 'full'})",
        f"  training prompts {f['train_prompts']}, {p['samples_plain']} plain + {p['samples_few_shot']} few-shot "
        f"samples each at T={p['temperature']}: "
        f"mean judge score {f['sample_mean_judge_score']:.3f}, exact {f['sample_exact_match']:.3f}, "
        f"{f['prompts_with_an_exact_sample']} prompts with an exact sample",
        f"  preference pairs exported: {f['pairs']} (min margin {p['min_margin']}); DPO {f['dpo']['steps']} steps x "
        f"{p['dpo_batch_size']} pairs ({f['dpo']['epochs']} epochs), lr {p['dpo_learning_rate']}, "
        f"beta {p['dpo_beta']}, "
        f"final loss {f['dpo']['final_loss']:.4f}",
        "",
        "  metric (held out)          n    base   adapter   delta    95% CI              McNemar p",
        f"  exact match (city alone)  {f['held_out_n']:3d}   {f['base_exact_match']:.3f}   "
        f"{f['adapter_exact_match']:.3f}"
        f"    {f['delta']:+.3f}   [{lo:+.3f}, {hi:+.3f}]    {f['mcnemar_p']:.3g}",
        f"  lenient (city mentioned)  {f['held_out_n']:3d}   {f['lenient']['base']:.3f}   "
        f"{f['lenient']['adapter']:.3f}    {f['lenient']['delta']:+.3f}   [{llo:+.3f}, {lhi:+.3f}]    "
        f"{f['lenient']['mcnemar_p']:.3g}",
        f"  (reference point: the base model with {p['shots']} worked examples in the prompt scores "
        f"{f['base_few_shot_exact_match']:.3f} exact on the same held-out prompts)",
        "",
        f"  adapter_vs_base_exact_match = {ratio if ratio is None else round(ratio, 3)} (goal > 1), "
        f"delta CI low = {lo:+.3f} (goal > 0): {'met' if f['goal_met'] else 'NOT met'}",
        "  wall seconds: " + ", ".join(f"{k} {v}" for k, v in f["seconds"].items()),
        "  CPU seconds: " + ", ".join(f"{k} {v}" for k, v in f["cpu_seconds"].items()),
        "",
        "  examples (held out):",
    ]
    lines += [
        f"    {e['country']} ({e['expected']}): base {e['base']!r} | few-shot {e['base_few_shot']!r} | "
        f"adapter {e['adapter']!r}"
        for e in f["examples"]
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
