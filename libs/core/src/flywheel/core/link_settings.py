"""The settings of one gRPC link from a service to another, declared once.

``link_settings("judge", timeout_s=60)`` is a settings mixin with the nine fields
``judge_address``, ``judge_auth_token``, ``judge_timeout_s``, ``judge_tls``,
``judge_tls_ca_file``, ``judge_tls_cert_file``, ``judge_tls_key_file``,
``judge_tls_server_name`` and ``judge_allow_insecure``. A service's settings class inherits
the mixins of the links it uses beside :class:`flywheel.core.settings.ClientLinks` (which
turns them into TLS and a token, and checks them at start), so each field keeps the flat env
name of its service (``FLYWHEEL_SOCIETY_JUDGE_ADDRESS``…) that the Helm chart sets.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, FilePath, SecretStr, create_model
from pydantic_settings import BaseSettings


def link_settings(link: str, *, timeout_s: float) -> type[BaseSettings]:
    """A settings mixin declaring the fields of the gRPC link ``link`` (``timeout_s``: the
    default of ``<link>_timeout_s``, the per-call deadline)."""
    fields: dict[str, Any] = {
        # host:port; empty: the link is off (each service says what it does without it).
        f"{link}_address": (str, ""),
        # Bearer token sent on every call; only over TLS or to loopback unless allow_insecure.
        f"{link}_auth_token": (SecretStr | None, None),
        f"{link}_timeout_s": (float, Field(timeout_s, gt=0)),
        # TLS: on when <link>_tls is true or any <link>_tls_* is set (no CA file: the system
        # roots); a cert and key make it mTLS; server_name overrides the name checked.
        f"{link}_tls": (bool, False),
        f"{link}_tls_ca_file": (FilePath | None, None),
        f"{link}_tls_cert_file": (FilePath | None, None),
        f"{link}_tls_key_file": (FilePath | None, None),
        f"{link}_tls_server_name": (str | None, None),
        f"{link}_allow_insecure": (bool, False),
    }
    name = "".join(part.title() for part in link.split("_")) + "Link"
    return create_model(name, __base__=BaseSettings, __doc__=f"The {link} link's settings.", **fields)


JudgeLink = link_settings("judge", timeout_s=60.0)
OptimizerLink = link_settings("optimizer", timeout_s=10.0)
TrainerLink = link_settings("trainer", timeout_s=30.0)
TraceStoreLink = link_settings("trace_store", timeout_s=10.0)
