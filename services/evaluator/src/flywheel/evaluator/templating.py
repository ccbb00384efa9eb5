"""Templated HTTP bodies and response paths, without string-building JSON.

A body template is JSON. Every string in it may hold ``{{path}}`` placeholders: a string
that is exactly one placeholder becomes the value itself (a number stays a number, an
object stays an object); otherwise each placeholder is replaced by the value's text. So a
test case's text can never break the JSON it is put into. Paths are dotted names with
list indices (``input.question``, ``messages.0.content``); ``$.`` in front is allowed."""

from __future__ import annotations

import json
import re
from typing import Any

_PLACEHOLDER = re.compile(r"\{\{\s*([^{}\s]+)\s*\}\}")
_MISSING = object()


class TemplateError(ValueError):
    """A template or path that cannot be applied; the message says which part."""


def lookup(path: str, data: Any) -> Any:
    """The value at a dotted path (``choices.0.message.content``); TemplateError if absent."""
    found = _walk(path, data)
    if found is _MISSING:
        raise TemplateError(f"{path!r} is not in {_shape(data)}")
    return found


def _walk(path: str, data: Any) -> Any:
    current = data
    cleaned = path[2:] if path.startswith("$.") else path.lstrip("$")
    for part in filter(None, re.split(r"\.|\[(\d+)\]", cleaned)):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.lstrip("-").isdigit() and -len(current) <= int(part) < len(current):
            current = current[int(part)]
        else:
            return _MISSING
    return current


def _shape(data: Any) -> str:
    if isinstance(data, dict):
        return "an object with keys " + ", ".join(sorted(map(str, data))[:10])
    return f"a {type(data).__name__}"


def render_body(template: str, context: dict[str, Any]) -> Any:
    """Render a JSON body template with values from ``context``."""
    try:
        parsed = json.loads(template)
    except json.JSONDecodeError as exc:
        raise TemplateError(f"body_template is not JSON: {exc}") from None
    return _render(parsed, context)


def _render(node: Any, context: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        return {_render(k, context) if isinstance(k, str) else k: _render(v, context) for k, v in node.items()}
    if isinstance(node, list):
        return [_render(v, context) for v in node]
    if not isinstance(node, str):
        return node
    whole = _PLACEHOLDER.fullmatch(node.strip())
    if whole:
        return lookup(whole.group(1), context)

    def text(match: re.Match[str]) -> str:
        value = lookup(match.group(1), context)
        return value if isinstance(value, str) else json.dumps(value)

    return _PLACEHOLDER.sub(text, node)


def render_text(template: str, context: dict[str, Any]) -> str:
    """Replace ``{{path}}`` placeholders in plain text (prompt templates)."""

    def text(match: re.Match[str]) -> str:
        value = lookup(match.group(1), context)
        return value if isinstance(value, str) else json.dumps(value)

    return _PLACEHOLDER.sub(text, template)
