"""The agent workload's client side: the attribution line, the reply kept, the next user message."""

from __future__ import annotations

import random
import re

import agent


def _delta(index: int, **delta: str) -> dict:
    return {"type": "content_block_delta", "index": index, "delta": delta}


def _start(index: int, block: dict) -> dict:
    return {"type": "content_block_start", "index": index, "content_block": block}


class TestBillingLine:
    def test_claude_code_shape(self) -> None:
        """Both servers' normalisation expects five hex digits and a ';' after cch=."""
        line = agent.billing_line(random.Random(1))
        assert re.fullmatch(
            r"x-anthropic-billing-header: cc_version=[\w.]+; cc_entrypoint=cli; cch=[0-9a-f]{5};", line
        )

    def test_a_fresh_hash_every_request(self) -> None:
        rng = random.Random(1)
        assert len({agent.billing_line(rng) for _ in range(20)}) > 1


class TestReplyBlocks:
    def test_text_and_a_tool_use_rebuilt_in_order(self) -> None:
        events = [
            {"type": "message_start", "message": {"usage": {}}},
            _start(0, {"type": "text", "text": ""}),
            _delta(0, type="text_delta", text="Let me "),
            _delta(0, type="text_delta", text="look."),
            {"type": "content_block_stop", "index": 0},
            _start(1, {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}),
            _delta(1, type="input_json_delta", partial_json='{"file_path": '),
            _delta(1, type="input_json_delta", partial_json='"/src/a.py"}'),
            {"type": "content_block_stop", "index": 1},
        ]
        assert agent.reply_blocks(events) == [
            {"type": "text", "text": "Let me look."},
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {"file_path": "/src/a.py"}},
        ]

    def test_a_tool_use_whose_input_does_not_parse_is_dropped(self) -> None:
        """A reply cut off by max_tokens inside a call: the client cannot run it."""
        events = [
            _start(0, {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}}),
            _delta(0, type="input_json_delta", partial_json='{"file_pa'),
        ]
        assert agent.reply_blocks(events) == [{"type": "text", "text": ""}]

    def test_thinking_is_kept(self) -> None:
        events = [
            _start(0, {"type": "thinking", "thinking": "", "signature": ""}),
            _delta(0, type="thinking_delta", thinking="Hmm."),
            _delta(0, type="signature_delta", signature=""),
        ]
        assert agent.reply_blocks(events) == [{"type": "thinking", "thinking": "Hmm.", "signature": ""}]


class TestUserContent:
    def test_every_tool_use_gets_a_result_before_the_text(self) -> None:
        """The first result carries what the tool showed; the attachment is not pasted again."""
        reply = [
            {"type": "tool_use", "id": "toolu_1", "name": "Read", "input": {}},
            {"type": "tool_use", "id": "toolu_2", "name": "Grep", "input": {}},
        ]
        content = agent.user_content([{"role": "assistant", "content": reply}], "And now?", "file text")
        assert content == [
            {"type": "tool_result", "tool_use_id": "toolu_1", "content": "file text"},
            {"type": "tool_result", "tool_use_id": "toolu_2", "content": "Done."},
            {"type": "text", "text": "And now?"},
        ]

    def test_without_a_tool_use_the_attachment_is_pasted(self) -> None:
        reply = [{"type": "text", "text": "Sure."}]
        content = agent.user_content([{"role": "assistant", "content": reply}], "Look:", "x = 1\n")
        assert content == [{"type": "text", "text": "Look:\n\n```\nx = 1\n```"}]

    def test_the_first_message(self) -> None:
        assert agent.user_content([], "Hello.", "") == [{"type": "text", "text": "Hello."}]


class TestTurn:
    def test_the_read_rate_counts_only_the_tokens_evaluated(self) -> None:
        """3,000 prompt tokens, 1,000 of them cached, first token after 4 s: 500 evaluated per second."""
        turn = agent.Turn(ttft_s=4.0, prompt_tokens=3_000, cached_tokens=1_000)
        assert turn.read_tok_s() == 500.0
