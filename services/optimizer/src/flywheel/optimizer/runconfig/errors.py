"""``field.path: what is wrong`` lines from pydantic errors, one per problem (never pydantic's
own multi-line text)."""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError


class ProblemsError(ValueError):
    """A value with one or more problems, each ``field.path: what is wrong``."""

    def __init__(self, problems: list[str], source: str = "") -> None:
        self.problems = problems
        where = f" in {source}" if source else ""
        super().__init__(f"{len(problems)} problem(s){where}:\n" + "\n".join(f"  - {p}" for p in problems))


def field_path(loc: tuple[Any, ...], prefix: str = "") -> str:
    # pydantic puts validator names (function-after[...]) and union branches in loc; people don't
    parts = [str(p) for p in loc if not (isinstance(p, str) and ("[" in p or p.startswith("function-")))]
    return ".".join([prefix, *parts] if prefix else parts) or prefix or "(top level)"


def message(err: Any) -> str:
    msg = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        return "unknown field (check the spelling)"
    if err["type"] == "missing":
        return "required field is missing"
    if (
        "input" in err
        and err["type"] not in ("value_error", "assertion_error")
        and not isinstance(err["input"], dict | list)
    ):
        msg += f" (got {err['input']!r})"
    return msg


def problems_of(exc: ValidationError, prefix: str = "") -> list[str]:
    """Every error of a pydantic ValidationError as a ``field.path: problem`` line."""
    return [f"{field_path(e['loc'], prefix)}: {message(e)}" for e in exc.errors()]
