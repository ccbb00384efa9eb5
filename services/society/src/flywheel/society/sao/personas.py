"""Personas: attribute bundles sampled with a seed (role, expertise, goal, age, place, style),
each written up as a persona by the model itself, deduplicated.

The seeded attributes make the set reproducible and diverse (the paper's point: personas
are what keeps prompts from repeating); the model's own wording keeps it self-synthetic.
When the model's answer is unusable (empty, failed, too short, or a near-duplicate of a
persona already written) the attribute bundle's own sentence stands in, and that is counted."""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass

from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.filters import NearDuplicateIndex, text_key
from flywheel.society.sao.llm import Llm, ask

ROLES = (
    "software engineer", "nurse", "high-school teacher", "farmer", "accountant", "graphic designer",
    "civil engineer", "journalist", "pharmacist", "chef", "lawyer", "electrician", "data analyst",
    "librarian", "small-business owner", "university student", "retired pilot", "social worker",
    "marine biologist", "truck driver", "musician", "real-estate agent", "game developer",
    "museum curator", "paramedic", "translator", "product manager", "carpenter", "historian",
    "fitness coach", "veterinarian", "urban planner",
)  # fmt: skip
EXPERTISE = ("a complete beginner", "self-taught", "experienced", "a recognised expert")
GOALS = (
    "save time at work", "learn a new skill", "make a hard decision", "fix a problem that keeps coming back",
    "explain something to others", "plan a trip", "start a side project", "understand a news story",
    "improve their health", "manage their money", "write something persuasive", "prepare for an exam",
    "settle a disagreement", "automate a chore",
)  # fmt: skip
AGES = (17, 21, 26, 31, 38, 44, 52, 59, 66, 74)
PLACES = (
    "Lagos", "São Paulo", "Osaka", "Nairobi", "Berlin", "Toronto", "Mumbai", "Mexico City", "Jakarta",
    "Cairo", "Melbourne", "Warsaw", "Manila", "Lima", "Istanbul", "Dublin", "Seoul", "Casablanca",
    "rural Montana", "a village in Vietnam", "Glasgow", "Reykjavik",
)  # fmt: skip
STYLES = ("terse", "chatty", "formal", "sceptical", "anxious", "playful", "very precise", "impatient")
_AXES = (ROLES, EXPERTISE, GOALS, AGES, PLACES, STYLES)


@dataclass(frozen=True)
class Persona:
    persona_id: str
    description: str
    attributes: dict[str, object]
    from_model: bool  # False: the model's wording was unusable and the attribute sentence stands in


def space_size() -> int:
    n = 1
    for axis in _AXES:
        n *= len(axis)
    return n


def attributes(index: int) -> dict[str, object]:
    """The attribute bundle at ``index`` of the product space (mixed-radix digits)."""
    out = []
    for axis in _AXES:
        index, digit = divmod(index, len(axis))
        out.append(axis[digit])
    return dict(zip(("role", "expertise", "goal", "age", "place", "style"), out, strict=True))


def sentence(a: dict[str, object]) -> str:
    return (
        f"A {a['age']}-year-old {a['role']} from {a['place']}, {a['expertise']} in their field, who wants to"
        f" {a['goal']} and writes in a {a['style']} way."
    )


def sample(n: int, seed: int, round_index: int = 0) -> list[dict[str, object]]:
    """``n`` distinct bundles; the same (seed, round) gives the same bundles."""
    if n > space_size():
        raise ValueError(f"n_personas {n}: at most {space_size()} distinct personas can be composed")
    rng = random.Random(f"sao-personas:{seed}:{round_index}")  # noqa: S311 - reproducible sampling
    return [attributes(i) for i in rng.sample(range(space_size()), n)]


_PREFIX = re.compile(r"^\s*(persona|description)\s*[:\-]\s*", re.I)


def clean(text: str) -> str:
    """The first non-empty line, without a 'Persona:' label or quotes, at most 400 characters."""
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    line = _PREFIX.sub("", line).strip().strip('"“”').strip()
    return line[:400]


def _usable(text: str) -> bool:
    return len(text.split()) >= 6 and sum(c.isalpha() for c in text) >= 20


def persona_messages(a: dict[str, object]) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": (
                "Describe the following person in one or two sentences, in the third person, adding a concrete"
                f" detail of your own: {sentence(a)}\nAnswer with the description only."
            ),
        }
    ]


async def generate_personas(
    llm: Llm, config: SaoConfig, *, round_index: int = 0, similarity_threshold: float | None = None
) -> list[Persona]:
    """``config.n_personas`` distinct personas written by the model (``batch_size`` calls at
    once), in the seeded order of their attribute bundles."""
    bundles = sample(config.n_personas, config.seed, round_index)
    gate = asyncio.Semaphore(config.batch_size)

    async def write(a: dict[str, object]) -> str:
        async with gate:
            got = await ask(
                llm,
                persona_messages(a),
                temperature=0.7,
                max_tokens=config.max_persona_tokens,
                timeout_s=config.llm_timeout_s,
            )
        return clean(got.text) if not got.failure else ""

    texts = await asyncio.gather(*(write(a) for a in bundles))
    index = NearDuplicateIndex(
        similarity_threshold or config.similarity_threshold,
        permutations=config.minhash_permutations,
        shingle_words=config.shingle_words,
    )
    seen: set[str] = set()
    out = []
    for i, (a, text) in enumerate(zip(bundles, texts, strict=True)):
        from_model = _usable(text) and text_key(text) not in seen and index.add_if_new(text)
        description = text if from_model else sentence(a)
        seen.add(text_key(description))
        out.append(Persona(f"r{round_index}-p{i}", description, a, from_model))
    return out
