"""How often the reasoning model's RLP answer is usable, with and without the thoughts' JSON
schema as ``response_format``: the society's own prompt (``build_context``) for a small search
space, sent N times each way through the society's ``LlmThinker`` (LiteLLM) to a local model
server started in process. Prints parse rate (``parse_thoughts`` ok), valid-proposal rate
(parsed proposals inside the space) and seconds per call, as JSON.

    HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 LITELLM_LOCAL_MODEL_COST_MAP=True \\
      .venv/bin/python services/society/scripts/rlp_structured_bench.py --model smollm2 -n 10 --threads 1
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from types import SimpleNamespace
from typing import Any

from aiohttp.test_utils import TestServer

from flywheel.core.llm import LlmSettings
from flywheel.modelserver.app import build_app
from flywheel.modelserver.engine import Engine
from flywheel.modelserver.loading import load_base
from flywheel.society.rlp.context import build_context
from flywheel.society.rlp.propose import read_space, validate_params
from flywheel.society.rlp.schema import thoughts_response_format
from flywheel.society.rlp.service import LlmThinker
from flywheel.society.rlp.thoughts import parse_thoughts

SPACE = {"temperature": {"type": "float", "min": 0.0, "max": 1.0, "step": 0.1}, "max_tokens": [128, 256, 512]}
HISTORY = [
    {"params": {"temperature": 0.2, "max_tokens": 256}, "score": 0.61},
    {"params": {"temperature": 0.7, "max_tokens": 512}, "score": 0.55},
    {"params": {"temperature": 0.5, "max_tokens": 128}, "score": 0.48},
    {"params": {"temperature": 1.0, "max_tokens": 256}, "score": 0.32},
]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    # One thread: on a shared 2-core machine, two threads wait on each other (3-5x slower).
    torch.set_num_threads(args.threads)
    base = load_base(args.model, device="cpu")
    engine = Engine(base, {}, max_tokens_cap=max(512, args.thought_length))
    messages, _ = build_context(
        history=HISTORY, search_space=SPACE, n_thoughts=args.thoughts, proposals_per_thought=args.proposals
    )
    fmt = thoughts_response_format(
        SPACE,
        n_thoughts=args.thoughts,
        proposals_per_thought=args.proposals,
        thought_length=args.thought_length,
        scores=[h["score"] for h in HISTORY],
    )
    specs = read_space(SPACE)
    out: dict[str, Any] = {**vars(args), "model": base.name}
    async with TestServer(build_app(engine)) as server:
        llm = LlmSettings(model=f"openai/{base.name}", api_base=str(server.make_url("/v1")), api_key="x", timeout_s=900)
        think = LlmThinker(SimpleNamespace(llm=llm))  # type: ignore[arg-type]  # it reads .llm only
        await think.warm()
        for label, response_format in (("schema", fmt), ("no_schema", None)):
            parsed_ok, proposals, valid, seconds, sample = 0, 0, 0, [], ""
            for i in range(args.n):
                started = time.perf_counter()
                text = await think(
                    messages,
                    model=llm.model,
                    temperature=args.temperature,
                    max_tokens=args.thought_length,
                    response_format=response_format,
                )
                seconds.append(time.perf_counter() - started)
                sample = sample or text[:400]
                result = parse_thoughts(text, min_thoughts=2, max_thoughts=args.thoughts)
                parsed_ok += result.ok
                for thought in result.thoughts if result.ok else []:
                    for p in thought.proposals:
                        proposals += 1
                        valid += validate_params(p.params, specs)[0] is not None
                print(label, i, round(seconds[-1], 1), result.ok, result.failure, flush=True)
            out[label] = {
                "parse_rate": parsed_ok / args.n,
                "proposals_parsed": proposals,
                "valid_proposal_rate": valid / proposals if proposals else 0.0,
                "valid_proposals_per_call": valid / args.n,
                "seconds_per_call_mean": round(statistics.mean(seconds), 1),
                "seconds_per_call_max": round(max(seconds), 1),
                "sample": sample,
            }
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("-n", type=int, default=10)
    parser.add_argument("--thoughts", type=int, default=2)
    parser.add_argument("--proposals", type=int, default=1)
    parser.add_argument("--thought-length", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    print(json.dumps(asyncio.run(main(parser.parse_args())), indent=2))
