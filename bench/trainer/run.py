"""Training throughput: Flywheel's training library against a plain TRL script, DPO, GRPO and
reward-model steps at fixed lengths on a randomly initialised Qwen2-0.5B-sized model.

    python bench/trainer/run.py            # the full run, on a GPU (--device cuda, bf16)
    python bench/trainer/run.py --quick    # a 2-layer model on the CPU (about 2 minutes on 2 cores)

One random model folder (model.py) and the same synthetic fixed-length rows (data.py) for both
sides. Each side of each kind trains in its own process, forked from a server that imported
torch/transformers/TRL/PEFT once (no import time in a run, no memory or state shared between
runs); the side that goes first alternates. Steps 1..warmup are warm-up; tokens/s, samples/s
and MFU come from the next ``measured`` steps (from the log of step warmup to that of the
last step). MFU = 6 N tokens/s / peak, N the model's matrix-multiply weights (model.py), peak
989 TFLOP/s (H100/H200 dense bf16); n/a on the CPU. Peak memory covers the whole process:
torch's peak allocation on a GPU, peak RSS on the CPU.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import child

from flywheel.stack import benchstamp

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
RESULTS = ROOT / "bench" / "results" / "trainer.json"

KINDS = ("dpo", "grpo", "reward_model")
SIDES = ("flywheel", "trl")
COMMON = {
    "learning_rate": 1e-4,
    "lora_r": 16,
    "lora_alpha": 32,
    "lora_dropout": 0.05,
    "lora_targets": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "dpo_beta": 0.1,
    "grpo_beta": 0.04,  # KL to the base model: RLHF-style GRPO, Flywheel's default
    "temperature": 1.0,
    "seed": 0,
    "num_generations": 8,
}
FULL = {
    "model": "qwen2-0.5b",
    "warmup_steps": 3,
    "measured_steps": 10,
    "repeats": 2,
    "kinds": {
        "dpo": {"prompt_length": 512, "completion_length": 512, "batch_size": 8},
        "grpo": {"prompt_length": 256, "completion_length": 256, "batch_size": 4},
        "reward_model": {"prompt_length": 512, "completion_length": 512, "batch_size": 8},
    },
}
QUICK = {
    "model": "quick",
    "warmup_steps": 2,
    "measured_steps": 5,
    "repeats": 1,
    "num_generations": 4,
    "kinds": {
        "dpo": {"prompt_length": 16, "completion_length": 16, "batch_size": 2},
        "grpo": {"prompt_length": 16, "completion_length": 8, "batch_size": 2},
        "reward_model": {"prompt_length": 16, "completion_length": 16, "batch_size": 2},
    },
}
GOALS = {"dpo_tokens_per_s_flywheel_vs_trl": 1.3, "dpo_mfu": 0.35}
GOAL_DEVICE = "H100"
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "liger-kernel", "flash-attn", "kernels")


T0 = time.monotonic()


def log(*args: object) -> None:
    print(f"[{time.monotonic() - T0:6.1f} s]", *args, file=sys.stderr, flush=True)


def in_child(ctx: Any, name: str, *args: Any) -> Any:
    """``worker.<name>(*args)`` in a fresh process forked from the fork server: its result, or
    its error raised here."""
    with concurrent.futures.ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        return pool.submit(child.call, name, *args).result()


def run_params(quick: bool, kind: str, device: str, args: argparse.Namespace) -> dict[str, Any]:
    base = QUICK if quick else FULL
    p = {**COMMON, **{k: v for k, v in base.items() if k != "kinds"}, **base["kinds"][kind]}
    p.update(device=device, peak_tflops=args.peak_tflops, verbose=args.verbose)
    if args.steps:
        p["measured_steps"] = args.steps
    return p


def machine(results: list[dict[str, Any]], device: str) -> dict[str, Any]:
    """The machine (``benchstamp.machine``) plus the device the runs used and torch's threads."""
    return {
        **benchstamp.machine(PACKAGES),
        "device": device,
        "device_name": next((r["device_name"] for r in results if "device_name" in r), None),
        "torch_threads": next((r["threads"] for r in results if "threads" in r), None),
    }


def summarise(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per kind and side: means over repeats (peak memory: the largest)."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        for side in SIDES:
            mine = [r for r in runs if r["kind"] == kind and r["side"] == side and "error" not in r]
            if not mine:
                continue
            entry: dict[str, Any] = {"repeats": len(mine)}
            for key in ("tokens_per_s", "samples_per_s", "seconds_per_step", "model_tflops_per_s", "mfu"):
                values = [r[key] for r in mine if r.get(key) is not None]
                entry[key] = round(statistics.fmean(values), 4) if values else None
            entry["peak_memory_mib"] = max(r["peak_memory_mib"] for r in mine)
            out.setdefault(kind, {})[side] = entry
    return out


def goals_status(ratios: dict[str, Any], device_name: str | None, device: str, quick: bool) -> dict[str, Any]:
    if not device.startswith("cuda"):
        return dict.fromkeys(GOALS, "not run: no GPU")
    if quick:
        return dict.fromkeys(GOALS, "not evaluated: --quick (the goals are for the full config)")
    if GOAL_DEVICE not in (device_name or ""):
        return dict.fromkeys(GOALS, f"not evaluated: the goals are for an {GOAL_DEVICE}, this is {device_name}")
    return {k: (ratios.get(k) is not None and ratios[k] >= goal) for k, goal in GOALS.items()}


def render(result: dict[str, Any]) -> str:
    m, p, f = result["machine"], result["params"], result["figures"]
    info = f["model"]
    shape = info["shape"]
    lines = [
        f"trainer: random Qwen2 '{info['size']}' ({shape['num_hidden_layers']} layers, hidden {shape['hidden_size']}, "
        f"vocab {shape['vocab_size']:,}; {info['parameters'] / 1e6:.1f}M parameters, N = "
        f"{info['matmul_parameters'] / 1e6:.1f}M in matmuls), LoRA r={p['lora_r']} on {len(p['lora_targets'])} "
        f"projections, {m['device_name'] or m['device']} ({p['dtype']}, {m['torch_threads']} threads)",
        f"steps: {p['warmup_steps']} warm-up + {p['measured_steps']} measured, {p['repeats']} repeat(s), "
        "each side in its own process, alternating order",
        "",
        f"{'kind':<13}{'side':<10}{'lengths':>10}{'batch':>7}{'tokens/s':>11}{'samples/s':>11}{'s/step':>9}"
        f"{'peak MiB':>10}{'TFLOP/s':>9}{'MFU':>7}",
    ]
    for kind, sides in f["summary"].items():
        k = p["kinds"][kind]
        lengths = f"{k['prompt_length']}+{k['completion_length']}"
        batch = f"{k['batch_size']}x{p['num_generations']}" if kind == "grpo" else str(k["batch_size"])
        for side, e in sides.items():
            mfu = f"{e['mfu']:.1%}" if e["mfu"] is not None else "n/a"
            lines.append(
                f"{kind:<13}{side:<10}{lengths:>10}{batch:>7}{e['tokens_per_s']:>11,.0f}{e['samples_per_s']:>11,.2f}"
                f"{e['seconds_per_step']:>9.3f}{e['peak_memory_mib']:>10,.0f}{e['model_tflops_per_s']:>9.3f}{mfu:>7}"
            )
    lines += ["", f"{'ratio':<42}{'value':>8}{'goal':>7}  met"]
    for name, value in result["ratios"].items():
        goal = GOALS.get(name)
        status = f["goals_met"].get(name, "")
        shown = "n/a" if value is None else f"{value:.3f}"
        met = status if isinstance(status, str) else ("yes" if status else "NO")
        lines.append(f"{name:<42}{shown:>8}{goal if goal is not None else '':>7}  {met}")
    errors = [r for r in f["runs"] if "error" in r]
    for r in errors:
        lines.append(f"ERROR {r['kind']} {r['side']}: {r['error']}")
    lines.append(f"({f['seconds']} s)")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2-layer model, short sequences, 3 measured steps")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto (cuda when present)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated subset of {','.join(KINDS)}")
    parser.add_argument("--repeats", type=int, help="runs per side and kind (default: 2 full, 1 quick)")
    parser.add_argument("--steps", type=int, help="measured steps (default: 10 full, 3 quick)")
    parser.add_argument("--peak-tflops", type=float, help="the device's peak for MFU (default: 989 on H100/H200)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--verbose", action="store_true", help="keep transformers' and TRL's warnings")
    args = parser.parse_args(argv)
    command = [sys.argv[0], *(argv if argv is not None else sys.argv[1:])]
    kinds = [k.strip() for k in args.kinds.split(",") if k.strip()]
    if unknown := set(kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(unknown)}; choose from {', '.join(KINDS)}")
    base = QUICK if args.quick else FULL
    repeats = args.repeats or base["repeats"]
    for var, value in (("HF_HUB_OFFLINE", "1"), ("TRANSFORMERS_OFFLINE", "1"), ("TOKENIZERS_PARALLELISM", "false")):
        os.environ.setdefault(var, value)
    # The fork server starts with `python -c` and (Python 3.11) ignores the parent's sys.path:
    # without this it cannot import ``worker`` to preload it, silently, and every run pays the imports.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")]))

    started = datetime.datetime.now(datetime.UTC)
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["worker"])

    folder = Path(tempfile.mkdtemp(prefix="flywheel-bench-trainer-"))
    runs: list[dict[str, Any]] = []
    try:
        device = in_child(ctx, "resolve_device", args.device)
        dtype = "bfloat16" if device.startswith("cuda") else "float32"
        log(f"building the {base['model']} model folder ({dtype}) under {folder}")
        info = in_child(ctx, "build_model", base["model"], str(folder / "model"), dtype)
        for rep in range(repeats):
            for i, kind in enumerate(kinds):
                p = run_params(args.quick, kind, device, args)
                n = info["matmul_parameters_reward_model" if kind == "reward_model" else "matmul_parameters"]
                order = SIDES if (rep + i) % 2 == 0 else SIDES[::-1]
                for side in order:
                    log(f"repeat {rep + 1}/{repeats}: {kind} on {side} ...")
                    try:
                        r = in_child(ctx, "run_side", side, kind, p, str(folder / "model"), n)
                    except Exception as exc:  # noqa: BLE001 - one failed run is reported, the others still run
                        r = {"side": side, "kind": kind, "error": f"{type(exc).__name__}: {exc}"}
                    r["repeat"] = rep + 1
                    runs.append(r)
                    if "error" in r:
                        log(f"  {r['error']}")
                    else:
                        log(f"  {r['tokens_per_s']:,.0f} tokens/s, {r['seconds_per_step']} s/step ({r['process_s']} s)")
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    summary = summarise(runs)
    ratios: dict[str, Any] = {}
    for kind in kinds:
        s = summary.get(kind, {})
        fly, peer = s.get("flywheel"), s.get("trl")
        ratios[f"{kind}_tokens_per_s_flywheel_vs_trl"] = (
            round(fly["tokens_per_s"] / peer["tokens_per_s"], 3) if fly and peer else None
        )
    ratios["dpo_mfu"] = summary.get("dpo", {}).get("flywheel", {}).get("mfu")
    mach = machine(runs, device)
    figures = {
        "summary": summary,
        "runs": runs,
        "model": info,
        "goals_met": goals_status(ratios, mach["device_name"], device, args.quick),
        "seconds": round((datetime.datetime.now(datetime.UTC) - started).total_seconds(), 1),
    }
    params = {
        "quick": args.quick,
        **{k: v for k, v in base.items() if k != "kinds"},
        **COMMON,
        **({"num_generations": base["num_generations"]} if "num_generations" in base else {}),
        "repeats": repeats,
        "measured_steps": args.steps or base["measured_steps"],
        "kinds": {k: base["kinds"][k] for k in kinds},
        "dtype": dtype,
        "tokens": "real tokens per step: DPO and reward model 2 x batch x (prompt + completion + EOS), "
        "GRPO batch x num_generations x (prompt + completion)",
        "samples": "pairs per step (DPO, reward model), completions per step (GRPO)",
        "mfu": "6 x N x tokens/s / peak; N = matrix-multiply weights (LM head included, input embedding "
        "lookup not; the reward model's score head instead of the LM head); peak 989e12 on H100/H200",
        "peak_memory": "whole process: torch.cuda.max_memory_allocated on a GPU, peak RSS on the CPU",
        "flywheel": "flywheel.trainer.training.train(spec, rows, out_dir, on_progress=...), "
        "the model folder as base_model",
        "peer": "plain TRL script (bench/trainer/plain_trl.py): DPOTrainer / GRPOTrainer / RewardTrainer "
        "with a peft LoraConfig",
    }
    result = {
        "name": "trainer",
        "machine": mach,
        "params": params,
        "figures": figures,
        "ratios": ratios,
        "goals": GOALS,
    }
    print(render(result))
    benchstamp.write_results("trainer", result, out=args.out, packages=PACKAGES, argv=command)
    return 1 if any("error" in r for r in runs) else 0


if __name__ == "__main__":
    sys.exit(main())
