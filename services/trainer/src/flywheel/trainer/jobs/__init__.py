"""Training jobs: stored in PostgreSQL, queued on the TRAINING_JOBS work queue, run one at a
time per replica (kept alive with in-progress acks), checkpointed to S3 and resumed from there
after a crash, then evaluated, registered and, when the job names an endpoint, enrolled as a
canary arm."""
