"""Flywheel reward judge: rubrics, LLM-as-judge, heuristic fallback, aggregation, learned rewards."""
