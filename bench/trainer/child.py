"""What the parent hands to a forked child: a function of ``worker`` by name. The parent
imports only this module, so it never pays for torch; the fork server preloads ``worker``."""

from __future__ import annotations

from typing import Any


def call(name: str, *args: Any) -> Any:
    import worker

    return getattr(worker, name)(*args)
