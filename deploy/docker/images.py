"""The Flywheel images and the `docker build` command of each (`task images` prints them).

One recipe, deploy/docker/service.Dockerfile, builds every image; this table says which target
and build arguments each one takes. Repository names and the default tag match the Helm chart
(helm/flywheel/values.yaml: ``<service>.image.repository``, tag = the chart's appVersion).

    python deploy/docker/images.py [--registry REG] [--tag TAG] [--platform linux/amd64] [--push]
"""

from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = "deploy/docker/service.Dockerfile"
CHART = ROOT / "helm" / "flywheel" / "Chart.yaml"
DEFAULT_REGISTRY = "ghcr.io/flywheel"


@dataclass(frozen=True)
class Image:
    """One image: the folder it installs, the Dockerfile target and its build arguments."""

    name: str  # the service folder (services/<name>) or "modelserver" (deploy/modelserver)
    repository: str
    target: str
    gpu: bool = False
    build_args: dict[str, str] = field(default_factory=dict)


IMAGES: tuple[Image, ...] = (
    Image("optimizer", "flywheel-optimizer", "service", build_args={"SERVICE": "optimizer", "GRPC_PORT": "50051"}),
    Image("evaluator", "flywheel-evaluator", "service", build_args={"SERVICE": "evaluator", "GRPC_PORT": "50052"}),
    Image(
        "reward_judge", "flywheel-reward-judge", "service", build_args={"SERVICE": "reward_judge", "GRPC_PORT": "50053"}
    ),
    Image(
        "trace_store", "flywheel-trace-store", "service", build_args={"SERVICE": "trace_store", "GRPC_PORT": "50054"}
    ),
    Image("society", "flywheel-society", "service", build_args={"SERVICE": "society", "GRPC_PORT": "50055"}),
    # torch's CUDA build from PyTorch's wheel index (uv's torch backend), pinned like the trainer.
    Image("trainer", "flywheel-trainer", "trainer", gpu=True, build_args={"TORCH_BACKEND": "cu128"}),
    Image("modelserver", "flywheel-modelserver", "modelserver", gpu=True, build_args={"TORCH_BACKEND": "cu128"}),
)


def chart_app_version(chart: Path = CHART) -> str:
    """The chart's appVersion: the tag the chart deploys when values give none."""
    if chart.is_file():
        match = re.search(r'^appVersion:\s*"?([^"\s]+)"?\s*$', chart.read_text(), re.MULTILINE)
        if match:
            return match.group(1)
    return "0.1.0"


def build_command(image: Image, *, registry: str, tag: str, platform: str = "", push: bool = False) -> list[str]:
    """The `docker build` argv for one image, run from the repository root (the context)."""
    argv = ["docker", "build", "-f", DOCKERFILE, "--target", image.target]
    if platform:
        argv += ["--platform", platform]
    for key, value in image.build_args.items():
        argv += ["--build-arg", f"{key}={value}"]
    ref = f"{registry.rstrip('/')}/{image.repository}:{tag}" if registry else f"{image.repository}:{tag}"
    argv += ["-t", ref]
    if push:
        argv.append("--push")
    argv.append(".")
    return argv


def main(argv: list[str] | None = None) -> None:
    """Print one `docker build` line per image (nothing is built here)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--registry", default=DEFAULT_REGISTRY, help=f"default {DEFAULT_REGISTRY}")
    parser.add_argument("--tag", default=chart_app_version(), help="default: the chart's appVersion")
    parser.add_argument("--platform", default="", help="e.g. linux/amd64 (docker buildx)")
    parser.add_argument("--push", action="store_true", help="add --push (docker buildx)")
    args = parser.parse_args(argv)
    print("# from the repository root; the GPU images (trainer, modelserver) are several GB")
    for image in IMAGES:
        argv = build_command(image, registry=args.registry, tag=args.tag, platform=args.platform, push=args.push)
        print(shlex.join(argv))


if __name__ == "__main__":
    main()
