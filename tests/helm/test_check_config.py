"""The rendered configuration is the services' configuration: each Deployment's and migrate
Job's environment (ConfigMap and Secrets resolved, TLS files where the pod mounts them) is given
to the service's own ``check-config``, which must accept it; and every FLYWHEEL_* variable the
chart sets must be one the service reads (settings ignore unknown variables, so a renamed
setting would otherwise go unnoticed)."""

from __future__ import annotations

from .chart import VALUE_SETS
from .conftest import RENAMED_CASE, Rendered


def test_every_service_accepts_the_rendered_env(rendered: Rendered) -> None:
    results = [r for r in rendered.config_results() if r["id"] != RENAMED_CASE]
    assert {r["id"].split(":")[0] for r in results} == set(VALUE_SETS)
    # Six services in every set (the trainer twice, as API and as GPU worker where enabled),
    # plus the five migrate Jobs.
    assert len(results) >= 4 * 11
    failures = [f"{r['id']}: rc={r['rc']}\n{r['output']}" for r in results if r["rc"] != 0]
    assert failures == []
    assert all("configuration is valid" in r["output"] for r in results)


def test_every_variable_is_a_setting(rendered: Rendered) -> None:
    unknown = {r["id"]: r["unknown"] for r in rendered.config_results() if r["unknown"] and r["id"] != RENAMED_CASE}
    assert unknown == {}


def test_a_renamed_setting_is_caught(rendered: Rendered) -> None:
    """The minimal optimizer's env with one required and one optional variable renamed (the
    fixture adds this case to the same runner): check-config refuses the first, the
    unknown-variable check catches the second."""
    (result,) = [r for r in rendered.config_results() if r["id"] == RENAMED_CASE]
    assert result["rc"] == 2 and "FLYWHEEL_NATS_URL" in result["output"]
    assert result["unknown"] == ["FLYWHEEL_NATS_ADDRESS", "FLYWHEEL_OPTIMIZER_METRICS_PORTS"]
