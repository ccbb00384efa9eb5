"""Flywheel evaluator: runs configs on test cases against LLMs, HTTP endpoints or Python functions."""
