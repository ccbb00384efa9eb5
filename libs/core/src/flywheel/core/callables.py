"""Resolving a ``package.module:function`` path that a request names (an evaluator's python
target or custom metric, a trainer's verifiable reward or multi-turn environment), under the
run policy: the text is checked before anything is imported, and what the import gave is
checked again (``mymodule:os.system`` reaches ``os`` through an import). One function, so
every service refuses the same paths."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from flywheel.core.run_policy import RunPolicySettings


class CallableRefused(ValueError):
    """The path is malformed, refused by the run policy, not importable, or not callable."""


def resolve_callable(path: str, *, what: str, policy: RunPolicySettings) -> Callable[..., Any]:
    """Import ``package.module:function`` if ``policy`` allows it; :class:`CallableRefused`
    naming ``what`` and the problem if it does not, or if the import fails."""
    module_name, sep, attr = path.partition(":")
    if not sep or not module_name or not attr:
        raise CallableRefused(f"{what} {path!r} must look like 'package.module:function'")
    problem = policy.callable_problem(path)
    if problem:
        raise CallableRefused(f"{what}: {problem}")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise CallableRefused(f"{what} {path!r} cannot be imported: {exc}") from None
    problem = policy.check_resolved(path, found)
    if problem:
        raise CallableRefused(f"{what}: {problem}")
    if not callable(found):
        raise CallableRefused(f"{what} {path!r} is not callable")
    return found  # type: ignore[no-any-return]
