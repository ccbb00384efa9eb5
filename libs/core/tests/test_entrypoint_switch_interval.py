"""``gil_switch_interval_s``: a service sets CPython's GIL switch interval before it builds
anything, and leaves Python's default alone when the setting is unset."""

from __future__ import annotations

import sys

import pytest
from pydantic_settings import SettingsConfigDict

from flywheel.core import entrypoint
from flywheel.core.settings import ServiceSettings


class _Settings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_SWITCHTEST_", extra="ignore")


def _interval_seen_by_build(monkeypatch: pytest.MonkeyPatch) -> float:
    """Run the entrypoint with a build that records the switch interval, then fails (so the
    service exits 1 before it serves anything)."""
    seen: list[float] = []

    async def build(_settings: _Settings, _parts: object) -> None:
        seen.append(sys.getswitchinterval())
        raise RuntimeError("stop here")

    monkeypatch.setattr(sys, "argv", ["switchtest"])
    with pytest.raises(SystemExit) as exited:
        entrypoint.run(name="switchtest", settings_cls=_Settings, build=build, argv=["serve"])
    assert exited.value.code == 1
    return seen[0]


@pytest.fixture(autouse=True)
def _restore_interval(monkeypatch: pytest.MonkeyPatch):
    # The entrypoint configures structlog for the whole process, bound to this test's captured
    # stderr; later tests that read their service's log would find it empty. Not this test's concern.
    monkeypatch.setattr(entrypoint, "configure_logging", lambda **_: None)
    before = sys.getswitchinterval()
    yield
    sys.setswitchinterval(before)


def test_the_setting_is_applied_before_the_service_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.setswitchinterval(0.005)
    monkeypatch.setenv("FLYWHEEL_SWITCHTEST_GIL_SWITCH_INTERVAL_S", "0.0007")
    assert _interval_seen_by_build(monkeypatch) == pytest.approx(0.0007)


def test_unset_keeps_the_interval_python_has(monkeypatch: pytest.MonkeyPatch) -> None:
    sys.setswitchinterval(0.004)
    monkeypatch.delenv("FLYWHEEL_SWITCHTEST_GIL_SWITCH_INTERVAL_S", raising=False)
    assert _interval_seen_by_build(monkeypatch) == pytest.approx(0.004)


@pytest.mark.parametrize("bad", ["0", "-0.001", "2"])
def test_out_of_range_values_are_refused(monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("FLYWHEEL_SWITCHTEST_GIL_SWITCH_INTERVAL_S", bad)
    with pytest.raises(SystemExit) as exited:
        entrypoint.run(name="switchtest", settings_cls=_Settings, build=lambda *_: None, argv=["serve"])  # type: ignore[arg-type,return-value]
    assert exited.value.code == 2
