"""Chat template rendering: transformers-compatible environment, errors as 400s."""

from __future__ import annotations

import pytest

from bubo.domain.messages import ChatPrompt, Message, ToolCall, ToolSpec
from bubo.errors import InvalidRequest
from bubo.templates import CHATML, ChatTemplate


def render(source: str, prompt: ChatPrompt) -> str:
    return ChatTemplate(source, bos_token="<s>", eos_token="</s>", origin="test").render(prompt)


USER = (Message(role="user", content="Hi"),)


class TestEnvironment:
    def test_builtin_chatml(self) -> None:
        """The fallback ChatML template renders roles and the generation prompt."""
        assert (
            render(CHATML, ChatPrompt(messages=USER))
            == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        )

    def test_no_generation_prompt(self) -> None:
        """add_generation_prompt false leaves the assistant turn closed."""
        assert render(CHATML, ChatPrompt(messages=USER, add_generation_prompt=False)).endswith("<|im_end|>\n")

    def test_globals_and_filters(self) -> None:
        """bos/eos tokens, tojson without ASCII escapes, strftime_now and loop controls exist."""
        source = (
            "{{ bos_token }}{{ messages[0].content | tojson }}{{ eos_token }}"
            "{% for i in range(5) %}{% if i == 2 %}{% break %}{% endif %}{{ i }}{% endfor %}"
            "{{ strftime_now('%Y') | length }}"
        )
        out = render(source, ChatPrompt(messages=(Message(role="user", content="é"),)))
        assert out == '<s>"é"</s>014'

    def test_generation_tag_renders_its_body(self) -> None:
        """transformers' {% generation %} blocks render as their content."""
        source = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
        assert render(source, ChatPrompt(messages=USER)) == "[Hi]"

    def test_template_kwargs_are_variables(self) -> None:
        """chat_template_kwargs reach the template as variables."""
        source = "{{ enable_thinking }}"
        assert (
            render(source, ChatPrompt(messages=USER, template_kwargs={"enable_thinking": False})) == "False"
        )

    def test_tools_and_tool_calls(self) -> None:
        """Tools and earlier tool calls reach the template as transformers passes them."""
        source = (
            "{{ tools[0].function.name }}|{{ messages[0].tool_calls[0].function.arguments.city }}"
            "|{{ messages[1].tool_call_id }}"
        )
        prompt = ChatPrompt(
            messages=(
                Message(
                    role="assistant",
                    content=None,
                    tool_calls=(ToolCall(id="c1", name="w", arguments='{"city": "Oslo"}'),),
                ),
                Message(role="tool", content="sunny", tool_call_id="c1"),
            ),
            tools=(ToolSpec(name="get_weather", parameters={"type": "object"}),),
        )
        assert render(source, prompt) == "get_weather|Oslo|c1"


class TestErrors:
    def test_raise_exception_is_a_400(self) -> None:
        """A template's raise_exception becomes InvalidRequest with its message."""
        source = "{{ raise_exception('Conversation roles must alternate') }}"
        with pytest.raises(InvalidRequest, match="roles must alternate") as caught:
            render(source, ChatPrompt(messages=USER))
        assert caught.value.code == "template_error"

    def test_sandbox_blocks_unsafe_access(self) -> None:
        """The sandbox refuses attribute access that could escape it."""
        with pytest.raises(InvalidRequest):
            render(
                "{{ messages.__class__.__mro__ }}{{ ''.__class__.__subclasses__() }}",
                ChatPrompt(messages=USER),
            )

    def test_render_failure_is_a_400(self) -> None:
        """A template that fails on the input (None + str) is a 400, not a 500."""
        with pytest.raises(InvalidRequest):
            render(
                CHATML.replace("(message['content'] or '')", "message['content']"),
                ChatPrompt(messages=(Message(role="user", content=None),)),
            )
