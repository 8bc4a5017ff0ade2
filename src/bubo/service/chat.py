"""Chat requests: thinking controls, the template render, tools, grammars, parsers.

Everything here happens before the request is queued, so every refusal is an
ordinary 400.  The order matters: the template needs the thinking variables;
the rendered prompt tells whether the output starts inside ``<think>``; that
decides the reasoning parser and the grammars' thinking prefix.
"""

from __future__ import annotations

import functools
import hashlib

import attrs

from bubo.domain.generation import CacheTags, GenerationRequest, GrammarSpec, ThinkingBudget
from bubo.domain.media import without_markers
from bubo.domain.messages import ChatPrompt, ToolSpec
from bubo.domain.requests import ChatRequest, OutputFormat
from bubo.errors import InvalidRequest
from bubo.grammar import check_request_grammar, check_schema, output_grammar, thinking_prefix
from bubo.parsers import ParserConfig
from bubo.parsers.registry import tool_format
from bubo.templates import THINK_CLOSE, THINK_OPEN

from .generation import (
    PreparedGeneration,
    bias_chars,
    compile_grammar,
    generation_request,
    require_generation,
)
from .output import OutputPlan
from .prompt import RenderedPrompt, count_chat, image_work_bytes, reading_images, render_chat, stable_prompt
from .runtime import Runtime
from .work import PREPARE_BYTES_PER_CHAR

__all__ = [
    "count_chat_request",
    "prepare_chat",
    "prompt_chars",
    "render_chat_request",
    "starts_inside_thinking",
]


def starts_inside_thinking(prompt_text: str) -> bool:
    """Whether the prompt ends inside an opened ``<think>`` (the output continues the reasoning)."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


def _with_thinking_variables(runtime: Runtime, request: ChatRequest) -> ChatPrompt:
    """The prompt with ``enable_thinking``/``reasoning_effort`` set as the request (or the server) asks.

    The server's defaults (:class:`ChatDefaults`) fill in what the request leaves
    open: thinking on or off, and whether a final assistant message is continued.
    """
    reasoning = request.reasoning
    variables = dict(request.prompt.template_kwargs)
    if reasoning.enabled is not None:
        variables["enable_thinking"] = reasoning.enabled
    elif runtime.chat.thinking is not None:
        variables.setdefault("enable_thinking", runtime.chat.thinking)
    if reasoning.effort is not None:
        variables["reasoning_effort"] = reasoning.effort
    prompt = request.prompt
    if request.tool_choice.mode == "none":
        prompt = attrs.evolve(prompt, tools=())
    if not runtime.chat.prefill_assistant and prompt.continue_final_message is None:
        prompt = attrs.evolve(prompt, continue_final_message=False)
    return attrs.evolve(prompt, template_kwargs=variables)


def render_chat_request(runtime: Runtime, request: ChatRequest) -> RenderedPrompt:
    """The prompt exactly as generation renders it (``/apply-template``, ``/debug/prompt``)."""
    return render_chat(runtime, _with_thinking_variables(runtime, request))


def count_chat_request(runtime: Runtime, request: ChatRequest) -> int:
    """The prompt's token count as generation would see it, whatever its length (``count_tokens``)."""
    return count_chat(runtime, _with_thinking_variables(runtime, request))


async def prepare_chat(
    runtime: Runtime, request: ChatRequest, *, prefix: tuple[int, ...] = ()
) -> PreparedGeneration:
    """Render, tokenize, check, and plan grammar and parsers for a chat request.

    *prefix* are token ids placed before the rendered prompt (Ollama's ``context``: an
    earlier exchange the client sends back); the context check counts them.

    Raises:
        NotImplementedOnThisModel: the model cannot generate (an encoder).

    """
    require_generation(runtime)
    prompt = _with_thinking_variables(runtime, request)  # offers no tools when tool_choice is "none"

    def render_and_check() -> tuple[_CheckedSchemas, RenderedPrompt, GenerationRequest]:
        schemas = _check_schemas(request)  # first: a schema over the limits must not cost a render
        rendered = render_chat(runtime, prompt, n_ctx=runtime.engine.info.n_ctx, before=len(prefix))
        if prefix:  # the images' positions move with the tokens
            rendered = attrs.evolve(
                rendered,
                tokens=(*prefix, *rendered.tokens),
                images=tuple(attrs.evolve(image, at=image.at + len(prefix)) for image in rendered.images),
            )
        checked = attrs.evolve(
            generation_request(runtime, rendered, request.options, prompt_param="messages"),
            cache_tags=cache_tags(runtime, prompt),
            continuation=tuple(runtime.tokenizer.encode(runtime.template.end_of_turn)),
        )
        return schemas, rendered, checked

    need_bytes = (prompt_chars(prompt) + bias_chars(request.options)) * PREPARE_BYTES_PER_CHAR
    need_bytes += image_work_bytes(runtime, prompt.images)
    # schemas are checked (their normal form, their references bundled) in the worker too: off the event loop
    async with reading_images(runtime, prompt.images):
        checked_schemas, rendered, checked = await runtime.workers.run(
            render_and_check, need_bytes=need_bytes
        )
    inside = starts_inside_thinking(rendered.text)
    may_think = runtime.template.supports_thinking
    thinking = inside or may_think
    max_calls = None if request.parallel_tool_calls else 1
    grammar = await _compiled_grammar(
        runtime,
        request,
        checked_schemas,
        starts_inside=inside,
        may_think=may_think and not inside,
        max_calls=max_calls,
    )
    budget = request.reasoning.budget_tokens
    generation = attrs.evolve(
        checked,
        grammar=grammar,
        thinking_budget=(
            ThinkingBudget(
                budget=budget,
                end_tokens=tuple(runtime.tokenizer.encode(f"\n{THINK_CLOSE}\n\n")),
                started=inside,
                start_text=THINK_OPEN,
                end_text=THINK_CLOSE,
            )
            if budget is not None and thinking
            else None
        ),
    )
    forced, output = checked_schemas.forced, checked_schemas.output
    reasoning_format = runtime.chat.reasoning_format
    plan = OutputPlan(
        reasoning=thinking and reasoning_format != "none",
        reasoning_in_content=reasoning_format == "deepseek-legacy",
        starts_inside=inside,
        tool_format=runtime.tool_parser if prompt.tools else None,
        tool_config=ParserConfig(tools=prompt.tools, max_calls=max_calls),
        schema=None if output is None else output.schema,
        schema_param="" if output is None else output.param,
        checked_tools=forced or (),
    )
    return PreparedGeneration(prompt=rendered, request=generation, plan=plan)


def prompt_chars(prompt: ChatPrompt) -> int:
    """The size of the text a prompt holds (for the work estimate; the template adds little)."""
    return sum(
        len(m.content or "") + len(m.reasoning or "") + sum(len(c.arguments) for c in m.tool_calls)
        for m in prompt.messages
    )


def cache_tags(runtime: Runtime, prompt: ChatPrompt) -> CacheTags:
    """Which conversation this is (its opening turns) and how it is rendered, for cache reports."""
    opening = [
        (
            m.role,
            without_markers(m.content or "", prompt.media_marker, "<image>")
            if prompt.images
            else m.content or "",
        )
        for m in stable_prompt(prompt).messages[:2]
    ]  # an image's marker is new in every request: the conversation is the same
    rendering = [
        runtime.template.source,
        sorted((k, repr(v)) for k, v in prompt.template_kwargs.items()),
        [(t.name, t.description, repr(t.parameters)) for t in prompt.tools],
    ]
    return CacheTags(conversation=_digest(opening), template=_digest(rendering))


def _digest(value: object) -> str:
    return hashlib.blake2b(repr(value).encode(), digest_size=8).hexdigest()


async def _compiled_grammar(
    runtime: Runtime,
    request: ChatRequest,
    checked: _CheckedSchemas,
    *,
    starts_inside: bool,
    may_think: bool,
    max_calls: int | None,
) -> str | None:
    """The request's grammar as GBNF, else the server's default grammar, else none.

    Written and compiled here, off the event loop (a freeform tool's grammar is
    translated in proportion to its size) and before the request queues, so that a
    schema llama.cpp cannot take is a 400 naming the field, not a failed generation.
    """
    planned = await runtime.workers.run(
        functools.partial(
            _grammar,
            runtime,
            request,
            checked,
            starts_inside=starts_inside,
            may_think=may_think,
            max_calls=max_calls,
        )
    )
    if planned is None:
        return runtime.default_grammar
    return await compile_grammar(runtime, *planned)


def _forced_tools(request: ChatRequest) -> tuple[ToolSpec, ...] | None:
    """The tools a call is forced among (``tool_choice`` required or named), else None."""
    choice = request.tool_choice
    if choice.mode not in ("required", "named"):
        return None
    tools = request.prompt.tools
    if choice.mode == "named":
        chosen = tuple(t for t in tools if t.name == choice.name)
        if not chosen:
            names = ", ".join(repr(t.name) for t in tools) or "none"
            raise InvalidRequest(
                f"tool_choice names {choice.name!r}, which is not among the tools offered ({names})",
                param=choice.param,
            )
        return chosen
    if not tools:
        raise InvalidRequest("tool_choice requires a tool call but no tools were offered", param=choice.param)
    return tools


@attrs.frozen
class _CheckedSchemas:
    """The schemas a chat answer is held to, as :func:`bubo.grammar.check_schema` returned them.

    The forced tools (``tool_choice`` required or named, without a request grammar) with their
    parameters bundled, else the answer's own schema (``response_format``); the prompt still shows
    the tools as the client sent them.
    """

    forced: tuple[ToolSpec, ...] | None = None
    output: OutputFormat | None = None


def _check_schemas(request: ChatRequest) -> _CheckedSchemas:
    """Refuse a schema the grammar will not enforce, or that asks too much of it (one cheap pass each).

    A request's own grammar cannot be combined with a forced tool call: each would constrain the answer.
    """
    forced = _forced_tools(request)
    if forced is not None and request.grammar is not None:
        raise InvalidRequest(
            "a grammar cannot be combined with a forced tool call (tool_choice); send one of them",
            param=request.grammar.param,
        )
    if request.grammar is not None:
        check_request_grammar(request.grammar.rules, request.grammar.param)
        return _CheckedSchemas()
    if forced is not None:
        return _CheckedSchemas(
            forced=tuple(
                attrs.evolve(tool, parameters=check_schema(tool.parameters, tool.param)) for tool in forced
            )
        )
    if request.output_format is not None:
        output = request.output_format
        return _CheckedSchemas(output=attrs.evolve(output, schema=check_schema(output.schema, output.param)))
    return _CheckedSchemas()


def _grammar(
    runtime: Runtime,
    request: ChatRequest,
    checked: _CheckedSchemas,
    *,
    starts_inside: bool,
    may_think: bool,
    max_calls: int | None,
) -> tuple[GrammarSpec, str] | None:
    """Forced tool calls, else the request's grammar or JSON answer, else none; with its request field.

    A request's own GBNF constrains the whole answer, thinking included, as in llama-server.
    """
    if request.grammar is not None:
        return GrammarSpec(rules=request.grammar.rules), request.grammar.param
    prefix = thinking_prefix(starts_inside=starts_inside, may_think=may_think)
    if checked.forced is not None:
        forced = checked.forced
        grammar = tool_format(runtime.tool_parser).grammar(forced, prefix=prefix, max_calls=max_calls)
        return grammar, forced[0].param if len(forced) == 1 else "tools"
    if checked.output is not None:
        output = checked.output
        return output_grammar(output.schema, starts_inside=starts_inside, may_think=may_think), output.param
    return None
