"""What a chat template can render, probed once, and the generic format for what it cannot.

Many GGUF templates (the default model's ChatML among them) know nothing of
tools: they ignore the ``tools`` variable, drop ``tool_calls`` and choke on an
assistant turn whose content is null.  Like llama.cpp's minja polyfills, Bubo
probes each template once with marker values and, for what it does not render,
rewrites the conversation into a generic, documented form before rendering:

- tools it ignores become a system section listing them in ``<tools></tools>``
  and asking for ``<tool_call>{"name": …, "arguments": …}</tool_call>`` replies
  (the Hermes/Qwen format Bubo's default tool parser reads);
- tool calls it drops become that same markup in the assistant's content;
- tool results it drops become a user turn wrapped in ``<tool_response>``;
- a system role it rejects is folded into the first user turn; a system turn
  later in the conversation (Claude Code sends its environment as one), where
  the template rejects or drops it, is folded into the user turn just before
  it, else the one just after it, else it becomes a user turn of its own; so a
  turn's text never depends on what comes after its neighbours, and the prompt
  of the next request starts with this one's (the prompt cache still hits);
- null content becomes an empty string when the template needs a string.

The probe also learns how the template prints a tool call's arguments: as an
object (``arguments | tojson``, most templates) or as the text it was sent as
(``'…' + arguments``, Functionary v3.2), as llama.cpp's template capabilities
do; and whether the template keeps the reasoning of turns before
the latest user message, and which variable makes it do so (Qwen 3.6's
``preserve_thinking``, GLM's ``clear_thinking``).  A template that drops it
re-renders the previous answer without its reasoning, and the prompt cache
misses from that turn on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs

from bubo.domain.messages import ChatPrompt, Message, ToolCall, ToolSpec

__all__ = ["TemplateCapabilities", "adapt", "probe", "tool_call_markup", "tools_section"]

_TOOL = "bubo_probe_tool"
_CALL = "bubo_probe_call"
_RESULT = "bubo_probe_result"
_SYSTEM = "bubo_probe_system"
_REASONING = "bubo_probe_reasoning"
_ARGUMENT = "bubo_probe_arg"
# Template variables (and the value) that keep earlier turns' reasoning, in the order tried.
PRESERVE_REASONING_VARIABLES: tuple[tuple[str, bool], ...] = (
    ("preserve_thinking", True),
    ("clear_thinking", False),
)


@attrs.frozen(kw_only=True)
class TemplateCapabilities:
    """What the template renders by itself."""

    tools: bool
    tool_calls: bool
    tool_responses: bool
    system_role: bool
    null_content: bool
    object_arguments: bool = True  # tool-call arguments are passed as objects, not as their JSON text
    later_system: bool = True  # renders system turns after the first user turn, where they are
    past_reasoning: bool = False  # renders the reasoning of turns before the latest user message
    preserve_reasoning: tuple[str, bool] | None = None  # the variable that makes it, when it does not


def probe(render: Callable[[dict[str, Any]], str]) -> TemplateCapabilities:
    """Render marker conversations with *render* (template variables → text) to learn its abilities."""

    def shows(marker: str, messages: list[dict[str, Any]], **extra: Any) -> bool:
        try:
            return marker in render({"messages": messages, "add_generation_prompt": False, **extra})
        except Exception:  # noqa: BLE001 - a template that fails on a feature does not support it
            return False

    user = {"role": "user", "content": "x"}
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": _CALL, "arguments": {"a": 1}}}
        ],
    }
    tool = {
        "type": "function",
        "function": {"name": _TOOL, "description": "", "parameters": {"type": "object"}},
    }
    past = [user, {"role": "assistant", "content": "a", "reasoning_content": _REASONING}, user]
    keeps_past_reasoning = shows(_REASONING, past)
    preserve = None
    if not keeps_past_reasoning:
        preserve = next(
            (
                (name, value)
                for name, value in PRESERVE_REASONING_VARIABLES
                if shows(_REASONING, past, **{name: value})
            ),
            None,
        )
    return TemplateCapabilities(
        past_reasoning=keeps_past_reasoning,
        preserve_reasoning=preserve,
        tools=shows(_TOOL, [user], tools=[tool]),
        tool_calls=shows(_CALL, [user, call]),
        tool_responses=shows(
            _RESULT, [user, call, {"role": "tool", "content": _RESULT, "tool_call_id": "call_1"}]
        ),
        system_role=shows(_SYSTEM, [{"role": "system", "content": _SYSTEM}, user]),
        later_system=shows(
            _SYSTEM,
            [user, {"role": "assistant", "content": "a"}, {"role": "system", "content": _SYSTEM}, user],
        ),
        null_content=shows("x", [user, {"role": "assistant", "content": None}]),
        object_arguments=_prints_object_arguments(render, user),
    )


def _prints_object_arguments(render: Callable[[dict[str, Any]], str], user: dict[str, Any]) -> bool:
    """Whether the template prints arguments given as an object as JSON (else it wants their text).

    An object printed by ``tojson`` reads ``{"bubo_probe_arg": 1}``; one joined to a string reads as
    Python's ``{'bubo_probe_arg': 1}``, and that template prints the JSON text it is given instead.
    """
    text = json.dumps({_ARGUMENT: 1})

    def rendered(arguments: Any) -> str:
        function = {"name": _CALL, "arguments": arguments}
        message = {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"id": "c", "type": "function", "function": function}],
        }
        try:
            return render({"messages": [user, message], "add_generation_prompt": False})
        except Exception:  # noqa: BLE001 - a template that fails on a form does not print it
            return ""

    return text in rendered({_ARGUMENT: 1}) or text not in rendered(text)


def tools_section(tools: tuple[ToolSpec, ...]) -> str:
    """The generic system section that offers *tools*."""
    listed = "\n".join(
        json.dumps(
            {
                "type": "function",
                "function": {
                    "name": tool.name,
                    "description": tool.description or "",
                    "parameters": dict(tool.parameters),
                },
            },
            ensure_ascii=False,
        )
        for tool in tools
    )
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listed}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments within "
        "<tool_call></tool_call> XML tags:\n<tool_call>\n"
        '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def tool_call_markup(call: ToolCall) -> str:
    """One call in the generic format."""
    try:
        arguments: Any = json.loads(call.arguments)
    except ValueError:
        arguments = call.arguments
    payload = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{payload}\n</tool_call>"


def adapt(prompt: ChatPrompt, caps: TemplateCapabilities) -> ChatPrompt:
    """*prompt* rewritten so the template renders everything in it."""
    messages = list(prompt.messages)
    tools = prompt.tools
    if tools and not caps.tools:
        messages = _with_system(messages, tools_section(tools))
        tools = ()
    out: list[Message] = []
    for message in messages:
        if message.tool_calls and not caps.tool_calls:
            calls = "\n".join(tool_call_markup(call) for call in message.tool_calls)
            content = f"{message.content}\n{calls}" if message.content else calls
            message = attrs.evolve(message, content=content, tool_calls=())  # noqa: PLW2901
        if message.role == "tool" and not caps.tool_responses:
            content = f"<tool_response>\n{message.content or ''}\n</tool_response>"
            message = Message(role="user", content=content)  # noqa: PLW2901
        if message.content is None and not caps.null_content:
            message = attrs.evolve(message, content="")  # noqa: PLW2901
        out.append(message)
    if not caps.later_system:
        out = _fold_later_system(out)
    if not caps.system_role:
        out = _fold_system(out)
    return attrs.evolve(prompt, messages=tuple(out), tools=tools)


def _fold_later_system(messages: list[Message]) -> list[Message]:
    """System turns after the first other turn, folded into a neighbouring user turn.

    Into the user turn just before, else the user turn just after, else a user
    turn of their own; the leading system turns stay for the template.  Linear
    in the messages and their text: a user turn's added system texts are joined
    once, at the end (joining each as it came copied the growing turn each time).
    """
    out: list[Message] = []
    added: dict[int, list[str | None]] = {}  # the system texts each user turn of out takes after its own
    pending: list[str] = []  # system text waiting for the next user turn
    leading = True  # every turn so far is a system turn
    for message in messages:
        if message.role == "system" and not leading:
            if out[-1].role == "user" and not pending:
                added.setdefault(len(out) - 1, []).append(message.content)
            else:
                pending.append(message.content or "")
            continue
        if pending:
            preamble = "\n\n".join(pending)
            pending = []
            if message.role == "user":
                message = attrs.evolve(message, content=_joined(preamble, message.content))  # noqa: PLW2901
            else:
                out.append(Message(role="user", content=preamble))
        out.append(message)
        leading = leading and message.role == "system"
    if pending:
        out.append(Message(role="user", content="\n\n".join(pending)))
    for index, texts in added.items():
        joined = "\n\n".join(text for text in (out[index].content, *texts) if text)
        out[index] = attrs.evolve(out[index], content=joined)
    return out


def _joined(first: str | None, second: str | None) -> str:
    return "\n\n".join(text for text in (first, second) if text)


def _with_system(messages: list[Message], section: str) -> list[Message]:
    if messages and messages[0].role == "system":
        first = messages[0]
        content = f"{first.content}\n\n{section}" if first.content else section
        return [attrs.evolve(first, content=content), *messages[1:]]
    return [Message(role="system", content=section), *messages]


def _fold_system(messages: list[Message]) -> list[Message]:
    """System turns become the start of the first user turn (for templates that reject them)."""
    system = [m.content for m in messages if m.role == "system" and m.content]
    rest = [m for m in messages if m.role != "system"]
    if not system:
        return rest
    preamble = "\n\n".join(system)
    for index, message in enumerate(rest):
        if message.role == "user":
            rest[index] = attrs.evolve(message, content=f"{preamble}\n\n{message.content or ''}")
            return rest
    return [Message(role="user", content=preamble), *rest]
