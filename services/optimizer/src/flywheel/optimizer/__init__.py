"""Flywheel optimizer: endpoints and arms, Thompson-sampling selection, feedback."""
