"""SAO's self-ranking as JSON: a model that takes ``response_format`` is asked for
``{"ranking": "A > B" | "B > A"}`` under a JSON schema with that enum, the JSON answer is
parsed, plain-text answers still are, and a provider refusing the format is a counted drop."""

from __future__ import annotations

import json

import pytest

from flywheel.society.sao import SaoConfig, run_round
from flywheel.society.sao.judge import RANKING_FORMAT, parse_ranking, ranking_messages, self_rank
from flywheel.society.sao.llm import LiteLlm, structured_output
from flywheel.society.settings import SocietySettings

from .sao_fakes import FakeJudge, FakeLlm

PROMPTS = [
    "How do I keep a sourdough starter alive while I travel for two weeks?",
    "Which index should my invoices table have for monthly reports?",
    "Explain inflation to a twelve-year-old using pocket money.",
    "How should I plan a cheap three-day trip to Lisbon in April?",
]
GOOD = "Keep it in the fridge and feed it once before you leave; it sleeps for weeks. [good]"
BAD = "Not sure, maybe look it up somewhere else. It depends on many things. [bad]"


class JsonRanker(FakeLlm):
    """The scripted fake model, behind a server that enforces ``response_format``: a ranking
    request with the schema is answered with the JSON the schema allows."""

    structured_output = True

    def __init__(self, *args, refuse: bool = False, **kw) -> None:
        super().__init__(*args, **kw)
        self.formats: list[dict | None] = []
        self.refuse = refuse

    async def complete(self, messages, *, temperature, max_tokens, response_format=None):
        self.formats.append(response_format)
        if response_format is None:
            return await super().complete(messages, temperature=temperature, max_tokens=max_tokens)
        if self.refuse:
            raise RuntimeError("BadRequestError: this model does not support response_format")
        assert response_format == RANKING_FORMAT
        text = messages[-1]["content"]
        assert text.startswith("Compare two responses") and text.endswith(
            '{"ranking": "B > A"} when response B is better.'
        )
        a = text.split("[Response A]\n", 1)[1].split("\n\n[Response B]")[0]
        return json.dumps({"ranking": "A > B" if "[good]" in a else "B > A"})


@pytest.mark.parametrize(
    ("text", "winner"),
    [
        ('{"ranking": "A > B"}', "A"),
        ('{"ranking":"B > A"}', "B"),
        ('```json\n{"ranking": "B>A"}\n```', "B"),
        (' {"ranking": "Response A > Response B"} ', "A"),
    ],
)
def test_json_rankings_are_parsed(text, winner):
    assert parse_ranking(text) == winner


@pytest.mark.parametrize("text", ['{"ranking": "A > A"}', '{"ranking": "first"}', '{"other": "A > B"}', "{broken"])
def test_json_without_a_ranking_is_not_one(text):
    assert parse_ranking(text) is None


def test_the_schema_allows_exactly_the_two_rankings():
    schema = RANKING_FORMAT["json_schema"]["schema"]
    assert RANKING_FORMAT["type"] == "json_schema"
    assert schema["required"] == ["ranking"] and schema["additionalProperties"] is False
    assert schema["properties"]["ranking"]["enum"] == ["A > B", "B > A"]
    # The request's opening (how bench/sao recognises a ranking request) does not change.
    plain, structured = ranking_messages("p", "a", "b"), ranking_messages("p", "a", "b", structured=True)
    assert plain[0]["content"].split("[Prompt]")[0] == structured[0]["content"].split("[Prompt]")[0]
    assert "ranking: X > Y" in plain[0]["content"] and "JSON only" in structured[0]["content"]


async def test_a_structured_model_gets_the_schema_and_its_json_is_parsed():
    llm = JsonRanker(PROMPTS)
    got = await self_rank(llm, "How?", BAD, GOOD, SaoConfig())
    assert got.winner == "B" and got.failure == ""
    assert llm.formats == [RANKING_FORMAT]
    got = await self_rank(llm, "How?", GOOD, BAD, SaoConfig())
    assert got.winner == "A"


async def test_a_plain_model_gets_no_schema_and_its_text_is_parsed():
    llm = FakeLlm(PROMPTS)  # complete() takes no response_format: passing one would raise
    assert not structured_output(llm)
    got = await self_rank(llm, PROMPTS[0], GOOD, BAD, SaoConfig())
    assert got.winner == "A" and got.failure == ""


async def test_a_provider_refusing_the_format_is_a_counted_failure():
    llm = JsonRanker(PROMPTS, refuse=True)
    got = await self_rank(llm, "How?", GOOD, BAD, SaoConfig())
    assert got.winner is None and got.failure == "llm_rejected_response_format"


async def test_a_round_with_json_rankings_keeps_the_agreed_pairs():
    llm = JsonRanker(PROMPTS)
    config = SaoConfig(n_personas=4, batch_size=4, min_response_length=40, llm_timeout_s=2, seed=3)
    result = await run_round(config, llm=llm, judge=FakeJudge(), iteration=1)
    s = result.stats
    assert s.self_ranked == 4 and s.kept == 4 and s.dropped_total == 0, s.dropped
    assert sum(f == RANKING_FORMAT for f in llm.formats) == 4  # only the rankings carry it


class FakeClient:
    def __init__(self) -> None:
        self.kwargs: list[dict] = []

    async def complete(self, messages, **kwargs):
        self.kwargs.append(kwargs)
        return type("Completion", (), {"text": '{"ranking": "A > B"}'})()


async def test_litellm_passes_the_format_only_when_asked():
    client = FakeClient()
    llm = LiteLlm(client, structured_output=True)
    assert structured_output(llm) and not structured_output(LiteLlm(client))
    messages = [{"role": "user", "content": "x"}]
    await llm.complete(messages, temperature=0.0, max_tokens=8)
    await llm.complete(messages, temperature=0.0, max_tokens=8, response_format=RANKING_FORMAT)
    assert client.kwargs[0] == {"temperature": 0.0, "max_tokens": 8}
    assert client.kwargs[1] == {
        "temperature": 0.0,
        "max_tokens": 8,
        "response_format": RANKING_FORMAT,
        "drop_params": True,
    }


def test_the_setting_defaults_on_and_names_its_variable():
    assert SocietySettings.model_fields["sao_structured_output"].default is True
    assert SocietySettings.env_var("sao_structured_output") == "FLYWHEEL_SOCIETY_SAO_STRUCTURED_OUTPUT"
