"""The whole loop on one machine, told as it happens (``./dev demo``).

Starts NATS, PostgreSQL, S3, the six services and the local model server, then tells the story
of one support-assistant endpoint with progress bars: (1) batch optimization of its config
with the society on (RLP proposals, an SAO round); (2) the best configs as arms under
simulated product traffic with a hidden ground truth (Select through the SDK, feedback and
traces); (3) pairs from the traces plus the SAO pairs → a DPO job with LoRA on the CPU →
policy v1, a canary arm served by the model server; (4) the bandit promotes or rolls back the
canary and the registry follows. Writes an HTML report (and the record as JSON beside it),
prints a summary, and stops everything it started, on error and Ctrl-C too.

    python -m flywheel.stack.demo [--report demo-report.html] [--sizes demo|e2e] [--keep]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from flywheel.stack.story.context import StorySizes
from flywheel.stack.story.record import StoryRecord
from flywheel.stack.story.verdict import verdict_text

console = Console()
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


class _RichBar:
    def __init__(self, progress: Progress, task: Any) -> None:
        self.progress, self.task = progress, task

    def update(self, *, completed: float | None = None, total: float | None = None, note: str = "") -> None:
        fields: dict[str, Any] = {"note": note}
        if completed is not None:
            fields["completed"] = completed
        if total is not None:
            fields["total"] = total
        self.progress.update(self.task, **fields)


class RichProgress:
    """StoryProgress as rich progress bars (one per stage step) and printed lines."""

    def __init__(self, out: Console) -> None:
        self.console = out

    @contextmanager
    def bar(self, description: str, total: float | None) -> Iterator[_RichBar]:
        columns = (
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("[dim]{task.fields[note]}"),
        )
        with Progress(*columns, console=self.console) as progress:
            task = progress.add_task(description, total=total, note="")
            bar = _RichBar(progress, task)
            yield bar
            if total is not None:
                progress.update(task, completed=progress.tasks[0].total)

    def say(self, text: str) -> None:
        self.console.print(f"  {text}")


def _f(value: Any, spec: str = ".3f") -> str:
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def summary(record: StoryRecord) -> list[str]:
    """One or two lines of figures per stage, as the report has them."""
    lines: list[str] = []
    stage_s = record.meta.get("stage_seconds", {})
    if (o := record.optimize) is not None:
        sao = o.get("sao") or {}
        rlp = o.get("rlp") or {}
        lines.append(
            f"1. optimize ({_f(stage_s.get('optimize'), '.0f')} s): {o.get('evaluations')} evaluations "
            f"({o.get('evaluations_failed')} failed), best score {_f(o.get('best_score'))}; "
            f"RLP {rlp.get('proposals', 0)} proposals; "
            f"SAO {sao.get('pairs', 0)} pairs kept of {sao.get('attempted', 0)}"
        )
    if (t := record.traffic) is not None:
        rates = ", ".join(f"{a['arm_id']} {_f(a.get('true_rate'), '.2f')}" for a in t.get("arms", []))
        lines.append(
            f"2. traffic ({_f(stage_s.get('traffic'), '.0f')} s): {t['decisions']} decisions, feedback applied "
            f"{t['feedback_applied']} times, {t['traces']} traces rewarded; incumbent {t.get('incumbent') or '-'} "
            f"(hidden rates: {rates})"
        )
        if t.get("verdict"):
            lines.append(f"   {verdict_text(t['verdict'], t['decisions'])}")
    if (tr := record.training) is not None:
        losses = [s["loss"] for s in tr.get("steps", [])]
        curve = f"loss {_f(losses[0])} → {_f(losses[-1])}" if losses else "no steps reported"
        lines.append(
            f"3. training ({_f(stage_s.get('training'), '.0f')} s): {tr['trace_pairs']} trace pairs + "
            f"{tr['sao_pairs']} SAO pairs → job {tr['job_id']} ({tr['job_state']}, {len(losses)} steps, {curve}) "
            f"→ {tr['policy_name']} v{tr['version']} as canary arm {tr['arm_id']}"
        )
    if (c := record.canary) is not None:
        p = c["timeline"][-1]["p_better"] if c.get("timeline") else None
        lines.append(
            f"4. canary ({_f(stage_s.get('canary'), '.0f')} s): {c['decision']} after {c['decisions']} decisions "
            f"({c['canary_decisions']} to the canary, P(better) {_f(p, '.2f')}); registry: {c['policy_status']}"
        )
    return lines


def write_outputs(record: StoryRecord, report: Path) -> tuple[Path, Path | None]:
    """The record as JSON beside the report, and the report (when the report module is there)."""
    report.parent.mkdir(parents=True, exist_ok=True)
    saved = record.save(report.with_suffix(".json"))
    try:
        from flywheel.stack.story.report import write_report
    except ImportError:
        return saved, None
    return saved, write_report(record, report)


def _stop_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, default=Path("demo-report.html"), help="where the HTML report goes")
    parser.add_argument("--sizes", choices=("demo", "e2e"), default="demo", help="how big each stage is")
    parser.add_argument("--keep", action="store_true", help="keep the data and logs folder afterwards")
    args = parser.parse_args(argv)
    for key, value in OFFLINE.items():
        os.environ.setdefault(key, value)
    _stop_on_sigterm()
    from flywheel.stack.story.run import start_story_stack, stop_story_stack

    sizes = StorySizes.demo() if args.sizes == "demo" else StorySizes.e2e()
    root = Path(tempfile.mkdtemp(prefix="flywheel-demo-"))
    began = time.monotonic()
    told: list[StoryRecord] = []  # the record, also when a stage fails (the stages done still make a report)
    failed: BaseException | None = None
    try:
        with console.status("starting the model server, NATS, PostgreSQL, S3 and six services on loopback…"):
            stack, model = start_story_stack(root, sizes)
        console.print(f"Stack and model server up in {time.monotonic() - began:.0f} s (data and logs in {root})")
        try:
            asyncio.run(_tell(stack, model, sizes, RichProgress(console), told))
        except (Exception, KeyboardInterrupt) as exc:  # noqa: BLE001 - reported below, with the report so far
            failed = exc
        finally:
            with console.status("stopping everything (SIGTERM, drain)…"):
                stop_story_stack(stack, model)
            console.print("Stopped everything the demo started.")
    finally:
        if args.keep:
            console.print(f"data and logs kept in {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    record = told[0] if told else None
    if record is not None:
        record.meta["wall_seconds"] = round(time.monotonic() - began, 1)
        saved, report = write_outputs(record, args.report)
        for line in summary(record):
            console.print(line)
        console.print(f"Record: {saved}")
        if report is not None:
            console.print(f"[bold]Report: {report.resolve()}[/]")
    console.print(f"Finished in {time.monotonic() - began:.0f} s.")
    if failed is not None:
        if isinstance(failed, KeyboardInterrupt):
            console.print("[red]Interrupted.[/]")
            return 130
        console.print(f"[red]The story stopped: {type(failed).__name__}: {failed}[/]")
        return 1
    return 0


async def _tell(stack: Any, model: Any, sizes: StorySizes, progress: RichProgress, told: list[StoryRecord]) -> None:
    """``tell_story``, with the record handed out before the first stage runs."""
    from flywheel.stack.story.run import run_stages, stages, story_context

    ctx = story_context(stack, model, sizes, progress=progress)
    told.append(ctx.record)
    await run_stages(ctx, stages())


if __name__ == "__main__":
    sys.exit(main())
