"""Preset rubrics, shipped as package data (one YAML file each)."""
