"""helm/flywheel rendered by the real helm with four values sets: lint, Kubernetes schemas, the
CRD objects' fields, the rules (GPUs, gRPC probes, secrets, KEDA streams, non-root) on good and
deliberately bad renderings, the values schema's refusals, and the NATS users' permissions."""

from __future__ import annotations

import functools
import json
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate import utils as kv_utils

from flywheel.api.subjects import ROLES
from flywheel.stack.cli import chart_users

from .chart import (
    CHART,
    FULL,
    VALUE_SETS,
    RenderError,
    check_grpc_probes,
    check_no_secret_in_configmap,
    check_non_root,
    check_scaled_objects,
    check_trainer_gpu,
    helm,
    kind,
    load_values,
    named,
    render,
    values_file,
)
from .conftest import Rendered

K8S_VERSION = "1.37.0"
# kubernetes-validate re-reads its JSON schemas (a 2 MB definitions file) for every object;
# the same files, read once, validate ~40 objects per values set in well under a second.
kv_utils.schema_contents = functools.lru_cache(maxsize=None)(kv_utils.schema_contents)
CRD_GROUPS = ("keda.sh/", "monitoring.coreos.com/")


def _secret_values(values: dict[str, Any]) -> list[str]:
    v = values
    out = list(v["nats"]["auth"]["passwords"].values())
    out += [v["database"]["url"], v["s3"]["secretKey"], v["grpc"]["auth"]["token"], v["llm"]["apiKey"]]
    return [s for s in out if s]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_lint_strict(rendered: Rendered, name: str) -> None:
    proc = helm("lint", "--strict", str(CHART), "-f", str(values_file(name)))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", VALUE_SETS)
def test_manifests_valid_for_kubernetes(rendered: Rendered, name: str) -> None:
    docs = rendered.docs[name]
    checked = 0
    for doc in docs:
        if doc["apiVersion"].startswith(CRD_GROUPS):
            continue  # CRDs: no schema in kubernetes-validate; see test_crd_objects
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        checked += 1
    kinds = {d["kind"] for d in docs}
    assert {"Deployment", "Service", "ConfigMap", "PodDisruptionBudget", "ServiceAccount", "Job"} <= kinds
    assert checked >= 25


# Minimal schemas of the CRD fields the chart uses (KEDA v2 ScaledObject, Prometheus Operator
# ServiceMonitor): names, types and the nats-jetstream scaler's metadata keys.
_INT_STR = {"type": "string", "pattern": "^[0-9]+$"}
SCALED_OBJECT = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "keda.sh/v1alpha1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["scaleTargetRef", "minReplicaCount", "maxReplicaCount", "triggers"],
            "properties": {
                "scaleTargetRef": {
                    "type": "object",
                    "additionalProperties": False,
                    "required": ["name"],
                    "properties": {
                        "apiVersion": {"const": "apps/v1"},
                        "kind": {"const": "Deployment"},
                        "name": {"type": "string"},
                    },
                },
                "minReplicaCount": {"type": "integer", "minimum": 0},
                "maxReplicaCount": {"type": "integer", "minimum": 1},
                "cooldownPeriod": {"type": "integer", "minimum": 0},
                "pollingInterval": {"type": "integer", "minimum": 1},
                "triggers": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["type", "metadata"],
                        "properties": {
                            "type": {"const": "nats-jetstream"},
                            "metadata": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": [
                                    "natsServerMonitoringEndpoint",
                                    "account",
                                    "stream",
                                    "consumer",
                                    "lagThreshold",
                                ],
                                "properties": {
                                    "natsServerMonitoringEndpoint": {"type": "string", "pattern": "^[^/:]+:[0-9]+$"},
                                    "account": {"type": "string", "minLength": 1},
                                    "stream": {"type": "string", "minLength": 1},
                                    "consumer": {"type": "string", "minLength": 1},
                                    "lagThreshold": _INT_STR,
                                    "activationLagThreshold": _INT_STR,
                                    "useHttps": {"enum": ["true", "false"]},
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "selector": {
                    "type": "object",
                    "required": ["matchLabels"],
                    "properties": {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scheme": {"enum": ["http", "https"]},
                        },
                    },
                },
            },
        },
    },
}


@pytest.mark.parametrize("name", VALUE_SETS)
def test_crd_objects(rendered: Rendered, name: str) -> None:
    docs = rendered.docs[name]
    values = load_values(name)
    deployments = {d["metadata"]["name"]: d for d in kind(docs, "Deployment")}
    scaled = kind(docs, "ScaledObject")
    assert len(scaled) == (2 if values["keda"]["enabled"] else 0)
    for so in scaled:
        jsonschema.validate(so, SCALED_OBJECT)
        target = deployments[so["spec"]["scaleTargetRef"]["name"]]
        # KEDA owns the replica count: a fixed one in the Deployment would fight it.
        assert "replicas" not in target["spec"]
        assert so["spec"]["minReplicaCount"] == 0
    for sm in kind(docs, "ServiceMonitor"):
        jsonschema.validate(sm, SERVICE_MONITOR)
        selector = sm["spec"]["selector"]["matchLabels"]
        services = [s for s in kind(docs, "Service") if selector.items() <= s["metadata"]["labels"].items()]
        ports = {p["name"] for s in services for p in s["spec"]["ports"]}
        assert services and all(e["port"] in ports for e in sm["spec"]["endpoints"])
        assert (
            f"{FULL}-trainer-worker" in {s["metadata"]["name"] for s in services}
            or not values["trainer"]["worker"]["enabled"]
        )
    assert bool(kind(docs, "ServiceMonitor")) == values["metrics"]["serviceMonitor"]["enabled"]


@pytest.mark.parametrize("name", VALUE_SETS)
def test_rules_hold(rendered: Rendered, name: str) -> None:
    docs = rendered.docs[name]
    values = load_values(name)
    problems = check_grpc_probes(docs) + check_non_root(docs)
    problems += check_no_secret_in_configmap(docs, _secret_values(values))
    problems += check_scaled_objects(docs, values["nats"]["namespace"])
    if values["trainer"]["worker"]["enabled"]:
        problems += check_trainer_gpu(docs, gpus=values["trainer"]["worker"]["gpus"])
        worker = named(docs, "Deployment", "trainer-worker")["spec"]["template"]["spec"]
        drain = values["trainer"]["worker"]["drainTimeoutSeconds"]
        assert worker["terminationGracePeriodSeconds"] >= drain + values["shutdownGraceSeconds"]
    assert problems == []


def test_hpa_for_stateless_services(rendered: Rendered) -> None:
    hpas = {h["spec"]["scaleTargetRef"]["name"] for h in kind(rendered.docs["production"], "HorizontalPodAutoscaler")}
    assert {f"{FULL}-{s}" for s in ("optimizer", "trace-store", "reward-judge", "society")} == hpas
    deployments = {d["metadata"]["name"]: d for d in kind(rendered.docs["production"], "Deployment")}
    assert all("replicas" not in deployments[h]["spec"] for h in hpas)


def test_setup_jobs_are_hooks(rendered: Rendered) -> None:
    jobs = {j["metadata"]["name"]: j for j in kind(rendered.docs["minimal"], "Job")}
    want = {f"{FULL}-{s}-migrate" for s in ("optimizer", "trace-store", "reward-judge", "society", "trainer")}
    assert want | {f"{FULL}-jetstream-setup"} == set(jobs)
    for job in jobs.values():
        assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    for name in want:
        assert jobs[name]["spec"]["template"]["spec"]["containers"][0]["args"] == ["migrate"]
    # The credentials the hooks read exist before them (hooks run before ordinary resources).
    secret = named(rendered.docs["minimal"], "Secret", "credentials")
    assert int(secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0


# -- the rules bite: renderings made wrong on purpose ------------------------------------------------


def test_gpu_rule_bites() -> None:
    assert check_trainer_gpu(render("gpu-keda"), gpus=4) == []
    no_gpu = render("gpu-keda", "--set", "trainer.worker.gpus=0")
    assert any("nvidia.com/gpu" in p for p in check_trainer_gpu(no_gpu, gpus=4))
    no_tolerations = render("gpu-keda", "--set-json", "trainer.worker.tolerations=[]")
    assert any("toleration" in p for p in check_trainer_gpu(no_tolerations, gpus=4))


def test_probe_rule_bites() -> None:
    docs = render("minimal")
    container = named(docs, "Deployment", "optimizer")["spec"]["template"]["spec"]["containers"][0]
    container["readinessProbe"] = {"tcpSocket": {"port": 50051}}
    assert check_grpc_probes(docs) == [
        f"{FULL}-optimizer/optimizer readinessProbe is not a gRPC health probe: {{'tcpSocket': {{'port': 50051}}}}"
    ]
    # With gRPC TLS the probes are exec'd health checks over TLS, and still pass the rule.
    assert check_grpc_probes(render("external-tls")) == []


def test_secret_rule_bites() -> None:
    # The schema refuses a credential among a service's plain settings...
    with pytest.raises(RenderError, match="auth_token"):
        render("minimal", "--set", "optimizer.config.auth_token=leaked-token")
    # ...and if it got past the schema, the rule catches it in the ConfigMap.
    docs = render("minimal", "--skip-schema-validation", "--set", "optimizer.config.auth_token=leaked-token")
    problems = check_no_secret_in_configmap(docs, ["leaked-token"])
    assert f"ConfigMap {FULL}-optimizer holds credential FLYWHEEL_OPTIMIZER_AUTH_TOKEN" in problems


def test_scaled_object_rule_bites() -> None:
    prod_ns = render("gpu-keda", "--set", "nats.namespace=prod")
    assert check_scaled_objects(prod_ns, "prod") == []
    wrong = check_scaled_objects(prod_ns, "flywheel")
    assert len(wrong) == 2 and "FLYWHEEL_TRAINING_JOBS/trainer-jobs" in " ".join(wrong)
    docs = render("gpu-keda")
    named(docs, "ScaledObject", "evaluator")["spec"]["triggers"][0]["metadata"]["consumer"] = "trainer-jobs"
    assert check_scaled_objects(docs, "flywheel") == [
        "evaluator: scales on FLYWHEEL_EVALUATIONS/trainer-jobs, "
        "subjects.py declares FLYWHEEL_EVALUATIONS/evaluator-requests"
    ]


def test_root_rule_bites() -> None:
    root = render("minimal", "--set", "securityContext.runAsUser=0", "--set", "securityContext.runAsNonRoot=false")
    problems = check_non_root(root)
    assert problems and all("root" in p for p in problems)
    writable = render("minimal", "--set", "securityContext.readOnlyRootFilesystem=false")
    assert any("writable" in p for p in check_non_root(writable))


def test_trainer_grace_shorter_than_drain_is_refused() -> None:
    with pytest.raises(RenderError, match="terminationGracePeriodSeconds"):
        render("gpu-keda", "--set", "trainer.worker.terminationGracePeriodSeconds=60")


# -- the values schema ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("flags", "field", "why"),
    [
        (["--set-string", "optimizer.grpcPort=fifty"], "/optimizer/grpcPort", "got string, want integer"),
        (["--set", "evaluator.replicas=-1"], "/evaluator/replicas", "minimum"),
        (["--set", "trainer.image.repository=null"], "/trainer/image", "missing property 'repository'"),
        (["--set", "keda.enabled=maybe"], "/keda/enabled", "want boolean"),
        (["--set", "image.pullPolicy=Sometimes"], "/image/pullPolicy", "value must be one of"),
        (["--set", "nats.url=nats://user:pw@nats:4222"], "/nats/url", "does not match pattern"),
        (["--set", "optimizer.replica=3"], "/optimizer", "additional properties 'replica' not allowed"),
    ],
)
def test_schema_refuses_bad_values(rendered: Rendered, flags: list[str], field: str, why: str) -> None:
    with pytest.raises(RenderError) as err:
        render("minimal", *flags)
    message = str(err.value)
    assert f"at '{field}'" in message and why in message, message


def test_missing_credentials_name_the_values() -> None:
    with pytest.raises(
        RenderError, match=r"FLYWHEEL_DB_URL needs a credential: set database.url or database.existingSecret"
    ):
        render("minimal", "--set", "database.url=")


# -- NATS users -------------------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "namespace"), [("minimal", "flywheel"), ("production", "prod")])
def test_nats_users_equal_role_permissions(rendered: Rendered, name: str, namespace: str) -> None:
    cm = named(rendered.docs[name], "ConfigMap", "nats-users")
    users = json.loads(cm["data"]["nats-users.json"])
    assert users == {"authorization": {"users": chart_users(namespace)}}
    assert {u["user"] for u in users["authorization"]["users"]} == {r for r, s in ROLES.items() if s.uses_bus}


def test_images_default_to_app_version_or_digest(rendered: Rendered) -> None:
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]

    def image(name: str, comp: str) -> str:
        return named(rendered.docs[name], "Deployment", comp)["spec"]["template"]["spec"]["containers"][0]["image"]

    assert image("minimal", "trace-store") == f"ghcr.io/flywheel/flywheel-trace-store:{app_version}"
    assert image("production", "society") == "registry.example.com/flywheel/flywheel-society:0.1.0"
    digest = load_values("production")["optimizer"]["image"]["digest"]
    assert image("production", "optimizer") == f"registry.example.com/flywheel/flywheel-optimizer@{digest}"
    assert image("gpu-keda", "trainer-worker") == image("gpu-keda", "trainer")
