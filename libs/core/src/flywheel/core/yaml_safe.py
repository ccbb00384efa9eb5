"""Bounded YAML loading for text that comes from callers or users.

``yaml.safe_load`` refuses arbitrary Python objects but not a "billion laughs": nine
anchors of ten aliases each parse in microseconds into a *shared* graph that any later
``str()``, JSON dump or walk expands to 10**9 nodes, so a 1 KiB PutRubric once took the
reward judge's event loop (and its health) down. :func:`load` composes the node graph
first, measures it as if every alias were expanded, and constructs Python objects only
when the document is within its limits:

- ``max_chars``: the text itself;
- ``max_nodes``: scalars, sequences and mappings counted *after* alias expansion;
- ``max_depth``: nesting (deep documents also exhaust the recursive parser);
- ``max_aliases``: alias references (``*name``); 0 refuses anchors altogether.

A refusal is a :class:`YamlLimitError`, a ``yaml.YAMLError``, so callers that already
turn parse errors into a clear message keep doing so; its message is a predicate ("is
2,000,000 characters; at most 1,000,000") to follow the name of the field, as in
``f"{field} {exc}"``.
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, SequenceNode

__all__ = [
    "DEFAULT_MAX_ALIASES",
    "DEFAULT_MAX_CHARS",
    "DEFAULT_MAX_DEPTH",
    "DEFAULT_MAX_NODES",
    "YamlLimitError",
    "load",
]

DEFAULT_MAX_CHARS = 1_000_000
DEFAULT_MAX_NODES = 100_000
DEFAULT_MAX_DEPTH = 64
DEFAULT_MAX_ALIASES = 100


class YamlLimitError(yaml.YAMLError):
    """The document is valid YAML but over one of the limits of :func:`load`."""


class _Measure:
    """Expanded size of a composed node graph, memoised per node so a shared subtree is
    measured once however many aliases point at it (the walk itself stays linear)."""

    def __init__(self, max_nodes: int, max_depth: int) -> None:
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.sizes: dict[int, int] = {}
        self.open: set[int] = set()

    def size(self, node: Node, depth: int) -> int:
        key = id(node)
        if key in self.sizes:
            return self.sizes[key]
        if depth > self.max_depth:
            raise YamlLimitError(f"nests deeper than {self.max_depth} levels")
        if key in self.open:
            raise YamlLimitError("has a recursive alias (an anchor that contains itself)")
        self.open.add(key)
        total = 1
        if isinstance(node, SequenceNode):
            children: list[Node] = list(node.value)
        elif isinstance(node, MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += self.size(child, depth + 1)
            if total > self.max_nodes:
                raise YamlLimitError(
                    f"expands to more than {self.max_nodes:,} nodes (aliases counted as copies of their anchor)"
                )
        self.open.discard(key)
        self.sizes[key] = total
        return total


class _CountingLoader(yaml.SafeLoader):
    """SafeLoader that counts alias events while composing."""

    aliases = 0
    max_aliases = DEFAULT_MAX_ALIASES

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        if self.check_event(yaml.AliasEvent):
            self.aliases += 1
            if self.aliases > self.max_aliases:
                event = self.peek_event()
                where = f" (line {event.start_mark.line + 1})" if event.start_mark else ""
                raise YamlLimitError(
                    "uses anchors and aliases, which are not accepted here"
                    if self.max_aliases == 0
                    else f"has more than {self.max_aliases} aliases{where}"
                )
        return super().compose_node(parent, index)  # type: ignore[misc]


def load(
    text: str | bytes,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_nodes: int = DEFAULT_MAX_NODES,
    max_depth: int = DEFAULT_MAX_DEPTH,
    max_aliases: int = DEFAULT_MAX_ALIASES,
) -> Any:
    """``yaml.safe_load`` with the limits above; raises yaml.YAMLError (YamlLimitError
    when over a limit). One document only, as safe_load."""
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise YamlLimitError(f"is not valid UTF-8 at byte {exc.start}") from None
    if len(text) > max_chars:
        raise YamlLimitError(f"is {len(text):,} characters; at most {max_chars:,}")
    loader = _CountingLoader(text)
    loader.max_aliases = max_aliases
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YamlLimitError(f"nests deeper than {max_depth} levels") from None
        if node is None:
            return None
        _Measure(max_nodes, max_depth).size(node, 0)
        return loader.construct_document(node)
    finally:
        loader.dispose()
