"""Flywheel trainer: reward models and policies (DPO, GRPO, RLOO, KTO, SFT with LoRA) and the policy registry."""
