"""A scripted fake policy model and reward judge for the SAO unit tests.

The model answers by what it is asked: personas, prompts (``PROMPTS`` in order, cycling),
responses (one good and one bad per prompt), rankings (the good one, unless the prompt is
scripted to get prose, nothing, or a timeout). The judge prefers ``[good]``, except on
prompts scripted to be position-biased (the first listed always wins)."""

from __future__ import annotations

import asyncio
import re
from collections import Counter

GOOD_TAIL = " This answer is careful, complete and explains each step clearly. [good]"
BAD_TAIL = " Not sure, maybe look it up somewhere else. It depends on many things. [bad]"


class FakeLlm:
    def __init__(
        self,
        prompts: list[str],
        *,
        ranking: dict[str, str] | None = None,
        short: set[str] = frozenset(),
        same: set[str] = frozenset(),
    ) -> None:
        self.prompts = prompts
        self.ranking = ranking or {}  # prompt -> "prose" | "empty" | "timeout" | "wrong" | "error"
        self.short = short
        self.same = same
        self.calls: Counter[str] = Counter()
        self.temperatures: dict[str, set[float]] = {}
        self._next_prompt = 0
        self._responses: Counter[str] = Counter()

    async def complete(self, messages, *, temperature, max_tokens):
        text = messages[-1]["content"]
        if text.startswith("Describe the following person"):
            kind = "persona"
        elif text.startswith("Persona:"):
            kind = "prompt"
        elif text.startswith("Compare two responses"):
            kind = "ranking"
        else:
            kind = "response"
        self.calls[kind] += 1
        self.temperatures.setdefault(kind, set()).add(temperature)
        if kind == "persona":
            person = text.split(": ", 1)[1].split("\n")[0]
            return f"Persona: {person} They keep a notebook of every question they ask."
        if kind == "prompt":
            p = self.prompts[self._next_prompt % len(self.prompts)]
            self._next_prompt += 1
            return f'Prompt: "{p}"'
        if kind == "response":
            prompt = text
            if prompt in self.same:
                return "The same answer every time, long enough to pass the length filter easily."
            self._responses[prompt] += 1
            if prompt in self.short:
                return "ok" if self._responses[prompt] % 2 else "no"
            good = self._responses[prompt] % 2 == 1
            return f"About {prompt[:30]}:" + (GOOD_TAIL if good else BAD_TAIL)
        prompt = re.search(r"\[Prompt\]\n(.*?)\n\n\[Response A\]", text, re.S).group(1)
        mode = self.ranking.get(prompt, "ok")
        if mode == "timeout":
            await asyncio.sleep(10)
        if mode == "error":
            raise RuntimeError("provider said 500")
        if mode == "empty":
            return "   "
        if mode == "prose":
            return "I think the first response is better because it is more detailed."
        a = text.split("[Response A]\n", 1)[1].split("\n\n[Response B]")[0]
        better = "A" if "[good]" in a else "B"
        if mode == "wrong":
            better = "B" if better == "A" else "A"
        other = "B" if better == "A" else "A"
        return f"Response {better} is more complete and clearer.\n**Ranking**: {better} > {other}"


class FakeJudge:
    def __init__(self, *, biased: set[str] = frozenset(), tie: set[str] = frozenset(), down: bool = False) -> None:
        self.biased = biased
        self.tie = tie
        self.down = down
        self.calls: list[tuple[str, list[str]]] = []

    async def rank(self, prompt, responses, rubric=""):
        self.calls.append((prompt, list(responses)))
        if self.down:
            raise ConnectionError("judge unreachable")
        if prompt in self.biased:
            return [0.9, 0.2]
        if prompt in self.tie:
            return [0.5, 0.5]
        return [0.9 if "[good]" in r else 0.1 for r in responses]
