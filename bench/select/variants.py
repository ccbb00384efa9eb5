"""Measure proposed optimizer changes: the real optimizer process, unchanged and with each
stage of bench/select/proposed/*.diff applied (cumulatively, in file-name order), side by side
on the same stack, with the bare grpcio echo servers as references.

    python bench/select/variants.py [--reps 3] [--seconds 6]
    python bench/select/variants.py --variant w4:GRPC_WORKERS=4 --variant gil1ms:GIL_SWITCH_INTERVAL_S=0.001

``--variant NAME:KEY=VALUE[,KEY=VALUE]`` (repeatable) adds the unchanged optimizer run with those
``FLYWHEEL_OPTIMIZER_*`` settings, as ``lag.py --variant`` does in bench/service-regret.

Each stage is a copy of the optimizer's and flywheel.core's sources with the diffs up to it
applied (``patch -p1``), put first on the optimizer process's PYTHONPATH (``flywheel`` is a
namespace package, so the copy shadows the installed sources; nothing in the repository is
touched). Targets run round-robin, ``--reps`` times; the table gives the median Select/s, the
server's CPU microseconds per Select (robust to other tenants taking CPU: it is what one
Select costs, whatever share of the core the server got) and each figure relative to the
unchanged optimizer and to the echo servers.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import run as R  # noqa: E402

PROPOSED = HERE / "proposed"
# The trees the diffs patch, as they sit in the repository (paths in the diffs are relative to ROOT).
TREES = ("services/optimizer/src/flywheel/optimizer", "libs/core/src/flywheel/core")


def stage_env(diffs: list[Path]) -> dict[str, str]:
    """Settings a stage needs to be switched on: ``KEY=VALUE`` lines of a ``<diff>.env`` beside a
    diff (cumulative: a stage gets the variables of every diff up to it)."""
    env: dict[str, str] = {}
    for diff in diffs:
        path = diff.with_suffix(".env")
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip() and not line.startswith("#"):
                    key, value = line.split("=", 1)
                    env[key.strip()] = value.strip()
    return env


def build_stages(work: Path, diffs: list[Path]) -> list[tuple[str, Path, dict[str, str]]]:
    """One overlay per diff prefix: ``work/<stage>/src/flywheel/{optimizer,core}``."""
    stages = []
    for i, diff in enumerate(diffs):
        tree = work / f"stage{i + 1}"
        for rel in TREES:
            shutil.copytree(ROOT / rel, tree / rel, ignore=shutil.ignore_patterns("__pycache__"))
        for applied in diffs[: i + 1]:
            subprocess.run(["patch", "-s", "-p1", "-d", str(tree), "-i", str(applied)], check=True)
        overlay = tree / "overlay" / "flywheel"
        overlay.mkdir(parents=True)
        for rel in TREES:
            (overlay / Path(rel).name).symlink_to(tree / rel)
        stages.append((diff.stem, tree / "overlay", stage_env(diffs[: i + 1])))
    return stages


def setting_variant(text: str) -> tuple[str, dict[str, str]]:
    """``NAME:KEY=VALUE[,KEY=VALUE]`` -> (NAME, {"FLYWHEEL_OPTIMIZER_KEY": VALUE, ...})."""
    name, _, pairs = text.partition(":")
    settings: dict[str, str] = {}
    for pair in filter(None, pairs.split(",")):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise argparse.ArgumentTypeError(f"--variant {text!r}: want NAME:KEY=VALUE[,KEY=VALUE]")
        settings[f"FLYWHEEL_OPTIMIZER_{key.strip().upper()}"] = value.strip()
    if not name:
        raise argparse.ArgumentTypeError(f"--variant {text!r}: the name before ':' is empty")
    return name, settings


class Variant(R.FlywheelTarget):
    """The optimizer with an overlay first on its PYTHONPATH (None: as installed)."""

    created = False

    def __init__(
        self, work: Path, env: dict[str, str], name: str, overlay: Path | None, extra: dict[str, str] | None = None
    ) -> None:
        path = {"PYTHONPATH": str(overlay)} if overlay else {}
        super().__init__(work, {**env, **path, **(extra or {})})
        self.name = name
        self.fitted = Variant.created

    def start(self) -> None:
        super().start()
        Variant.created = True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=6)
    parser.add_argument("--diffs", nargs="*", type=Path, help="default: bench/select/proposed/*.diff")
    parser.add_argument("--no-echo", action="store_true", help="leave out the echo references")
    parser.add_argument("--out", type=Path, default=None, help="also write the results as JSON here")
    parser.add_argument(
        "--variant",
        dest="variants",
        type=setting_variant,
        action="append",
        default=[],
        help="NAME:KEY=VALUE[,KEY=VALUE]: the unchanged optimizer with these FLYWHEEL_OPTIMIZER_* settings",
    )
    args = parser.parse_args(argv)
    diffs = args.diffs if args.diffs is not None else sorted(PROPOSED.glob("*.diff"))
    h2load_bin = R.ensure_h2load()
    work, servers = R.new_work("flywheel-bench-variants-")
    results: dict[str, list[dict[str, float]]] = {}
    try:
        stages = build_stages(work / "stages", diffs)
        env = R.start_stack(servers, "bvar", "bench_variants")
        h2 = R.H2load(h2load_bin, work)
        makers: list[tuple[str, Any]] = [("optimizer (as is)", lambda: Variant(work, env, "optimizer (as is)", None))]
        for name, settings in args.variants:
            makers.append((name, lambda n=name, x=settings: Variant(work, env, n, None, x)))
        for name, overlay, extra in stages:
            makers.append((f"+ {name}", lambda n=name, o=overlay, x=extra: Variant(work, env, f"+ {n}", o, x)))
        if not args.no_echo:
            makers.append(("grpc_echo_aio", lambda: R.PeerTarget(work, "grpc_echo_aio", "echo", "aio")))
            makers.append(("grpc_echo_sync", lambda: R.PeerTarget(work, "grpc_echo_sync", "echo", "sync")))
        p = R.Params(quick=False, rounds=1, warmup_s=2, saturate_s=args.seconds, latency_s=0, batch_s=0)
        for rep in range(args.reps):
            for name, make in makers:
                target = make()
                target.start()
                try:
                    R.pin_tree(target.pid, {R.SERVER_CPU})
                    R.check_responses(target)
                    sat = dict(clients=p.clients, streams=p.streams, headers=dict(target.headers))
                    h2.run(target.port, seconds=p.warmup_s, **sat)
                    phase = R.measure(
                        target, "select", lambda t=target, kw=sat: h2.run(t.port, seconds=p.saturate_s, **kw)
                    )
                    phase.check(name, p.clients * p.streams)
                    row = {
                        "select_rps": phase.h2.rps,
                        "server_cpu_util": phase.server_cpu_util,
                        "cpu_us_per_select": 1e6 * phase.server_cpu_util / phase.h2.rps,
                    }
                    results.setdefault(name, []).append(row)
                    print(
                        f"rep {rep + 1}: {name:<28} {row['select_rps']:7.0f} Select/s  "
                        f"cpu {row['server_cpu_util']:.2f}  {row['cpu_us_per_select']:6.0f} us/Select",
                        file=sys.stderr,
                    )
                finally:
                    target.stop()
    finally:
        with contextlib.suppress(Exception):
            servers.stop()
        shutil.rmtree(work, ignore_errors=True)

    summary = {
        name: {
            "select_rps_median": statistics.median(r["select_rps"] for r in rows),
            "select_rps_max": max(r["select_rps"] for r in rows),
            "cpu_us_per_select_median": statistics.median(r["cpu_us_per_select"] for r in rows),
            "runs": rows,
        }
        for name, rows in results.items()
    }
    base = summary["optimizer (as is)"]
    echo = summary.get("grpc_echo_aio")
    echo_sync = summary.get("grpc_echo_sync")
    lines = [
        f"{'target':<30} {'Select/s':>9} {'us/Select':>10} {'vs as-is':>9} {'vs echo aio':>12} {'vs echo sync':>13}",
    ]
    for name, s in summary.items():
        us = s["cpu_us_per_select_median"]
        rel = base["cpu_us_per_select_median"] / us
        e = f"{echo['cpu_us_per_select_median'] / us:12.2f}" if echo else f"{'-':>12}"
        es = f"{echo_sync['cpu_us_per_select_median'] / us:13.2f}" if echo_sync else f"{'-':>13}"
        lines.append(f"{name:<30} {s['select_rps_median']:9.0f} {us:10.0f} {rel:8.2f}x {e} {es}")
    print("\n".join(lines))
    print("(Select/s: median of the runs; us/Select: the server's CPU time per Select, median; the ratios are")
    print(" throughput ratios at a full core, i.e. inverse CPU-cost ratios)")
    if args.out:
        got = {"diffs": [d.name for d in diffs], "variants": dict(args.variants), "summary": summary}
        args.out.write_text(json.dumps(got, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
