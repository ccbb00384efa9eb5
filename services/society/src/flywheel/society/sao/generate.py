"""The policy model writes one prompt per persona ("guess a prompt this persona may ask")
and two responses per prompt at the configured temperature."""

from __future__ import annotations

import re

from flywheel.society.sao.config import SaoConfig
from flywheel.society.sao.llm import Answer, Llm, ask

_LABEL = re.compile(r"^\s*(prompt|question|request|user)\s*[:\-]\s*", re.I)


def prompt_messages(persona: str) -> list[dict[str, str]]:
    return [
        {
            "role": "user",
            "content": (
                f"Persona: {persona}\n\nGuess a prompt (a question or a task) that this persona may ask an AI"
                " assistant, written in their voice. Answer with the prompt only."
            ),
        }
    ]


def clean_prompt(text: str) -> str:
    """The model's prompt without a 'Prompt:' label or surrounding quotes."""
    text = _LABEL.sub("", text.strip()).strip()
    if len(text) >= 2 and text[0] in "\"'“" and text[-1] in "\"'”":
        text = text[1:-1].strip()
    return text


async def write_prompt(llm: Llm, persona: str, config: SaoConfig) -> Answer:
    got = await ask(
        llm,
        prompt_messages(persona),
        temperature=config.temperature,
        max_tokens=config.max_prompt_tokens,
        timeout_s=config.llm_timeout_s,
    )
    if got.failure:
        return got
    text = clean_prompt(got.text)
    return Answer(text=text) if text else Answer(failure="llm_empty")


async def respond(llm: Llm, prompt: str, config: SaoConfig) -> Answer:
    return await ask(
        llm,
        [{"role": "user", "content": prompt}],
        temperature=config.temperature,
        max_tokens=config.max_response_tokens,
        timeout_s=config.llm_timeout_s,
    )
