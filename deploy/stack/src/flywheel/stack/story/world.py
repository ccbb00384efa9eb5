"""The story's world: a support assistant for a fictional note-taking app (Nimbus Notes).

``support_cases.json`` holds its test cases (customer questions with short expected answers,
so token-F1 similarity means something); ``run_config`` is the batch run that tunes the
assistant's config on them (system prompt x temperature x max_tokens, scored by similarity and
latency) with the society on; ``prepare_stack`` sets, before ``stack.up()``, every variable the
story needs on the stack's service processes: the evaluator's key for the model server, the
society's reasoning and policy model (the model server's base model), and the reward judge."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from flywheel.stack.servers import ModelServer
from flywheel.stack.stack import Stack
from flywheel.stack.story.context import StoryContext

CASES_FILE = Path(__file__).with_name("support_cases.json")
# The evaluator reads the model server's key from this variable (the FLYWHEEL_TARGET_ prefix
# is the one a run may name as its credential, see flywheel.core.run_policy).
KEY_VAR = "FLYWHEEL_TARGET_STORY_MODEL_KEY"

SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are Nimbus Notes support. Answer in one short sentence.",
    "You answer customer questions about the Nimbus Notes app. Be brief and exact.",
    "Reply with the answer only, no greeting.",
)
TEMPERATURES = (0.0, 0.3, 0.7, 1.0)
MAX_TOKENS = (16, 32)  # short answers: an evaluation is one short completion on 2 CPU cores
TINY = "tiny-random"  # the model server's served name of its tiny random base


@cache
def _all_cases() -> tuple[dict[str, Any], ...]:
    return tuple(json.loads(CASES_FILE.read_text())["test_cases"])


def load_cases(n: int) -> list[dict[str, Any]]:
    """The first ``n`` support cases (``id``, ``input``, ``expected``), s01 first."""
    cases = _all_cases()
    if not 1 <= n <= len(cases):
        raise ValueError(f"test_cases: must be between 1 and {len(cases)}, got {n}")
    return [dict(c) for c in cases[:n]]


def served_model_name(model: ModelServer) -> str:
    """The model server's base model as /v1/models lists it first (what ``openai/<name>`` calls)."""
    import httpx

    got = httpx.get(f"{model.url}/models", headers={"Authorization": f"Bearer {model.api_key}"}, timeout=10)
    got.raise_for_status()
    return got.json()["data"][0]["id"]


def thought_length(ctx: StoryContext) -> int:
    """Tokens for RLP's thoughts answer: room for two short JSON thoughts on SmolLM2; the tiny
    random model writes gibberish whatever its room, so it gets little (its steps fail as
    ``no_prediction``, which the story records)."""
    return 48 if ctx.served_model == TINY else 256


def run_config(ctx: StoryContext) -> dict[str, Any]:
    """The batch run of stage 1: the support assistant (an llm target on the local model
    server) over ``ctx.sizes.test_cases`` cases, with RLP proposals from the society."""
    sizes = ctx.sizes
    return {
        "api": {
            "name": ctx.endpoint,
            "description": "Nimbus Notes support answers from the local model server",
            "kind": "llm",
            "model": f"openai/{ctx.served_model}",
            "api_base": ctx.model.url,
            "auth": {"type": "bearer", "token_env": KEY_VAR},
        },
        "search_space": {
            "parameters": {
                "system_prompt": {"choices": list(SYSTEM_PROMPTS)},
                "temperature": {"type": "discrete", "values": list(TEMPERATURES)},
                "max_tokens": {"type": "discrete", "values": list(MAX_TOKENS)},
            }
        },
        "evaluation": {
            "test_cases": {"inline": load_cases(sizes.test_cases)},
            "metrics": {
                "similarity": {"type": "similarity", "weight": 0.8},
                "latency_ms": {"weight": 0.2, "threshold": 4000},  # 0 at 4 s
            },
        },
        "optimization": {
            "algorithm": "mab_evolution",
            "seed": sizes.seed,
            "evolution": {"population": sizes.population, "generations": sizes.generations, "elite": 1},
            "racing": {"min_cases": min(2, sizes.test_cases)},
            # No warm start from earlier runs on the same space: every telling starts alike
            # (the kill drill compares its counts with an undisturbed run's).
            "warm_start": {"enabled": False},
            # The model server generates one request at a time, shared with the society's
            # calls: a generous timeout, so waiting in its queue is not a failure.
            "execution": {"parallel_workers": 2, "timeout_s": 150, "max_retries": 1},
        },
        "society": {
            "enabled": True,
            "proposals_per_generation": 1,
            "learning": {
                "rlp_enabled": True,
                "rlp": {"num_thoughts": 2, "proposals_per_thought": 1, "thought_length": thought_length(ctx)},
            },
        },
    }


def judge_env(model: ModelServer) -> dict[str, str]:
    """The reward judge's settings for the story. SmolLM2-135M cannot judge reliably, so, as
    bench/sao ranks with the judge's heuristic, the judge's LLM is a model the server does not
    serve: each LLM judgement fails at once (404, not retried, one attempt) and the judge's
    built-in heuristic answers, marked ``fallback_used``. Embeddings stay off (no MiniLM load
    on 2 cores; a rank without a reference never uses them)."""
    return {
        "FLYWHEEL_REWARD_JUDGE_LLM_MODEL": "openai/no-llm-judge-heuristic-fallback",
        "FLYWHEEL_REWARD_JUDGE_LLM_API_BASE": model.url,
        "FLYWHEEL_REWARD_JUDGE_LLM_API_KEY": model.api_key,
        "FLYWHEEL_REWARD_JUDGE_LLM_ATTEMPTS": "1",
        "FLYWHEEL_REWARD_JUDGE_LLM_BACKOFF_S": "0",
        "FLYWHEEL_REWARD_JUDGE_EMBEDDINGS": "false",
    }


def society_env(model: ModelServer, served: str) -> dict[str, str]:
    """The society's models: RLP's reasoning model and SAO's policy model are the model
    server's base model (through LiteLLM), and the model server scores RLP's log-probabilities."""
    return {
        "FLYWHEEL_LLM_MODEL": f"openai/{served}",
        "FLYWHEEL_LLM_API_BASE": model.url,
        "FLYWHEEL_LLM_API_KEY": model.api_key,
        "FLYWHEEL_LLM_TIMEOUT_S": "120",
        # No LiteLLM retries: the one local generation slot would run a timed-out request
        # again (twice, up to 4 more minutes) while the batch run's evaluations wait behind it.
        "FLYWHEEL_LLM_MAX_RETRIES": "0",
        "FLYWHEEL_SOCIETY_MODELSERVER_URL": model.url,
        "FLYWHEEL_SOCIETY_MODELSERVER_API_KEY": model.api_key,
    }


def prepare_stack(stack: Stack, model: ModelServer, served: str | None = None) -> None:
    """Set every variable the story needs on ``stack``'s service processes; call it after
    ``model.start()`` and before ``stack.up()`` (a process reads its env when it starts, and a
    restarted one reads the same). ``served`` is the model server's base model name (asked
    of the server when not given)."""
    served = served or served_model_name(model)
    wanted = {
        "evaluator": {KEY_VAR: model.api_key},
        "society": society_env(model, served),
        "reward_judge": judge_env(model),
    }
    for service, env in wanted.items():
        if service not in stack.services:
            raise ValueError(f"services: the story needs {service!r}; the stack has {sorted(stack.services)}")
        stack.services[service].env.update(env)
