"""JSON values as they were written, out of protobuf ``Struct``s.

A ``Struct`` stores every number as a double, so ``max_tokens: 256`` comes back as ``256.0``,
which OpenAI and most typed APIs refuse. :func:`plain_number` turns every number that is
integral, finite and within +-2**53 (where a double holds every integer exactly) back into an
``int``, at any depth. The cost: a value written ``1.0`` arrives as ``1`` (equal in Python and
in JSON arithmetic). The SDK applies it to arm params, the evaluator to a candidate's config
and a test case's input and expected output, so a number means the same on both paths.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

MAX_EXACT_INT = 2**53


def plain_number(value: Any) -> Any:
    """An integral double within +-2**53 as ``int``, in dicts and lists too; else as given."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= MAX_EXACT_INT:
        return int(value)
    if isinstance(value, dict):
        return {k: plain_number(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_number(v) for v in value]
    return value


def struct_to_plain(struct: Struct) -> dict[str, Any]:
    """``struct`` as a dict, its integral numbers as ints (see the module docstring)."""
    return plain_number(MessageToDict(struct))  # type: ignore[no-any-return]
