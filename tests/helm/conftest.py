"""Fixtures of the chart tests: the four values sets rendered once by the real helm, and the two
slow checks (checkov's scan, the services' check-config) started in the background at once so
they overlap with the fast tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import trustme
import yaml

from .chart import (
    MODULES,
    ROOT,
    VALUE_SETS,
    component,
    container_env,
    helm_binary,
    kind,
    materialise_mounts,
    relocate,
    render,
    secret_data,
)

CHECKOV = ROOT / ".tools" / "checkov" / "bin" / "checkov"
# A case run beside the rendered ones: the minimal optimizer's env with settings renamed.
RENAMED_CASE = "renamed:Deployment/optimizer"


def renamed_case(cases: list[dict[str, Any]]) -> dict[str, Any]:
    env = dict(next(c for c in cases if c["id"] == "minimal:Deployment/optimizer")["env"])
    env["FLYWHEEL_NATS_ADDRESS"] = env.pop("FLYWHEEL_NATS_URL")
    env["FLYWHEEL_OPTIMIZER_METRICS_PORTS"] = env.pop("FLYWHEEL_OPTIMIZER_METRICS_PORT")
    return {"id": RENAMED_CASE, "module": "optimizer", "env": env}


def existing_secrets(tls_dir: Path) -> dict[str, dict[str, str]]:
    """The Secrets a platform team creates before installing with existingSecret values
    (production and external-tls sets); the TLS material is a real throwaway CA's."""
    ca = trustme.CA()
    cert = ca.issue_cert("*.flywheel.svc", "fw-flywheel-optimizer", "fw-flywheel-trainer", "fw-flywheel-reward-judge")
    pem_ca = ca.cert_pem.bytes().decode()
    roles = ("admin", "optimizer", "evaluator", "trace_store", "society", "trainer", "product")
    dsn = "postgresql://flywheel:pw@pg.shared-infra:5432/flywheel?ssl=verify-full"
    return {
        "flywheel-nats": {f"{r}-password": f"{r}-pw-from-secret" for r in roles},
        "flywheel-postgres": {"url": dsn, "dsn": dsn},
        "flywheel-s3": {"access-key": "AKIAEXAMPLE", "secret-key": "s3-secret-from-secret"},
        "flywheel-llm": {"api-key": "sk-llm-from-secret"},
        "flywheel-grpc-token": {"token": "grpc-token-from-secret"},
        "flywheel-grpc-tls": {
            "tls.crt": b"".join(b.bytes() for b in cert.cert_chain_pems).decode(),
            "tls.key": cert.private_key_pem.bytes().decode(),
            "ca.crt": pem_ca,
        },
        "nats-ca": {"ca.crt": pem_ca},
        "postgres-ca": {"ca.crt": pem_ca},
        "minio-ca": {"ca.crt": pem_ca},
    }


@dataclass
class Rendered:
    docs: dict[str, list[dict[str, Any]]]
    secrets: dict[str, dict[str, dict[str, str]]]
    scan_dir: Path
    checkov: subprocess.Popen[str] | None
    config_cases: list[dict[str, Any]] = field(default_factory=list)
    config_proc: subprocess.Popen[str] | None = None
    _config_results: list[dict[str, Any]] | None = None

    def config_results(self) -> list[dict[str, Any]]:
        if self._config_results is None:
            assert self.config_proc is not None
            out, err = self.config_proc.communicate(timeout=240)
            assert self.config_proc.returncode == 0, err[-3000:]
            self._config_results = json.loads(out)
        return self._config_results


def config_cases(
    name: str, docs: list[dict[str, Any]], secrets: dict[str, dict[str, str]], root: Path
) -> list[dict[str, Any]]:
    """One check-config case per service container (Deployments and the migrate Jobs)."""
    cases = []
    for d in kind(docs, "Deployment") + kind(docs, "Job"):
        comp = component(d).removesuffix("-migrate")
        if comp not in MODULES:
            continue  # the model server and the JetStream setup Job are not flywheel services
        spec = d["spec"]["template"]["spec"]
        for c in spec["containers"]:
            case_id = f"{name}:{d['kind']}/{component(d)}"
            mounts = materialise_mounts(spec, c, secrets, root / case_id.replace(":", "_").replace("/", "_"))
            env = container_env(docs, c, secrets, pod_name=f"{d['metadata']['name']}-0")
            # What the image sets (deploy/docker/service.Dockerfile) besides the pod's env.
            env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONUNBUFFERED": "1", **env}
            cases.append({"id": case_id, "module": MODULES[comp], "env": relocate(env, mounts)})
    return cases


@pytest.fixture(scope="session")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rendered]:
    if not helm_binary():
        pytest.skip("helm is not installed here: `bash scripts/setup.sh` extracts it into .tools/bin (CI runs it)")
    tmp = tmp_path_factory.mktemp("chart")
    tls_dir = tmp / "tls"
    tls_dir.mkdir()
    made = existing_secrets(tls_dir)
    docs = {name: render(name) for name in VALUE_SETS}
    secrets = {name: secret_data(docs[name], made) for name in VALUE_SETS}

    scan_dir = tmp / "scan"
    for name, ds in docs.items():
        (scan_dir / name).mkdir(parents=True)
        (scan_dir / name / "manifests.yaml").write_text(yaml.safe_dump_all(ds))
    checkov = None
    if CHECKOV.exists():
        cmd = [str(CHECKOV), "-d", str(scan_dir), "--framework", "kubernetes", "-o", "json", "--quiet", "--compact"]
        checkov = subprocess.Popen(
            [*cmd, "--skip-download"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp
        )

    cases = [c for name in VALUE_SETS for c in config_cases(name, docs[name], secrets[name], tmp / "mounts")]
    cases.append(renamed_case(cases))
    runner = Path(__file__).with_name("check_config_runner.py")
    proc = subprocess.Popen(
        [sys.executable, str(runner)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert proc.stdin is not None
    proc.stdin.write(json.dumps(cases))
    proc.stdin.close()
    proc.stdin = None  # communicate() must not flush a closed stdin
    found = Rendered(
        docs=docs, secrets=secrets, scan_dir=scan_dir, checkov=checkov, config_cases=cases, config_proc=proc
    )
    yield found
    # Not waited for when only some tests ran: stop them rather than leave them running.
    for p in (checkov, proc):
        if p is not None and p.poll() is None:
            p.kill()
            p.communicate()
