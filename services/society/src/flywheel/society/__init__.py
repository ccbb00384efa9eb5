"""Flywheel society: RLP (reasoning rewarded by information gain) and SAO (self-synthetic preference pairs)."""
