"""Runs ``python -m flywheel.<svc> check-config`` for many environments in one process.

Reads a JSON list of ``{"id", "module", "env"}`` on stdin and writes one JSON list of
``{"id", "rc", "output", "unknown"}``: for each case the process environment is replaced by
exactly ``env`` and the service's own entry point (``flywheel.<svc>.app.main``, what
``python -m flywheel.<svc>`` calls) runs the ``check-config`` command. ``unknown`` lists the
FLYWHEEL_* variables in ``env`` that no field of the service's settings reads (settings ignore
unknown variables, so a renamed setting would otherwise pass silently). One process imports
the six services once, instead of six-second imports per case.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import sys

from pydantic_settings import BaseSettings

SETTINGS = {
    "optimizer": "OptimizerSettings",
    "evaluator": "EvaluatorSettings",
    "trace_store": "TraceStoreSettings",
    "reward_judge": "RewardJudgeSettings",
    "society": "SocietySettings",
    "trainer": "TrainerSettings",
}


def known_env(cls: type[BaseSettings]) -> set[str]:
    """Every environment variable a settings class (and its nested settings) reads."""
    names: set[str] = set()
    prefix = str(cls.model_config.get("env_prefix", ""))
    for name, field in cls.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseSettings):
            names |= known_env(ann)
        else:
            names.add(field.alias or (prefix + name).upper())
    return names


def run_case(module: str, env: dict[str, str]) -> tuple[int, str]:
    app = importlib.import_module(f"flywheel.{module}.app")
    saved_env, saved_argv = dict(os.environ), sys.argv
    os.environ.clear()
    os.environ.update(env)
    sys.argv = [f"flywheel.{module}", "check-config"]
    out = io.StringIO()
    rc = 0
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            app.main()
    except SystemExit as exc:
        rc = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        sys.argv = saved_argv
    return rc, out.getvalue()


def main() -> None:
    cases = json.load(sys.stdin)
    results = []
    for case in cases:
        module = case["module"]
        settings_cls = getattr(importlib.import_module(f"flywheel.{module}.settings"), SETTINGS[module])
        rc, output = run_case(module, case["env"])
        known = known_env(settings_cls)
        unknown = sorted(k for k in case["env"] if k.startswith("FLYWHEEL_") and k not in known)
        results.append({"id": case["id"], "rc": rc, "output": output, "unknown": unknown})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
