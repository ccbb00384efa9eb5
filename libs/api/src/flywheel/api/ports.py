"""Default ports the parts of Flywheel share, one constant each, so that a server's default,
the CLI's defaults and the README agree (``flywheel init`` writes the model server's URL)."""

# The local OpenAI-compatible model server (``python -m flywheel.modelserver``).
MODEL_SERVER_PORT = 8000
MODEL_SERVER_API_BASE = f"http://127.0.0.1:{MODEL_SERVER_PORT}/v1"

# The trainer's gRPC port (training jobs and the policy registry; ``flywheel train``,
# ``flywheel policies``).
TRAINER_GRPC_PORT = 50056
