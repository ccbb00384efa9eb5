"""``flywheel init``: ask a few questions and write a commented run config (optimization.yaml).

The YAML follows ``flywheel.optimizer.runconfig`` (see
services/optimizer/examples/capitals/optimization.yaml); values are written as JSON, which
is valid YAML, so prompts and URLs need no hand quoting.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from flywheel.api.ports import MODEL_SERVER_API_BASE

KINDS = ("llm", "http", "python")
# metric type -> the name it gets in the config, and whether it is quality (vs latency/cost)
METRICS = {
    "exact_match": ("accuracy", True),
    "similarity": ("similarity", True),
    "llm_judge": ("quality", True),
    "latency": ("latency_ms", False),
    "cost": ("cost_usd", False),
}
HTTP_BODY = {"input": "{{input}}", "system_prompt": "{{system_prompt}}", "temperature": "{{temperature}}"}
DEFAULT_MAX_TOKENS = (256,)
# What the evaluator may read a key from (run policy's default credential prefix).
KEY_ENV_EXAMPLE = "FLYWHEEL_TARGET_OPENAI_API_KEY"
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEFAULT_PROMPTS = ("You are a helpful assistant.", "Answer in as few words as possible.")
EXAMPLE_CASES = {
    "test_cases": [
        {"id": "capital-france", "input": "What is the capital of France?", "expected": "Paris"},
        {"id": "capital-japan", "input": "What is the capital of Japan?", "expected": "Tokyo"},
        {"id": "capital-italy", "input": "What is the capital of Italy?", "expected": "Rome"},
    ]
}


@dataclass
class InitAnswers:
    """What ``flywheel init`` asks; the defaults make a config for the local model server."""

    name: str = "my-api"
    kind: str = "llm"
    model: str = "openai/smollm2-135m-instruct"
    api_base: str = MODEL_SERVER_API_BASE  # `python -m flywheel.modelserver`'s default port
    key_env: str = ""  # the evaluator's variable holding the API key; empty: no key
    endpoint: str = ""
    callable: str = ""
    temperature: tuple[float, float] = (0.0, 1.0)
    max_tokens: list[int] = field(default_factory=lambda: list(DEFAULT_MAX_TOKENS))
    system_prompts: list[str] = field(default_factory=lambda: list(DEFAULT_PROMPTS))
    test_cases: str = "test_cases.json"
    metrics: list[str] = field(default_factory=lambda: ["exact_match", "latency"])
    population: int = 6
    generations: int = 4

    def check(self) -> None:
        """Raise ValueError naming the first answer the optimizer would refuse."""
        if not self.name.strip():
            raise ValueError("the API name must not be empty")
        if self.kind not in KINDS:
            raise ValueError(f"target kind {self.kind!r}: use one of {', '.join(KINDS)}")
        if self.kind == "llm" and not self.model:
            raise ValueError("an llm target needs a model (a LiteLLM name, e.g. openai/gpt-4o-mini)")
        if self.key_env and not _ENV_NAME.fullmatch(self.key_env):
            raise ValueError(f"{self.key_env!r} is not an environment variable name (e.g. {KEY_ENV_EXAMPLE})")
        if self.kind == "llm" and not self.api_base and not self.key_env:
            # a provider's own API refuses a call without a key; the local server takes none
            raise ValueError(
                "without an API base URL the provider's API needs a key: name the evaluator's environment "
                f"variable that holds it (e.g. {KEY_ENV_EXAMPLE})"
            )
        if self.kind == "llm" and (
            not self.max_tokens
            or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in self.max_tokens)
            or len(set(self.max_tokens)) != len(self.max_tokens)
        ):
            raise ValueError(f"max_tokens {self.max_tokens}: give one or more distinct whole numbers >= 1")
        if self.kind == "http" and not self.endpoint:
            raise ValueError("an http target needs an endpoint URL")
        if self.kind == "python" and ":" not in self.callable:
            raise ValueError("a python target needs a callable like package.module:function")
        low, high = self.temperature
        if not 0 <= low < high:
            raise ValueError(f"temperature range {low}..{high}: need 0 <= min < max")
        if not self.system_prompts:
            raise ValueError("give at least one system prompt")
        if len(set(self.system_prompts)) != len(self.system_prompts):
            raise ValueError("the system prompts have duplicates")
        unknown = [m for m in self.metrics if m not in METRICS]
        if unknown or not self.metrics:
            raise ValueError(f"metrics {unknown or '(none)'}: use some of {', '.join(METRICS)}")
        if self.population < 2 or self.generations < 1:
            raise ValueError("population must be at least 2 and generations at least 1")


def parse_range(text: str) -> tuple[float, float]:
    """``"0.0,1.0"`` or ``"0-1"`` -> (0.0, 1.0)."""
    parts = text.replace(" ", "").replace("..", ",").split(",")
    if len(parts) != 2 and text.count("-") == 1:
        parts = text.split("-")
    try:
        low, high = (float(p) for p in parts)
    except ValueError:
        raise ValueError(f"{text!r} is not a range MIN,MAX (e.g. 0.0,1.0)") from None
    return low, high


def parse_max_tokens(text: str) -> list[int]:
    """``"256"`` -> [256]; ``"64,256"`` -> [64, 256] (several values are searched)."""
    try:
        values = [int(p) for p in text.replace(" ", "").split(",") if p]
    except ValueError:
        raise ValueError(f"{text!r} is not a whole number or a list like 64,256") from None
    if not values or any(v < 1 for v in values) or len(set(values)) != len(values):
        raise ValueError(f"{text!r}: give one or more distinct whole numbers >= 1")
    return values


def metric_weights(metrics: list[str]) -> dict[str, tuple[str, float]]:
    """Quality metrics share 0.8 and latency/cost share 0.2 (all of 1.0 when one side is empty)."""
    quality = [m for m in metrics if METRICS[m][1]]
    other = [m for m in metrics if not METRICS[m][1]]
    q_share = 0.8 if other else 1.0
    o_share = 0.2 if quality else 1.0
    out: dict[str, tuple[str, float]] = {}
    for m in quality:
        out[METRICS[m][0]] = (m, round(q_share / len(quality), 4))
    for m in other:
        out[METRICS[m][0]] = (m, round(o_share / len(other), 4))
    return out


def _j(value: object) -> str:
    return json.dumps(value)


def render_config(a: InitAnswers) -> str:
    """The commented YAML for these answers."""
    a.check()
    lines = [
        "# Flywheel run config, written by `flywheel init`. Run it with: flywheel optimize <this file>",
        "# Schema: a superset of The Convergence's optimization.yaml (api, search_space, evaluation,",
        "# optimization, society); see services/optimizer/examples/capitals/optimization.yaml.",
        "api:",
        f"  name: {_j(a.name)}",
        f"  kind: {a.kind}",
    ]
    if a.kind == "llm":
        lines.append(f"  model: {_j(a.model)}   # a LiteLLM model name")
        if a.api_base:
            lines.append(f"  api_base: {_j(a.api_base)}   # any OpenAI-compatible server")
    elif a.kind == "http":
        lines += [
            f"  endpoint: {_j(a.endpoint)}",
            "  request:   # {{input}} is the test case's input; {{system_prompt}}, {{temperature}}: the parameters",
            "    method: POST",
            f"    body_template: {_j(HTTP_BODY)}",
            "  response:",
            '    path: "output"   # where the reply text is in the JSON reply, e.g. choices.0.message.content',
        ]
    else:
        lines.append(f"  callable: {_j(a.callable)}   # called with each test case and the parameters")
    if a.key_env:
        lines += [
            "  auth:   # the key is read on the evaluator from this variable (never written here)",
            "    type: bearer",
            f"    token_env: {_j(a.key_env)}",
        ]
    else:
        lines += [
            "  auth:   # none: the local model server takes no key (the evaluator sends a placeholder)",
            "    type: none   # bearer / api_key / basic: set token_env to the NAME of an env variable",
        ]
    lines += [
        "",
        "search_space:",
        "  parameters:",
        "    system_prompt:",
        "      choices:",
        *[f"        - {_j(p)}" for p in a.system_prompts],
        f"    temperature: {{type: float, min: {a.temperature[0]}, max: {a.temperature[1]}, step: 0.1}}",
    ]
    if a.kind == "llm":
        note = "searched" if len(a.max_tokens) > 1 else "fixed; list more values to search them"
        lines.append(f"    max_tokens: {{type: discrete, values: {_j(a.max_tokens)}}}   # {note}")
    lines += [
        "    # more: {type: discrete, values: [...]}, {type: continuous, min, max, step, log: true},",
        "    # or a list of choices",
        "",
        "evaluation:",
        "  test_cases:",
        f'    path: {_j(a.test_cases)}   # JSON list, {{"test_cases": [...]}} or JSONL; relative to this file',
        "  metrics:   # weights are normalised to sum to 1",
    ]
    for name, (kind, weight) in metric_weights(a.metrics).items():
        note = "   # lower is better" if kind in ("latency", "cost") else ""
        lines.append(f"    {name}: {{type: {kind}, weight: {weight}}}{note}")
    lines += [
        "",
        "optimization:",
        "  algorithm: mab_evolution   # Thompson sampling + evolution; or genetic, mab_only, random",
        "  seed: 0",
        "  evolution:",
        f"    population: {a.population}",
        f"    generations: {a.generations}",
        "    mutation: 0.3",
        "    crossover: 0.7",
        "    elite: 1",
        "  racing:   # score candidates on growing subsets of cases; drop the clearly worse early",
        "    min_cases: 4",
        "    growth: 2.0",
        "    confidence: 0.9",
        "  early_stopping:",
        "    enabled: true",
        "    patience: 2",
        "    min_improvement: 0.01",
        "  execution:",
        "    parallel_workers: 2",
        "    timeout_s: 30",
        "",
        "society:",
        "  enabled: false",
        "",
    ]
    return "\n".join(lines)


def ask_answers(ask: Callable[[str], str] | None = None, echo: Callable[[str], None] = print) -> InitAnswers:
    """Ask each question (``input`` by default); an empty answer takes the default in brackets."""
    ask = ask or input  # looked up now, so a replaced builtins.input is used
    d = InitAnswers()

    def q(prompt: str, default: str) -> str:
        reply = ask(f"{prompt} [{default}]: " if default else f"{prompt}: ").strip()
        return reply or default

    def until_valid(read: Callable[[], object]) -> object:
        while True:
            try:
                return read()
            except ValueError as exc:
                echo(f"  {exc}")

    a = InitAnswers(name=q("API name", d.name))
    a.kind = str(until_valid(lambda: _kind(q("Target kind (llm, http, python)", d.kind))))
    if a.kind == "llm":
        a.model = q("Model (LiteLLM name)", d.model)
        a.api_base = q("API base URL (empty for the provider's default)", d.api_base)
        a.key_env = str(
            until_valid(
                lambda: _key_env(
                    q(
                        "Environment variable with the API key, on the evaluator (empty: no key)",
                        "" if a.api_base else KEY_ENV_EXAMPLE,
                    ),
                    needed=not a.api_base,
                )
            )
        )
    elif a.kind == "http":
        a.endpoint = str(until_valid(lambda: _required(q("Endpoint URL", ""), "an endpoint URL")))
        a.api_base = ""
    else:
        a.callable = str(until_valid(lambda: _callable(q("Callable (package.module:function)", ""))))
        a.api_base = ""
    a.temperature = until_valid(lambda: _temperature(q("Temperature range MIN,MAX", "0.0,1.0")))  # type: ignore[assignment]
    if a.kind == "llm":
        default_tokens = ",".join(str(n) for n in d.max_tokens)
        a.max_tokens = until_valid(  # type: ignore[assignment]
            lambda: parse_max_tokens(q("max_tokens (one value, or several to search, e.g. 64,256)", default_tokens))
        )
    echo("System prompts to try, one per line; an empty line ends (none: use the defaults).")
    prompts: list[str] = []
    while line := ask(f"  prompt {len(prompts) + 1}: ").strip():
        if line not in prompts:
            prompts.append(line)
    a.system_prompts = prompts or list(DEFAULT_PROMPTS)
    a.test_cases = q("Test cases file (JSON or JSONL)", d.test_cases)
    a.metrics = until_valid(lambda: _metrics(q(f"Metrics ({', '.join(METRICS)})", ",".join(d.metrics))))  # type: ignore[assignment]
    return a


def _kind(text: str) -> str:
    if text not in KINDS:
        raise ValueError(f"{text!r}: use one of {', '.join(KINDS)}")
    return text


def _required(text: str, what: str) -> str:
    if not text:
        raise ValueError(f"give {what}")
    return text


def _key_env(text: str, *, needed: bool) -> str:
    if not text and needed:
        raise ValueError(f"the provider's API needs a key: give the variable's name (e.g. {KEY_ENV_EXAMPLE})")
    if text and not _ENV_NAME.fullmatch(text):
        raise ValueError(f"{text!r} is not an environment variable name")
    return text


def _callable(text: str) -> str:
    if ":" not in text:
        raise ValueError(f"{text!r}: write it as package.module:function")
    return text


def _temperature(text: str) -> tuple[float, float]:
    low, high = parse_range(text)
    if not 0 <= low < high:
        raise ValueError(f"need 0 <= MIN < MAX, got {low},{high}")
    return low, high


def _metrics(text: str) -> list[str]:
    names = [m.strip() for m in text.split(",") if m.strip()]
    unknown = [m for m in names if m not in METRICS]
    if unknown or not names:
        raise ValueError(f"{', '.join(unknown) or '(none)'}: use some of {', '.join(METRICS)}")
    return names


def write_example_cases(path: Path) -> None:
    """A three-case example test-case file to edit (never overwrites)."""
    with path.open("x") as f:
        f.write(json.dumps(EXAMPLE_CASES, indent=2) + "\n")
