"""An agent's requests as Claude Code sends them, over Anthropic ``/v1/messages``, and the scenarios on them.

A request's ``system`` is a list of text blocks, as Claude Code sends it: first
the attribution line ``x-anthropic-billing-header: cc_version=…;
cc_entrypoint=cli; cch=…;`` with a fresh five-digit hex ``cch`` on every
request (both servers write over that hash before rendering), then ~2,000
tokens of instructions that open with the session's nonce (so no server's cache
holds one session's prefix from another round or scenario) and carry
``cache_control``.  Twelve tool definitions (``fixtures/agent_tools.json``,
~1,100 tokens) follow in every request; ``metadata`` names the session.  Each
turn is streamed at temperature 0 and the reply goes back into the
conversation as the client received it (text blocks, tool-use blocks whose
input parsed), with a tool result for every tool use and the next scripted
user message: what an agent loop does.  Between a reply and the next request
the client waits ``CLIENT_TURN_GAP_S``, as an agent running its tools does.

Time to first token is the time to the first event of generated output: a
``text_delta``, a ``thinking_delta``, or a ``tool_use`` block opening.
"""

from __future__ import annotations

import concurrent.futures
import json
import random
import statistics
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
import httpx
import scenarios

FIXTURES = Path(__file__).resolve().parent / "fixtures"
MESSAGES = "/v1/messages"
HEADERS = {"anthropic-version": "2023-06-01", "anthropic-beta": "claude-code-20250219"}
CC_VERSION = "2.1.101.e51"
SYSTEM_TOKENS = 2_000  # the instructions after the attribution line, in the model's tokens
REPLY_TOKENS = 16  # each turn's longest reply: its first token is what is timed
SUB_AGENTS = 3
RESTART_PAUSE_S = 1.0  # between the last turn and the restart: anything written after a turn lands

INTRO = (
    "You are a coding agent working in session {session}, in a terminal beside the user. You help "
    "with software engineering: reading code, finding bugs, changing files and running commands "
    "through the tools you are given. Be brief: answer in a few lines unless asked for more, and "
    "never invent file contents you have not read. Before changing a file, read it. Keep the "
    "project's style and never add comments that only repeat the code. When a task has several "
    "steps, track them with TodoWrite. Run the project's tests after a change and report what "
    "failed, exactly. Never commit unless the user asks you to.\n\n# Project notes\n\n"
)

# The user's side of an agent session: what each turn says, and what a tool would have
# returned (the reply's tool uses each get a result; the text follows as the user's message).
INVENTORY = (FIXTURES / "inventory.py").read_text()
TURNS: tuple[tuple[str, str], ...] = (
    ("The inventory tests fail since this morning. Find out why.", ""),
    ("Here is inventory.py. What does total_value return for an empty inventory?", INVENTORY),
    (
        "The failing test says: AssertionError: assert 0.0 == 0 in test_empty_total. Which line is wrong?",
        (
            "FAILED tests/test_inventory.py::test_empty_total - AssertionError: assert 0.0 == 0\n"
            "FAILED tests/test_inventory.py::test_remove_missing - KeyError: 'bolt'\n"
            "2 failed, 14 passed in 0.31s\n"
        ),
    ),
    ("Fix remove_item so that removing a missing item raises a ValueError instead.", ""),
    ("Now add a docstring to remove_item, one line.", INVENTORY[: len(INVENTORY) // 2]),
    ("Run the tests again and summarise what changed, in two sentences.", "16 passed in 0.29s\n"),
)
MAIN_TASK = "Plan the refactoring of the inventory module into smaller modules; list the steps only."
SUB_TASKS = (
    "Find every caller of Inventory.add_item in the project and list the files.",
    "Find every test that touches total_value and say what each checks.",
    "Find where the inventory is saved to disk and describe the file format.",
)


def billing_line(rng: random.Random) -> str:
    """Claude Code's attribution line: its ``cch`` is a fresh five-digit hex hash on every request."""
    stamp = f"{rng.getrandbits(20):05x}"
    return f"x-anthropic-billing-header: cc_version={CC_VERSION}; cc_entrypoint=cli; cch={stamp};"


@attrs.frozen
class AgentPrompt:
    """What every request of every session repeats: the instructions and the tools."""

    instructions: str  # with a {session} field, filled per session
    tools: tuple[dict, ...]


def agent_prompt(count_tokens: Callable[[str], int]) -> AgentPrompt:
    """The instructions sized to ``SYSTEM_TOKENS`` of the model's tokens, and the twelve tools."""
    intro_tokens = count_tokens(INTRO.replace("{session}", uuid.uuid4().hex))
    notes = scenarios.prose_of_tokens(SYSTEM_TOKENS - intro_tokens, count_tokens, seed=7)
    tools = tuple(json.loads((FIXTURES / "agent_tools.json").read_text()))
    return AgentPrompt(instructions=INTRO + notes, tools=tools)


@attrs.frozen
class Turn:
    """One request of a session as the client saw it."""

    ttft_s: float
    prompt_tokens: int  # the whole prompt, cached or not
    cached_tokens: int  # of which the server read from its cache

    def read_tok_s(self) -> float:
        """The prompt tokens the server evaluated per second of the TTFT: comparable where prompts differ."""
        return (self.prompt_tokens - self.cached_tokens) / self.ttft_s


@attrs.define
class Session:
    """One agent conversation: its nonce, its history, and the requests that extend it."""

    prompt: AgentPrompt
    session: str = attrs.Factory(lambda: uuid.uuid4().hex)
    messages: list[dict] = attrs.Factory(list)
    rng: random.Random = attrs.Factory(random.Random)

    def body(self, max_tokens: int) -> dict:
        return {
            "model": "bubo",
            "max_tokens": max_tokens,
            "temperature": 0,
            "system": [
                {"type": "text", "text": billing_line(self.rng)},
                {
                    "type": "text",
                    "text": self.prompt.instructions.replace("{session}", self.session),
                    "cache_control": {"type": "ephemeral"},
                },
            ],
            "tools": list(self.prompt.tools),
            "messages": self.messages,
            "metadata": {"user_id": f"user_bench_account__session_{self.session}"},
        }

    def ask(
        self, client: httpx.Client, text: str, attachment: str = "", max_tokens: int = REPLY_TOKENS
    ) -> Turn:
        """Send the next user message (answering the last reply's tool uses), stream the reply, keep it."""
        self.messages.append({"role": "user", "content": user_content(self.messages, text, attachment)})
        result = scenarios.stream(client, MESSAGES, self.body(max_tokens), headers=HEADERS)
        self.messages.append({"role": "assistant", "content": reply_blocks(result.events)})
        usage = result.final.get("start_usage") or result.final.get("usage") or {}
        cached = int(usage.get("cache_read_input_tokens") or 0)
        return Turn(
            ttft_s=result.ttft_s,
            prompt_tokens=int(usage.get("input_tokens") or 0) + cached,
            cached_tokens=cached,
        )


def user_content(messages: Sequence[dict], text: str, attachment: str) -> list[dict]:
    """The next user message: a result for each tool use of the last reply, then *text*.

    The first tool use's result is *attachment* (what the tool would have shown);
    without a tool use the attachment goes with the text, as a user pasting it.
    """
    uses = [b for b in (messages[-1]["content"] if messages else []) if b.get("type") == "tool_use"]
    results = [
        {"type": "tool_result", "tool_use_id": use["id"], "content": attachment if index == 0 else "Done."}
        for index, use in enumerate(uses)
    ]
    pasted = f"{text}\n\n```\n{attachment}```" if attachment and not uses else text
    return [*results, {"type": "text", "text": pasted}]


def reply_blocks(events: Sequence[dict]) -> list[dict]:
    """The assistant's content blocks rebuilt from an Anthropic stream's events, as an agent keeps them.

    Text and thinking blocks keep their text; a tool-use block keeps its input when
    the streamed JSON parses (else the block is dropped, as a client drops a call it
    cannot run).  An empty reply becomes one empty text block.
    """
    blocks: dict[int, dict] = {}
    arguments: dict[int, list[str]] = {}
    for event in events:
        index = event.get("index", 0)
        if event.get("type") == "content_block_start":
            blocks[index] = dict(event.get("content_block") or {})
            arguments[index] = []
        elif event.get("type") == "content_block_delta" and index in blocks:
            delta = event.get("delta") or {}
            for field in ("text", "thinking"):
                if field in delta:
                    blocks[index][field] = blocks[index].get(field, "") + delta[field]
            if "partial_json" in delta:
                arguments[index].append(delta["partial_json"])
    kept = [_finished(blocks[index], "".join(arguments[index])) for index in sorted(blocks)]
    return [block for block in kept if block is not None] or [{"type": "text", "text": ""}]


def _finished(block: dict, arguments: str) -> dict | None:
    """*block* as the client keeps it: a tool use with its parsed input, None for one to drop."""
    if block.get("type") == "text" and not block.get("text"):
        return None
    if block.get("type") != "tool_use":
        return block
    try:
        tool_input = json.loads(arguments or "{}")
    except ValueError:
        return None
    return {**block, "input": tool_input} if isinstance(tool_input, dict) else None


def agent_session(client: httpx.Client, prompt: AgentPrompt) -> dict[str, float]:
    """Six turns of one session: turn 1 reads the prefix cold, the later ones should reuse it."""
    session = Session(prompt)
    turns = []
    for text, attachment in TURNS:
        turns.append(session.ask(client, text, attachment))
        time.sleep(scenarios.CLIENT_TURN_GAP_S)
    first, later = turns[0], turns[1:]
    later_ttft = statistics.median(t.ttft_s for t in later)
    return {
        "agent_turn1_ttft_s": first.ttft_s,
        "agent_later_ttft_s": later_ttft,
        "agent_later_max_ttft_s": max(t.ttft_s for t in later),
        "agent_later_over_turn1": later_ttft / first.ttft_s,
        "agent_turn1_prompt_tokens": first.prompt_tokens,
        "agent_turn1_prompt_tok_s": first.read_tok_s(),
        "agent_last_prompt_tokens": later[-1].prompt_tokens,
        "agent_later_cached_share": sum(t.cached_tokens for t in later) / sum(t.prompt_tokens for t in later),
    }


def fan_out(client: httpx.Client, prompt: AgentPrompt) -> dict[str, float | list[float]]:
    """One main turn, then three sub-agents with the same system prompt and tools, started together."""
    main = Session(prompt)
    first = main.ask(client, MAIN_TASK)
    time.sleep(scenarios.CLIENT_TURN_GAP_S)
    go = threading.Barrier(SUB_AGENTS + 1)

    def sub_agent(task: str) -> Turn:
        with httpx.Client(base_url=str(client.base_url)) as own:
            go.wait()
            return Session(prompt, session=main.session).ask(own, task, max_tokens=16)

    with concurrent.futures.ThreadPoolExecutor(SUB_AGENTS) as pool:
        futures = [pool.submit(sub_agent, task) for task in SUB_TASKS[:SUB_AGENTS]]
        go.wait()
        subs = [future.result() for future in futures]
    return {
        "fanout_main_ttft_s": first.ttft_s,
        "fanout_ttft_s": [t.ttft_s for t in subs],
        "fanout_max_ttft_s": max(t.ttft_s for t in subs),
        "fanout_prompt_tokens": statistics.median(t.prompt_tokens for t in subs),
        "fanout_cached_share": sum(t.cached_tokens for t in subs) / sum(t.prompt_tokens for t in subs),
    }


def restart(
    client: httpx.Client, restart_server: Callable[[], None], prompt: AgentPrompt
) -> dict[str, float]:
    """Two turns of a session, the server restarted, the third turn, then that turn read cold.

    Without a disk prompt cache nothing survives a restart and turn 3 reads its whole
    prompt; with one (``vs_llama_server.py`` starts the restart's Bubo with
    ``--cache-dir`` when its ``--help`` lists the disk tier) turn 3 should restore the
    prefix instead.  The restarted server's first request is turn 3 itself.  The cold
    read it is measured against is the same request from a twin session (another
    nonce, so nothing of it is cached anywhere), sent right after.
    """
    session = Session(prompt)
    first = session.ask(client, *TURNS[0])
    time.sleep(scenarios.CLIENT_TURN_GAP_S)
    warm = session.ask(client, *TURNS[1])
    history = list(session.messages)
    time.sleep(RESTART_PAUSE_S)
    restart_server()
    after = session.ask(client, *TURNS[2])
    time.sleep(scenarios.CLIENT_TURN_GAP_S)
    cold = Session(prompt, messages=history).ask(client, *TURNS[2])
    return {
        "restart_turn1_ttft_s": first.ttft_s,
        "restart_warm_ttft_s": warm.ttft_s,
        "restart_ttft_s": after.ttft_s,
        "restart_cold_ttft_s": cold.ttft_s,
        "restart_over_cold": after.ttft_s / cold.ttft_s,
        "restart_prompt_tokens": after.prompt_tokens,
        "restart_cached_tokens": after.cached_tokens,
        "restart_cold_cached_tokens": cold.cached_tokens,
        "restart_cold_prompt_tok_s": cold.read_tok_s(),
    }
