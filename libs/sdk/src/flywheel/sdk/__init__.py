"""What a product imports to use Flywheel: choose a config per request, report feedback."""

from flywheel.sdk.client import Decision, FlywheelClient

__all__ = ["Decision", "FlywheelClient"]
