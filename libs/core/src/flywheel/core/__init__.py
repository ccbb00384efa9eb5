"""Shared core of every Flywheel service: settings, logging, lifecycle, health, bus, db,
objects, llm and metrics. Services compose these; nothing here knows a service's domain."""
