"""Chat template rendering: transformers-compatible environment, errors as 400s."""

from __future__ import annotations

from pathlib import Path

import pytest

from bubo.domain.messages import ChatPrompt, Message, ToolCall, ToolSpec
from bubo.errors import InvalidRequest
from bubo.templates import CHATML, ChatTemplate
from bubo.templates._polyfill import TemplateCapabilities, adapt

from .._linear import assert_linear

CAPABILITIES_WITHOUT_LATER_SYSTEM = TemplateCapabilities(
    tools=True, tool_calls=True, tool_responses=True, system_role=True, null_content=True, later_system=False
)


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
            "{% if tools %}{{ tools[0].function.name }}{% endif %}"
            "{% for m in messages %}{% for c in m.tool_calls or [] %}|{{ c.function.name }}:{{ c.function.arguments.city }}"
            "{% endfor %}{% if m.role == 'tool' %}|{{ m.tool_call_id }}={{ m.content }}{% endif %}{% endfor %}"
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
        assert render(source, prompt) == "get_weather|w:Oslo|c1=sunny"

    def test_tools_keep_the_order_clients_send_and_llama_server_renders(self) -> None:
        """name, description, parameters: a template's tojson prints what llama-server's prints."""
        tool = ToolSpec(name="f", description="Finds.", parameters={"type": "object"})
        rendered = render("{{ tools | tojson }}", ChatPrompt(messages=USER, tools=(tool,)))
        assert rendered == (
            '[{"type": "function", "function": '
            '{"name": "f", "description": "Finds.", "parameters": {"type": "object"}}}]'
        )


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

    @pytest.mark.parametrize("statement", ["include {!r}", "import {!r} as other", "extends {!r}"])
    def test_a_template_reads_no_file(self, statement: str, tmp_path: Path) -> None:
        """The environment has no loader: a template naming a file (or a URL) fails, nothing is read."""
        secret = tmp_path / "secret.jinja"
        secret.write_text("SECRET")
        source = "{% " + statement.format(str(secret)) + " %}{{ messages[0].content }}"
        with pytest.raises(InvalidRequest) as caught:
            render(source, ChatPrompt(messages=USER))
        assert "SECRET" not in str(caught.value)
        assert caught.value.code == "template_error"

    def test_render_failure_is_a_400(self) -> None:
        """A template that fails on the input (a number minus a text) is a 400, not a 500."""
        with pytest.raises(InvalidRequest):
            render("{{ 1 - messages[0].content }}", ChatPrompt(messages=USER))


class TestPolyfills:
    def test_probe_of_the_default_model_template(self, template) -> None:
        """SmolLM2's ChatML knows no tools; it renders tool results, and a null content as empty (as llama.cpp)."""
        caps = template.capabilities
        assert (caps.tools, caps.tool_calls, caps.null_content) == (False, False, True)
        assert (caps.tool_responses, caps.system_role) == (True, True)

    def test_tools_become_a_system_section(self, template) -> None:
        """Tools a template ignores are offered in the generic <tools> section."""
        prompt = ChatPrompt(
            messages=(Message(role="system", content="Be brief."), *USER),
            tools=(ToolSpec(name="get_weather", description="Weather", parameters={"type": "object"}),),
        )
        text = template.render(prompt)
        assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
        assert '"name": "get_weather"' in text
        assert "<tool_call></tool_call> XML tags" in text

    def test_tool_calls_become_markup(self, template) -> None:
        """Calls a template drops are written into the assistant's content."""
        prompt = ChatPrompt(
            messages=(
                *USER,
                Message(
                    role="assistant",
                    content=None,
                    tool_calls=(ToolCall(id="c", name="f", arguments='{"x": 1}'),),
                ),
                Message(role="tool", content="42", tool_call_id="c"),
            )
        )
        text = template.render(prompt)
        assert (
            '<|im_start|>assistant\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call><|im_end|>'
            in text
        )
        assert "<|im_start|>tool\n42<|im_end|>" in text

    def test_system_folded_when_rejected(self) -> None:
        """A template that rejects the system role gets the system text in the first user turn."""
        source = (
            "{% for m in messages %}{% if m.role == 'system' %}{{ raise_exception('no system') }}{% endif %}"
            "[{{ m.role }}]{{ m.content }}{% endfor %}"
        )
        prompt = ChatPrompt(messages=(Message(role="system", content="Rules."), *USER))
        assert render(source, prompt) == "[user]Rules.\n\nHi"

    def test_later_system_turns_stay_where_the_template_takes_them(self, template) -> None:
        """ChatML renders a system turn after the first user turn in its place (Claude Code's environment)."""
        prompt = ChatPrompt(messages=(*USER, Message(role="system", content="Env.")))
        assert "<|im_start|>user\nHi<|im_end|>\n<|im_start|>system\nEnv.<|im_end|>\n" in template.render(
            prompt
        )

    # A Gemma-style template: one leading system turn at most, roles must alternate.
    ONLY_LEADING_SYSTEM = (
        "{% for m in messages %}"
        "{% if m.role == 'system' and not loop.first %}{{ raise_exception('system must come first') }}{% endif %}"
        "[{{ m.role }}]{{ m.content }}{% endfor %}"
    )

    @pytest.mark.parametrize(
        ("messages", "expected"),
        [
            ((*USER, Message(role="system", content="Env.")), "[user]Hi\n\nEnv."),
            (
                (*USER, Message(role="assistant", content="Yes?"), Message(role="system", content="Env.")),
                "[user]Hi[assistant]Yes?[user]Env.",
            ),
            (
                (
                    *USER,
                    Message(role="assistant", content="Yes?"),
                    Message(role="system", content="Env."),
                    Message(role="user", content="Go"),
                ),
                "[user]Hi[assistant]Yes?[user]Env.\n\nGo",
            ),
            (
                (Message(role="system", content="Rules."), *USER, Message(role="system", content="Env.")),
                "[system]Rules.[user]Hi\n\nEnv.",
            ),
        ],
    )
    def test_later_system_turns_folded_into_a_neighbouring_user_turn(self, messages, expected) -> None:
        """Where the template takes only a leading system turn, later ones join the user turn beside them."""
        prompt = ChatPrompt(messages=messages, add_generation_prompt=False)
        assert render(self.ONLY_LEADING_SYSTEM, prompt) == expected

    @pytest.mark.parametrize(
        ("before", "repeated", "after"),
        [((), (Message(role="system", content="S"),), USER),  # leading system turns, each looked at once
         (USER, (Message(role="system", content="S" * 50),), ()),  # all joined into one user turn, once
         (USER, (Message(role="assistant", content="A"), Message(role="system", content="S")), ())],
    )  # fmt: skip
    def test_folding_is_linear_in_the_turns(
        self, before: tuple[Message, ...], repeated: tuple[Message, ...], after: tuple[Message, ...]
    ) -> None:
        """Many system turns: each turn is looked at once and a user turn's text joined once (both were n²)."""

        def prompt(n: int) -> ChatPrompt:
            turns = (*before, *(repeated * (n // len(repeated))), *after)
            return ChatPrompt(messages=turns, add_generation_prompt=False)

        assert_linear(prompt, lambda p: adapt(p, CAPABILITIES_WITHOUT_LATER_SYSTEM), 5_000)

    def test_folding_keeps_the_next_request_a_continuation(self) -> None:
        """The next turn's prompt starts with this turn's: a folded system turn does not move."""
        first = (*USER, Message(role="system", content="Env."))
        later = (*first, Message(role="assistant", content="Done."), Message(role="user", content="More"))
        before = render(self.ONLY_LEADING_SYSTEM, ChatPrompt(messages=first, add_generation_prompt=False))
        after = render(self.ONLY_LEADING_SYSTEM, ChatPrompt(messages=later, add_generation_prompt=False))
        assert after.startswith(before)


FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


class TestPastReasoning:
    """Earlier turns' reasoning stays in the prompt where the template can keep it (stable cache prefix)."""

    FIRST_TURN = (Message(role="system", content="Be brief."), Message(role="user", content="Hi"))
    ANSWER = Message(role="assistant", content="Hello!", reasoning="They greet me.")

    def conversation(self, *, template_kwargs: dict[str, object] | None = None) -> ChatPrompt:
        return ChatPrompt(
            messages=(*self.FIRST_TURN, self.ANSWER, Message(role="user", content="Bye")),
            template_kwargs=template_kwargs or {},
        )

    def qwen36(self, *, preserve_reasoning: bool = True) -> ChatTemplate:
        source = (FIXTURES / "qwen36_preserve.jinja").read_text()
        return ChatTemplate(
            source, bos_token="", eos_token="", origin="test", preserve_reasoning=preserve_reasoning
        )

    def test_probe_finds_the_preserving_variable(self) -> None:
        caps = self.qwen36().capabilities
        assert (caps.past_reasoning, caps.preserve_reasoning) == (False, ("preserve_thinking", True))

    def test_probe_of_a_template_that_always_keeps_it(self) -> None:
        source = (FIXTURES / "qwen3_style.jinja").read_text()
        caps = ChatTemplate(source, bos_token="", eos_token="", origin="test").capabilities
        assert (caps.past_reasoning, caps.preserve_reasoning) == (True, None)

    def test_probe_of_a_template_without_reasoning(self, template) -> None:
        caps = template.capabilities
        assert (caps.past_reasoning, caps.preserve_reasoning) == (False, None)

    def test_second_turn_extends_the_first_turn_as_generated(self) -> None:
        """The next prompt starts with the previous prompt and the reasoning and answer it produced."""
        template = self.qwen36()
        first = template.render(ChatPrompt(messages=self.FIRST_TURN))
        generated = "<think>\nThey greet me.\n</think>\n\nHello!<|im_end|>\n"
        assert template.render(self.conversation()).startswith(first + generated)

    def test_a_request_may_turn_it_off(self) -> None:
        text = self.qwen36().render(self.conversation(template_kwargs={"preserve_thinking": False}))
        assert "They greet me." not in text

    def test_the_server_may_turn_it_off(self) -> None:
        assert "They greet me." not in self.qwen36(preserve_reasoning=False).render(self.conversation())


class TestEndOfTurn:
    """The text between an answer and the next user message, which the engine warms while idle."""

    def test_chatml(self, template) -> None:
        assert template.end_of_turn == "<|im_end|>\n<|im_start|>user\n"

    def test_a_template_with_its_own_markup(self) -> None:
        source = "{% for m in messages %}[{{ m.role }}]{{ m.content }}[/{{ m.role }}]{% endfor %}"
        template = ChatTemplate(source, bos_token="", eos_token="", origin="test")
        assert template.end_of_turn == "[/assistant][user]"

    def test_unknown_when_the_template_rejects_the_probe(self) -> None:
        template = ChatTemplate("{{ raise_exception('no') }}", bos_token="", eos_token="", origin="test")
        assert template.end_of_turn == ""


class TestFinalAssistantMessage:
    """A conversation that ends with an assistant message is continued, as llama-server and Anthropic do."""

    COUNTING = (
        Message(role="user", content="Count to ten."),
        Message(role="assistant", content="1, 2, 3,"),
    )
    OPEN = "<|im_start|>user\nCount to ten.<|im_end|>\n<|im_start|>assistant\n"

    def test_is_continued_by_default(self) -> None:
        """No end of turn after it and no new assistant header: the model writes on from '3,'."""
        assert render(CHATML, ChatPrompt(messages=self.COUNTING)) == self.OPEN + "1, 2, 3,"

    def test_continue_final_message_says_so_explicitly(self) -> None:
        prompt = ChatPrompt(messages=self.COUNTING, continue_final_message=True, add_generation_prompt=False)
        assert render(CHATML, prompt) == self.OPEN + "1, 2, 3,"

    def test_continue_final_message_false_closes_it(self) -> None:
        rendered = render(CHATML, ChatPrompt(messages=self.COUNTING, continue_final_message=False))
        assert rendered == self.OPEN + "1, 2, 3,<|im_end|>\n<|im_start|>assistant\n"

    def test_add_generation_prompt_false_renders_the_messages_as_they_are(self) -> None:
        rendered = render(CHATML, ChatPrompt(messages=self.COUNTING, add_generation_prompt=False))
        assert rendered == self.OPEN + "1, 2, 3,<|im_end|>\n"

    def test_a_final_tool_call_is_a_closed_turn(self) -> None:
        call = Message(
            role="assistant", content=None, tool_calls=(ToolCall(id="c", name="f", arguments="{}"),)
        )
        rendered = render(CHATML, ChatPrompt(messages=(*USER, call)))
        assert rendered.endswith("<|im_end|>\n<|im_start|>assistant\n")

    def test_both_switches_true_is_a_400(self) -> None:
        prompt = ChatPrompt(messages=self.COUNTING, continue_final_message=True, add_generation_prompt=True)
        with pytest.raises(InvalidRequest, match="cannot both be true") as caught:
            render(CHATML, prompt)
        assert caught.value.param == "continue_final_message"

    @pytest.mark.parametrize(
        "messages",
        [
            USER,
            (
                *USER,
                Message(
                    role="assistant", content="", tool_calls=(ToolCall(id="c", name="f", arguments="{}"),)
                ),
            ),
        ],
    )
    def test_nothing_to_continue_is_a_400(self, messages: tuple[Message, ...]) -> None:
        with pytest.raises(InvalidRequest, match="ends with an assistant message") as caught:
            render(CHATML, ChatPrompt(messages=messages, continue_final_message=True))
        assert caught.value.param == "continue_final_message"


class TestThinkingIsOnByDefault:
    """Templates that close the thinking block when `enable_thinking` is falsy see it true unless asked.

    Each source below keeps the gating construct of a template llama.cpp ships
    (models/templates): the generation prompt closes the block on `not enable_thinking`.
    """

    GATED = {
        "deepseek-r1-distill": (
            "{% for m in messages %}<｜User｜>{{ m.content }}{% endfor %}"
            "{% if add_generation_prompt %}<｜Assistant｜><think>\n"
            "{% if not enable_thinking %}</think>{% endif %}{% endif %}"
        ),
        "qwq": (
            "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n"
            "{% if not enable_thinking %}</think>{% endif %}{% endif %}"
        ),
        "command-r7b": (
            "{% for m in messages %}{{ m.content }}{% endfor %}<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>"
            "{% if not enable_thinking %}<|START_THINKING|><|END_THINKING|>{% endif %}"
        ),
    }
    CLOSED = ("</think>", "<|END_THINKING|>")

    @pytest.mark.parametrize("source", GATED.values(), ids=GATED.keys())
    def test_unset_means_on(self, source: str) -> None:
        rendered = render(source, ChatPrompt(messages=USER))
        assert not rendered.endswith(self.CLOSED)

    @pytest.mark.parametrize("source", GATED.values(), ids=GATED.keys())
    def test_a_request_turns_it_off(self, source: str) -> None:
        rendered = render(source, ChatPrompt(messages=USER, template_kwargs={"enable_thinking": False}))
        assert rendered.endswith(self.CLOSED)


class TestThinkingOffClosesAnOpenedBlock:
    """A template that opens `<think>` whatever it is told gets it closed when thinking is off, as in llama.cpp."""

    ALWAYS_OPEN = FIXTURES / "llama_cpp_templates" / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"

    def rendered(self, **template_kwargs: object) -> str:
        return render(
            self.ALWAYS_OPEN.read_text(), ChatPrompt(messages=USER, template_kwargs=template_kwargs)
        )

    def test_off_closes_it(self) -> None:
        assert self.rendered(enable_thinking=False).endswith("<｜Assistant｜><think>\n</think>")

    @pytest.mark.parametrize("kwargs", [{}, {"enable_thinking": True}], ids=["unset", "on"])
    def test_otherwise_the_output_starts_inside_it(self, kwargs: dict[str, object]) -> None:
        assert self.rendered(**kwargs).endswith("<｜Assistant｜><think>\n")

    def test_a_continued_answer_is_left_as_written(self) -> None:
        prompt = ChatPrompt(
            messages=(*USER, Message(role="assistant", content="<think>")),
            template_kwargs={"enable_thinking": False},
        )
        assert render(CHATML, prompt).endswith("assistant\n<think>")
