"""Flywheel stack: run the infrastructure servers (NATS, PostgreSQL, S3) locally."""
