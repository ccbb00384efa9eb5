"""Shared fixtures for every test folder: real servers from flywheel.stack."""

pytest_plugins = ["flywheel.stack.testing"]
