# One image recipe for every Flywheel service. The build context is the repository root,
# because libs/ are shared:
#   docker build -f deploy/docker/service.Dockerfile --build-arg SERVICE=optimizer --build-arg GRPC_PORT=50051 -t flywheel-optimizer .
# SERVICE is the folder under services/ (optimizer, trace_store, evaluator, reward_judge,
# society, trainer). EXTRAS names optional extras of that service, e.g. the trainer's GPU
# stack once it defines one (--build-arg EXTRAS=gpu); empty installs the base service.

# Builder: wheels of the two libraries and the service, without dependencies; the runtime
# stage resolves those from the index, taking flywheel-* from these wheels.
FROM python:3.11-slim AS builder
ARG SERVICE
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY libs/api libs/api
COPY libs/core libs/core
COPY services/${SERVICE} services/${SERVICE}
RUN test -n "${SERVICE}" && pip wheel --no-deps --wheel-dir /wheels libs/api libs/core services/${SERVICE}

# Runtime: the installed wheels, run as a non-root user.
FROM python:3.11-slim
ARG SERVICE
ARG EXTRAS=""
ARG GRPC_PORT=50051
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    FLYWHEEL_SERVICE_MODULE=flywheel.${SERVICE}
COPY --from=builder /wheels /wheels
RUN service_wheel="$(ls /wheels/flywheel_"${SERVICE}"-*.whl)" \
 && pip install /wheels/flywheel_api-*.whl /wheels/flywheel_core-*.whl "${service_wheel}${EXTRAS:+[${EXTRAS}]}" \
 && useradd --create-home --uid 10001 --user-group flywheel
USER 10001:10001
WORKDIR /home/flywheel
# gRPC, and Prometheus /metrics (the settings default)
EXPOSE ${GRPC_PORT} 9090
ENTRYPOINT ["/bin/sh", "-c", "exec python -m \"$FLYWHEEL_SERVICE_MODULE\" \"$@\"", "--"]
CMD ["serve"]
