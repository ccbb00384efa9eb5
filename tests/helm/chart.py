"""Rendering helm/flywheel with the real helm binary, and the rules every rendering must keep.

Each ``check_*`` function takes the rendered documents and returns a list of problems (empty:
the rule holds). The tests run them on the four values sets in helm/flywheel/ci/ and, to prove
that each one bites, on renderings made deliberately wrong.
"""

from __future__ import annotations

import base64
import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

from flywheel.api.subjects import Catalogue

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "flywheel"
VALUES_DIR = CHART / "ci"
VALUE_SETS = ("minimal", "production", "gpu-keda", "external-tls")
RELEASE = "fw"
FULL = f"{RELEASE}-flywheel"

# Deployment name suffix -> Python module (python -m flywheel.<module>).
MODULES = {
    "optimizer": "optimizer",
    "evaluator": "evaluator",
    "trace-store": "trace_store",
    "reward-judge": "reward_judge",
    "society": "society",
    "trainer": "trainer",
    "trainer-worker": "trainer",
}
# ScaledObject target -> the JetStream consumer it must scale on.
SCALED_CONSUMERS = {"trainer-worker": "trainer-jobs", "evaluator": "evaluator-requests"}

# Env names that carry credentials: never in a ConfigMap.
SECRET_ENV = re.compile(r"(PASSWORD|TOKEN|SECRET|API_KEY|ACCESS_KEY|DB_URL)$")


def helm_binary() -> str | None:
    """helm from setup.sh (.tools/bin), else $HELM or PATH."""
    local = ROOT / ".tools" / "bin" / "helm"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    return os.environ.get("HELM") or shutil.which("helm")


def values_file(name: str) -> Path:
    return VALUES_DIR / f"{name}-values.yaml"


def load_values(name: str) -> dict[str, Any]:
    """The chart's defaults overlaid with one values set (deep merge, as helm does)."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        out = dict(base)
        for k, v in over.items():
            out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
        return out

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    return merge(defaults, yaml.safe_load(values_file(name).read_text()) or {})


def helm(*args: str) -> subprocess.CompletedProcess[str]:
    binary = helm_binary()
    assert binary, "helm is not installed (bash scripts/setup.sh extracts it into .tools/bin)"
    return subprocess.run([binary, *args], capture_output=True, text=True, timeout=60, check=False)


def render(values: str | None, *extra: str) -> list[dict[str, Any]]:
    """``helm template`` with one values set (and extra flags such as --set); the documents."""
    args = ["template", RELEASE, str(CHART)]
    if values:
        args += ["-f", str(values_file(values))]
    proc = helm(*args, *extra)
    if proc.returncode != 0:
        raise RenderError(proc.stderr.strip())
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


class RenderError(Exception):
    """helm refused to render (schema or a template's fail): the message names the field."""


def kind(docs: Iterable[dict[str, Any]], k: str) -> list[dict[str, Any]]:
    return [d for d in docs if d.get("kind") == k]


def named(docs: Iterable[dict[str, Any]], k: str, suffix: str) -> dict[str, Any]:
    for d in kind(docs, k):
        if d["metadata"]["name"] == f"{FULL}-{suffix}":
            return d
    raise KeyError(f"no {k} {FULL}-{suffix}")


def component(doc: dict[str, Any]) -> str:
    return doc["metadata"]["name"].removeprefix(f"{FULL}-")


def pod_specs(docs: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(kind/name, pod spec) of every Deployment and Job."""
    return [
        (f"{d['kind']}/{d['metadata']['name']}", d["spec"]["template"]["spec"])
        for d in docs
        if d["kind"] in ("Deployment", "Job")
    ]


# -- rules ------------------------------------------------------------------------------------------


def check_trainer_gpu(docs: list[dict[str, Any]], *, gpus: int) -> list[str]:
    """The trainer workers ask for (and are limited to) their GPUs and tolerate GPU nodes' taint."""
    worker = named(docs, "Deployment", "trainer-worker")
    spec = worker["spec"]["template"]["spec"]
    res = spec["containers"][0].get("resources", {})
    problems = []
    for part in ("requests", "limits"):
        got = res.get(part, {}).get("nvidia.com/gpu")
        if got is None or int(got) != gpus:
            problems.append(f"trainer-worker resources.{part}['nvidia.com/gpu'] is {got!r}, want {gpus}")
    if not any(t.get("key") == "nvidia.com/gpu" for t in spec.get("tolerations") or []):
        problems.append("trainer-worker has no toleration for the nvidia.com/gpu taint")
    if not spec.get("nodeSelector") and not spec.get("affinity"):
        problems.append("trainer-worker has neither nodeSelector nor affinity for GPU nodes")
    if not any(v.get("emptyDir", {}).get("medium") == "Memory" for v in spec.get("volumes", [])):
        problems.append("trainer-worker has no shared-memory (emptyDir medium Memory) volume")
    return problems


def _is_grpc_health(probe: dict[str, Any] | None) -> bool:
    if not probe:
        return False
    if "grpc" in probe:
        return True
    # With gRPC TLS (kubelet's gRPC probe cannot speak it), the same standard health Check
    # from inside the container.
    cmd = " ".join(probe.get("exec", {}).get("command", []))
    return "grpc_health.v1" in cmd and "HealthStub" in cmd and "ssl_channel_credentials" in cmd


def check_grpc_probes(docs: list[dict[str, Any]]) -> list[str]:
    """Every gRPC service container has startup, readiness and liveness probes on gRPC health."""
    problems = []
    for d in kind(docs, "Deployment"):
        if component(d) not in MODULES:
            continue
        for c in d["spec"]["template"]["spec"]["containers"]:
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                if not _is_grpc_health(c.get(probe)):
                    problems.append(
                        f"{d['metadata']['name']}/{c['name']} {probe} is not a gRPC health probe: {c.get(probe)}"
                    )
    return problems


def check_no_secret_in_configmap(docs: list[dict[str, Any]], secret_values: Iterable[str] = ()) -> list[str]:
    """No ConfigMap holds a credential: by name, or by value (any secret the values file gives)."""
    problems = []
    needles = [s for s in secret_values if s and len(s) >= 6]
    for cm in kind(docs, "ConfigMap"):
        for key, value in (cm.get("data") or {}).items():
            if SECRET_ENV.search(key):
                problems.append(f"ConfigMap {cm['metadata']['name']} holds credential {key}")
            for needle in needles:
                if needle in str(value):
                    problems.append(f"ConfigMap {cm['metadata']['name']} key {key} holds a secret value")
    return problems


def check_scaled_objects(docs: list[dict[str, Any]], namespace: str) -> list[str]:
    """Each ScaledObject scales its Deployment on the stream and consumer flywheel.api.subjects declares."""
    cat = Catalogue(namespace)
    problems = []
    for so in kind(docs, "ScaledObject"):
        target = so["spec"]["scaleTargetRef"]["name"].removeprefix(f"{FULL}-")
        durable = SCALED_CONSUMERS.get(target)
        if durable is None:
            problems.append(f"ScaledObject for unexpected target {target}")
            continue
        want = cat.consumer(durable)
        for trig in so["spec"]["triggers"]:
            meta = trig["metadata"]
            if trig["type"] != "nats-jetstream":
                problems.append(f"{target}: trigger type {trig['type']}, want nats-jetstream")
            if meta.get("stream") != want.stream or meta.get("consumer") != want.durable:
                problems.append(
                    f"{target}: scales on {meta.get('stream')}/{meta.get('consumer')}, "
                    f"subjects.py declares {want.stream}/{want.durable}"
                )
    return problems


def check_non_root(docs: list[dict[str, Any]]) -> list[str]:
    """Every pod and container: non-root, read-only root, no escalation, no capabilities, seccomp."""
    problems = []
    for name, spec in pod_specs(docs):
        psc = spec.get("securityContext") or {}
        if psc.get("runAsNonRoot") is not True or psc.get("runAsUser") == 0:
            problems.append(f"{name}: pod may run as root ({psc})")
        for c in spec["containers"]:
            sc = c.get("securityContext") or {}
            where = f"{name}/{c['name']}"
            if sc.get("runAsNonRoot") is False or sc.get("runAsUser") == 0 or sc.get("privileged"):
                problems.append(f"{where}: container runs as root or privileged ({sc})")
            if sc.get("readOnlyRootFilesystem") is not True:
                problems.append(f"{where}: root filesystem is writable")
            if sc.get("allowPrivilegeEscalation") is not False:
                problems.append(f"{where}: privilege escalation allowed")
            if "ALL" not in (sc.get("capabilities") or {}).get("drop", []):
                problems.append(f"{where}: capabilities not dropped")
            seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            if seccomp != "RuntimeDefault":
                problems.append(f"{where}: seccomp profile {seccomp!r}")
    return problems


# -- environment resolution -------------------------------------------------------------------------


def secret_data(docs: list[dict[str, Any]], existing: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Secret name -> key -> value: the rendered Secrets plus the ones a platform team made."""
    out = {name: dict(data) for name, data in existing.items()}
    for s in kind(docs, "Secret"):
        data = {k: base64.b64decode(v).decode() for k, v in (s.get("data") or {}).items()}
        data.update(s.get("stringData") or {})
        out[s["metadata"]["name"]] = data
    return out


def container_env(
    docs: list[dict[str, Any]], container: dict[str, Any], secrets: dict[str, dict[str, str]], *, pod_name: str
) -> dict[str, str]:
    """A container's environment as the kubelet builds it: envFrom first, then env (which wins)."""
    configmaps = {c["metadata"]["name"]: c.get("data") or {} for c in kind(docs, "ConfigMap")}
    env: dict[str, str] = {}
    for src in container.get("envFrom", []):
        if "configMapRef" in src:
            env.update(configmaps[src["configMapRef"]["name"]])
        elif "secretRef" in src:
            env.update(secrets[src["secretRef"]["name"]])
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
            continue
        ref = e["valueFrom"]
        if "secretKeyRef" in ref:
            r = ref["secretKeyRef"]
            env[e["name"]] = secrets[r["name"]][r["key"]]
        elif "configMapKeyRef" in ref:
            r = ref["configMapKeyRef"]
            env[e["name"]] = configmaps[r["name"]][r["key"]]
        elif "fieldRef" in ref:
            env[e["name"]] = {"metadata.name": pod_name}[ref["fieldRef"]["fieldPath"]]
        else:
            raise AssertionError(f"unsupported env source {ref}")
    return env


def materialise_mounts(
    spec: dict[str, Any], container: dict[str, Any], secrets: dict[str, dict[str, str]], root: Path
) -> dict[str, Path]:
    """Write the Secret volumes a container mounts under ``root``; mount path -> local folder
    (so paths in its environment can point at real files, as they do in the pod)."""
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts: dict[str, Path] = {}
    for m in container.get("volumeMounts", []):
        vol = volumes[m["name"]]
        local = root / m["name"]
        local.mkdir(parents=True, exist_ok=True)
        if "secret" in vol:
            for key, value in secrets[vol["secret"]["secretName"]].items():
                (local / key).write_text(value)
        mounts[m["mountPath"]] = local
    return mounts


def relocate(env: dict[str, str], mounts: dict[str, Path]) -> dict[str, str]:
    """Env values under a mount path, pointed at its local copy."""
    out = {}
    for k, v in env.items():
        for mount, local in mounts.items():
            if v == mount or v.startswith(mount + "/"):
                v = str(local) + v[len(mount) :]
                break
        out[k] = v
    return out
