"""The command line every service shares: ``python -m flywheel.<svc> [serve|migrate]``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from flywheel.core.lifecycle import ServiceParts, serve
from flywheel.core.logging import configure_logging, get_logger
from flywheel.core.settings import ServiceSettings, load_settings

S = TypeVar("S", bound=ServiceSettings)


def run(
    *,
    name: str,
    settings_cls: type[S],
    build: Callable[[S, ServiceParts], Awaitable[None]],
    migrations: Path | None = None,
    argv: list[str] | None = None,
) -> None:
    """Parse the command, load settings (exit 2 if invalid), then serve or migrate."""
    parser = argparse.ArgumentParser(prog=f"python -m flywheel.{name}", description=f"Flywheel {name} service")
    commands = ["serve", "migrate", "check-config"] if migrations else ["serve", "check-config"]
    parser.add_argument("command", nargs="?", default="serve", choices=commands)
    args = parser.parse_args(argv)

    settings = load_settings(settings_cls)
    configure_logging(service=name, level=settings.log_level, fmt=settings.log_format)
    log = get_logger(name)
    if args.command == "check-config":
        print(f"{name}: configuration is valid")
        return
    if args.command == "migrate":
        from flywheel.core.migrations import upgrade

        db_settings: Any = settings.db
        upgrade(db_settings, script_location=migrations, service=name)  # type: ignore[arg-type]
        log.info("migrated", schema=db_settings.schema_name)
        return

    if settings.gil_switch_interval_s is not None:
        sys.setswitchinterval(settings.gil_switch_interval_s)

    async def main() -> None:
        parts = ServiceParts()
        try:
            await build(settings, parts)
        except Exception as exc:  # noqa: BLE001 - any startup failure: log it, close, exit 1
            log.error("startup failed", error=repr(exc))
            for close in reversed(parts.closers):
                with contextlib.suppress(Exception):  # best effort while failing anyway
                    await close()
            sys.exit(1)
        # Everything built so far lives as long as the process: keep it out of the cyclic
        # collector's generations, so its collections scan only what requests allocate.
        gc.collect()
        gc.freeze()
        await serve(settings, name=name, parts=parts)

    asyncio.run(main())
