"""Flywheel trace store: traces, decisions and feedback in; queries and datasets out."""
