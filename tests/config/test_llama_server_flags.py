"""llama-server's context-shift, alias, prefill and reasoning flags, parsed as it spells them."""

from __future__ import annotations

import pytest

from bubo.config import ConfigError, Settings, load_settings, serve_flag_values


def parse(*argv: str, environ: dict[str, str] | None = None) -> Settings:
    return load_settings(serve_flag_values(argv), environ=environ or {})


class TestContextShift:
    def test_off_by_default_as_in_llama_server(self) -> None:
        assert parse().model.context_shift is False

    @pytest.mark.parametrize(
        ("argv", "environ", "on"),
        [
            (["--context-shift"], {}, True),
            (["--no-context-shift"], {"BUBO_CONTEXT_SHIFT": "on"}, False),
            ([], {"BUBO_CONTEXT_SHIFT": "on"}, True),
        ],
    )
    def test_flags(self, argv, environ, on) -> None:
        assert parse(*argv, environ=environ).model.context_shift is on


class TestAliases:
    def test_several_names_separated_by_commas(self) -> None:
        assert parse("--alias", "gpt-4o-mini, local ,gpt-4o-mini").serving.served_model_name == (
            "gpt-4o-mini",
            "local",
        )

    def test_an_empty_name_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="BUBO_SERVED_MODEL_NAME"):
            load_settings({}, environ={"BUBO_SERVED_MODEL_NAME": "a,,b"})


class TestChatFlags:
    def test_defaults(self) -> None:
        model = parse().requests
        assert (model.prefill_assistant, model.reasoning, model.reasoning_format, model.reasoning_budget) == (
            True,
            "auto",
            "auto",
            -1,
        )

    def test_llama_server_spellings(self) -> None:
        model = parse(
            "--no-prefill-assistant",
            "-rea",
            "off",
            "--reasoning-format",
            "deepseek-legacy",
            "--reasoning-budget",
            "0",
        ).requests
        assert (model.prefill_assistant, model.reasoning, model.reasoning_format, model.reasoning_budget) == (
            False,
            "off",
            "deepseek-legacy",
            0,
        )

    @pytest.mark.parametrize(
        ("argv", "thinking"),
        [
            ((), None),
            (("-rea", "on"), True),
            (("-rea", "off"), False),
            (("--reasoning-budget", "0"), False),
            (("-rea", "on", "--reasoning-budget", "0"), False),
            (("-rea", "on", "--reasoning-budget", "-1"), True),
        ],
    )
    def test_thinking_follows_reasoning_and_its_budget(self, argv, thinking) -> None:
        """enable_thinking: on or off as --reasoning says, off with a budget of 0, else the template's."""
        assert parse(*argv).requests.thinking is thinking

    @pytest.mark.parametrize(
        ("environ", "message"),
        [
            ({"BUBO_REASONING": "maybe"}, "BUBO_REASONING: expected one of on, off, auto"),
            ({"BUBO_REASONING_FORMAT": "gpt"}, "BUBO_REASONING_FORMAT: expected one of"),
            ({"BUBO_REASONING_BUDGET": "512"}, "reasoning_budget must be -1"),
        ],
    )
    def test_bad_values(self, environ, message) -> None:
        with pytest.raises(ConfigError, match=message):
            load_settings({}, environ=environ)


class TestServerSwitches:
    def test_metrics_and_slots_are_on_by_default(self) -> None:
        """Unlike llama-server (metrics off), Bubo serves /metrics unless told not to."""
        server = parse().server
        assert (server.metrics, server.slots) == (True, True)

    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (["--no-metrics"], (False, True)),
            (["--no-slots"], (True, False)),
            (["--metrics", "off", "--slots", "off"], (False, False)),
            (["--no-metrics", "--metrics"], (True, True)),
        ],
    )
    def test_llama_server_spellings(self, argv, expected) -> None:
        server = parse(*argv).server
        assert (server.metrics, server.slots) == expected

    def test_several_hosts(self) -> None:
        """--host takes several addresses separated by commas, as llama-server's does."""
        assert parse("--host", "127.0.0.1, ::1").server.hosts == ("127.0.0.1", "::1")

    def test_an_empty_host_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="--host"):
            parse("--host", "127.0.0.1,")

    def test_tags(self) -> None:
        assert parse("--tags", "local,small").serving.tags == ("local", "small")

    def test_cors_localhost(self) -> None:
        """localhost is a value of its own: any page served from this machine."""
        assert parse("--cors-origins", "localhost").server.cors_origins == ("localhost",)


class TestKvCacheTypes:
    def test_f16_by_default_as_in_llama_server(self) -> None:
        model = parse().model
        assert (model.cache_type_k, model.cache_type_v) == ("f16", "f16")

    def test_llama_server_spellings(self) -> None:
        model = parse("-ctk", "q8_0", "--cache-type-v", "q4_0").model
        assert (model.cache_type_k, model.cache_type_v) == ("q8_0", "q4_0")
        assert parse(environ={"BUBO_CACHE_TYPE_K": "iq4_nl"}).model.cache_type_k == "iq4_nl"

    def test_an_unknown_type_is_refused_with_the_types_there_are(self) -> None:
        with pytest.raises(ConfigError, match=r"--cache-type-k: expected one of f32, f16, bf16, q8_0"):
            parse("-ctk", "q6_k")

    def test_a_quantized_v_without_flash_attention_is_refused_at_start(self) -> None:
        with pytest.raises(ConfigError, match="quantized V cache needs flash attention"):
            parse("-ctv", "q8_0", "-fa", "off")
        assert parse("-ctk", "q8_0", "-fa", "off").model.cache_type_k == "q8_0"  # a quantized K does not
        assert parse("-ctv", "q8_0").model.flash_attn == "auto"  # llama.cpp turns it on for the V cache
