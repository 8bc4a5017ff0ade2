"""Prompt preparation: volatile stamps are made constant before tokenising."""

from __future__ import annotations

from bubo.domain.messages import ChatPrompt, Message
from bubo.service.prompt import stable_prompt

HEADER = "x-anthropic-billing-header: cc_version=2.1.37.a1b; cc_entrypoint=cli; cch={};\nYou are Claude Code."
STABLE = "x-anthropic-billing-header: -\nYou are Claude Code."


def system(text: str) -> ChatPrompt:
    return ChatPrompt(messages=(Message(role="system", content=text), Message(role="user", content="cch=7")))


def test_billing_stamps_of_two_turns_render_alike() -> None:
    first = stable_prompt(system(HEADER.format("4f2a1")))
    second = stable_prompt(system(HEADER.format("9c07e")))
    assert first == second
    assert first.messages[0].content == STABLE


def test_the_whole_line_is_constant() -> None:
    """Another version or entry point (the CLI, the SDK, a newer release) renders the same line."""
    sdk = "x-anthropic-billing-header: cc_version=2.1.328.1b8; cc_entrypoint=sdk-cli;\nYou are Claude Code."
    assert stable_prompt(system(sdk)) == stable_prompt(system(HEADER.format("abc")))


def test_only_the_line_changes() -> None:
    """Other system text and user turns stay as they were."""
    prompt = system(HEADER.format("abc") + "\nLine with cch=abc; outside the header.")
    stable = stable_prompt(prompt)
    assert stable.messages[0].content == STABLE + "\nLine with cch=abc; outside the header."
    assert stable.messages[1] == prompt.messages[1]


def test_prompts_without_a_stamp_are_untouched() -> None:
    prompt = system("You are a helpful assistant.")
    assert stable_prompt(prompt) is prompt
