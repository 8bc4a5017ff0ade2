r"""Render Hugging Face chat templates in jinja2's sandbox (``_environment.py``).

A template is compiled once; ``/apply-template``, token counting and
generation all call :meth:`ChatTemplate.render`, which hands the template what
llama.cpp does: the messages, tools and special tokens, today's date
(``date_string``, ``datetime``), and the request's ``chat_template_kwargs``
over all of them.

Thinking turned off (``enable_thinking`` false) on a template that opens
``<think>`` whatever it is told (the DeepSeek-R1 distills) is closed after the
render, as llama.cpp does: the generation prompt then ends ``<think>\n</think>``.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from typing import Any

import attrs
import jinja2

from bubo.domain.messages import ChatPrompt, Message, ToolSpec
from bubo.errors import InvalidRequest

from ._environment import Clock, TemplateEnvironment, context_variables, local_now, template_reads
from ._polyfill import adapt, probe

__all__ = ["CHATML", "THINK_CLOSE", "THINK_OPEN", "ChatTemplate"]

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"

CHATML = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
"""The template used when a GGUF carries none (llama-server does the same)."""


class ChatTemplate:
    """One compiled chat template and the special tokens it may print."""

    def __init__(
        self,
        source: str,
        *,
        bos_token: str,
        eos_token: str,
        origin: str,
        preserve_reasoning: bool = True,
        clock: Clock = local_now,
    ) -> None:
        environment = TemplateEnvironment(clock)
        self._clock = clock
        self._reads = template_reads(environment, source)
        self.source = source
        self.origin = origin  # "gguf", "file:<path>" or "builtin-chatml"
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = environment.from_string(source)
        self.capabilities = probe(self.render_variables)
        caps = self.capabilities
        # the variable that keeps earlier turns' reasoning, set unless a request sets it itself
        self.default_variables: dict[str, Any] = (
            dict([caps.preserve_reasoning]) if preserve_reasoning and caps.preserve_reasoning else {}
        )
        # Thinking is on unless a request turns it off, as in llama-server: templates that gate it
        # on `not enable_thinking` (DeepSeek-R1 distills, QwQ, Command R7B) would close it when unset.
        self._thinking_default: dict[str, Any] = (
            {"enable_thinking": True} if "enable_thinking" in source else {}
        )

    @functools.cached_property
    def end_of_turn(self) -> str:
        r"""What the template writes between an assistant's answer and the next user message.

        ChatML: ``<|im_end|>\n<|im_start|>user\n``.  Empty when the template does not
        render such a conversation plainly.
        """
        answer, question = "bubo_probe_answer", "bubo_probe_question"
        messages = [
            {"role": "user", "content": "x"},
            {"role": "assistant", "content": answer},
            {"role": "user", "content": question},
        ]
        try:
            text = self.render_variables({"messages": messages, "add_generation_prompt": False})
        except Exception:  # noqa: BLE001 - a template that cannot render this has no known end of turn
            return ""
        start, end = text.find(answer), text.find(question)
        return text[start + len(answer) : end] if 0 <= start < end else ""

    @property
    def supports_thinking(self) -> bool:
        """Whether the template knows ``<think>`` reasoning (Qwen3-style ``enable_thinking``)."""
        return THINK_OPEN in self.source or "enable_thinking" in self.source

    def render_variables(self, variables: dict[str, Any]) -> str:
        """The template rendered with *variables* over llama.cpp's context (dates, tokens, ``functions``)."""
        context = context_variables(self._clock(), self._reads, variables.get("tools"))
        return self._template.render(
            {**context, "bos_token": self.bos_token, "eos_token": self.eos_token, **variables}
        )

    def render(self, prompt: ChatPrompt) -> str:
        """The prompt text for *prompt*, with the generic forms for what the template lacks.

        Raises:
            InvalidRequest: the template rejected the conversation (its own
                ``raise_exception``, e.g. roles that do not alternate) or failed on it.

        """
        add_generation_prompt, continued = _continuation(prompt)
        messages = prompt.messages[:-1] if continued is not None else prompt.messages
        prompt = adapt(attrs.evolve(prompt, messages=messages), self.capabilities)
        tools = [_tool_dict(t) for t in prompt.tools]
        objects = self.capabilities.object_arguments
        variables: dict[str, Any] = {
            **self._thinking_default,
            **self.default_variables,
            **({"tools": tools} if tools else {}),
            **prompt.template_kwargs,
            "messages": [_message_dict(m, object_arguments=objects) for m in prompt.messages],
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            text = self.render_variables(variables)
        except jinja2.exceptions.TemplateError as error:
            raise InvalidRequest(
                f"the chat template rejected the messages: {error}", code="template_error", param="messages"
            ) from error
        except (TypeError, ValueError, KeyError, IndexError, AttributeError) as error:
            raise InvalidRequest(
                f"the chat template could not render the messages: {type(error).__name__}: {error}",
                code="template_error",
                param="messages",
            ) from error
        if continued is not None:
            return text + continued
        if add_generation_prompt and variables.get("enable_thinking") is False:
            return _closed_thinking(text)
        return text


def _closed_thinking(text: str) -> str:
    """*text* with the ``<think>`` it ends in closed (the template opened it though thinking is off)."""
    return text + THINK_CLOSE if text.rstrip().endswith(THINK_OPEN) else text


def _continuation(prompt: ChatPrompt) -> tuple[bool, str | None]:
    """Whether to add the generation prompt, and the final assistant text to continue (None: none).

    As llama-server (its default assistant prefill) and Anthropic's API do, a
    conversation that ends with an assistant message is continued: the turns
    before it are rendered with the generation prompt, and its text follows, so
    the model writes on from it (sent as text parts, the parts joined as they
    are, as llama-server appends them).  ``continue_final_message: false`` closes that
    turn instead; ``add_generation_prompt: false`` alone renders the messages as
    they are.  Both true is a contradiction (a 400, as in llama-server and vLLM).

    Raises:
        InvalidRequest: both flags true, or a continuation without a final assistant text.

    """
    add, keep_going = prompt.add_generation_prompt, prompt.continue_final_message
    if add and keep_going:
        raise InvalidRequest(
            "continue_final_message and add_generation_prompt cannot both be true: "
            "the one continues the final message, the other opens a new one",
            param="continue_final_message",
        )
    final = prompt.messages[-1] if prompt.messages else None
    continuable = final is not None and final.role == "assistant" and not final.tool_calls
    if keep_going is None:
        keep_going = continuable and add is not False
    if not keep_going:
        return (True if add is None else add), None
    if final is None or not continuable:
        raise InvalidRequest(
            "continue_final_message needs a conversation that ends with an assistant message "
            "without tool calls",
            param="continue_final_message",
        )
    return True, "".join(final.text_parts) if final.text_parts else final.content or ""


def _message_dict(message: Message, *, object_arguments: bool = True) -> dict[str, Any]:
    """A message as transformers passes it; tool-call arguments as their text unless *object_arguments*."""
    out: dict[str, Any] = {"role": message.role, "content": message.content}
    if message.reasoning is not None:
        out["reasoning_content"] = message.reasoning
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {
                    "name": call.name,
                    "arguments": _arguments(call.arguments) if object_arguments else call.arguments,
                },
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        out["name"] = message.name
    return out


def _arguments(text: str) -> Any:
    """Tool-call arguments as an object, which is what templates iterate over."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return value if isinstance(value, Mapping) else text


def _tool_dict(tool: ToolSpec) -> dict[str, Any]:
    """A tool as llama-server hands it to templates: name, description, parameters, in that order.

    The order is the one clients send and the one a template's ``tojson`` prints,
    so the rendered prompt equals llama-server's for the same request.
    """
    function = {"name": tool.name, "description": tool.description or "", "parameters": dict(tool.parameters)}
    return {"type": "function", "function": function}
