"""Test tools of the reward judge (a scripted OpenAI-compatible server)."""
