"""The ``society:`` block of a run config, as The Convergence names it::

    society:
      enabled: true
      learning:
        rlp_enabled: true        # think before proposing (RLP)
        sao_enabled: true        # synthetic preference pairs (SAO)
        sao_every: 3             # an SAO round every N generations (The Convergence: 3)
        rlp: {num_thoughts: 4, temperature: 0.7, buffer_size: 10000, gamma: 0.99, ...}  # RLPConfig
        sao: {n_personas: 100, temperature: 0.6, similarity_threshold: 0.9, ...}        # SAOConfig
      llm:
        model: openai/smollm2    # one of FLYWHEEL_SOCIETY_MODELS / FLYWHEEL_LLM_MODEL

RLPConfig and SAOConfig fields may also sit directly under ``learning`` (each goes to the one
that has it; ``temperature`` there is RLP's). The key and base URL of the model always come
from the society's settings: ``llm.api_key_env`` and ``llm.api_base`` in a run are ignored
with a warning, so a run config cannot choose which secret the society sends, or where."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from flywheel.society.rlp.config import RLPConfig
from flywheel.society.sao.config import SaoConfig

_OUTER = {"enabled", "auto_generate_agents", "proposals_per_generation", "learning", "collaboration", "llm"}
_OUTER |= {"storage", "weave"}
_LEARNING = {"rlp_enabled", "sao_enabled", "sao_every", "rlp", "sao"}
_IGNORED_LLM = ("api_key_env", "api_base", "api_key", "base_url")


class RunSocietyError(ValueError):
    """The run's society block is not usable; the message names the field."""


class RunSociety(BaseModel):
    """What the society does for one run."""

    model_config = ConfigDict(frozen=True)

    enabled: bool = False
    rlp_enabled: bool = False
    sao_enabled: bool = False
    sao_every: int = Field(3, ge=1)
    proposals_per_generation: int = Field(1, ge=0)  # bench/rlp: 1 costs fewer evaluations than 2
    rlp: RLPConfig = Field(default_factory=RLPConfig)
    sao: SaoConfig = Field(default_factory=SaoConfig)
    # The model the run asked for ("" = the society's default); checked against the allow-list
    # by :func:`choose_model`.
    model: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def rlp_active(self) -> bool:
        return self.enabled and self.rlp_enabled

    @property
    def sao_active(self) -> bool:
        return self.enabled and self.sao_enabled


def parse_run_society(run_config: dict[str, Any]) -> RunSociety:
    """Read the ``society`` block of a run config (JSON types); RunSocietyError names the bad field."""
    block = run_config.get("society") or {}
    if not isinstance(block, dict):
        raise RunSocietyError("society: must be a mapping")
    warnings = [f"society.{k}: not read by the society" for k in sorted(set(block) - _OUTER)]
    learning = block.get("learning") or {}
    if not isinstance(learning, dict):
        raise RunSocietyError("society.learning: must be a mapping")
    rlp_fields: dict[str, Any] = dict(learning.get("rlp") or {})
    sao_fields: dict[str, Any] = dict(learning.get("sao") or {})
    for key, value in learning.items():
        if key in _LEARNING:
            continue
        if key in RLPConfig.model_fields:
            rlp_fields.setdefault(key, value)
        elif key in SaoConfig.model_fields:
            sao_fields.setdefault(key, value)
        else:
            raise RunSocietyError(f"society.learning.{key}: not an RLPConfig or SAOConfig field")
    rlp_fields.setdefault("rlp_enabled", bool(learning.get("rlp_enabled", False)))
    if "buffer_size" in rlp_fields:
        warnings.append(
            "society.learning.rlp.buffer_size: not read per run; the experience buffer is shared by the runs "
            "of a search space and sized by the society (FLYWHEEL_SOCIETY_BUFFER_SIZE)"
        )
    llm = block.get("llm") or {}
    if not isinstance(llm, dict):
        raise RunSocietyError("society.llm: must be a mapping")
    for key in _IGNORED_LLM:
        if key in llm:
            warnings.append(
                f"society.llm.{key}: ignored; the society's model key and URL come from its own settings "
                "(FLYWHEEL_LLM_API_KEY, FLYWHEEL_LLM_API_BASE)"
            )
    try:
        rlp = RLPConfig(**rlp_fields)
    except ValidationError as exc:
        raise RunSocietyError(_first("society.learning.rlp", exc)) from None
    try:
        sao = SaoConfig(**sao_fields)
    except ValidationError as exc:
        raise RunSocietyError(_first("society.learning.sao", exc)) from None
    try:
        return RunSociety(
            enabled=bool(block.get("enabled", False)),
            rlp_enabled=bool(learning.get("rlp_enabled", False)),
            sao_enabled=bool(learning.get("sao_enabled", False)),
            sao_every=int(learning.get("sao_every", 3)),
            proposals_per_generation=int(block.get("proposals_per_generation", 1)),
            rlp=rlp,
            sao=sao,
            model=str(llm.get("model", "") or ""),
            warnings=tuple(warnings),
        )
    except (ValidationError, TypeError, ValueError) as exc:
        raise RunSocietyError(f"society: {exc}") from None


def choose_model(requested: str, allowed: list[str], *, setting: str = "FLYWHEEL_SOCIETY_MODELS") -> str:
    """The model to call: ``requested`` when the operator allows it, the default (first
    allowed) when nothing is requested; RunSocietyError otherwise."""
    if not requested:
        return allowed[0]
    if requested in allowed:
        return requested
    raise RunSocietyError(f"society.llm.model {requested!r} is not one of the models this society may call ({setting})")


def _first(prefix: str, exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    return f"{prefix}.{where}: {err['msg']}"
