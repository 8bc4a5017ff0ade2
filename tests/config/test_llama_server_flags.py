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
        assert parse("--alias", "gpt-4o-mini, local ,gpt-4o-mini").model.served_model_name == (
            "gpt-4o-mini",
            "local",
        )

    def test_an_empty_name_is_refused(self) -> None:
        with pytest.raises(ConfigError, match="BUBO_SERVED_MODEL_NAME"):
            load_settings({}, environ={"BUBO_SERVED_MODEL_NAME": "a,,b"})


class TestChatFlags:
    def test_defaults(self) -> None:
        model = parse().model
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
        ).model
        assert (model.prefill_assistant, model.reasoning, model.reasoning_format, model.reasoning_budget) == (
            False,
            "off",
            "deepseek-legacy",
            0,
        )

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
        assert parse("--tags", "local,small").model.tags == ("local", "small")

    def test_cors_localhost(self) -> None:
        """localhost is a value of its own: any page served from this machine."""
        assert parse("--cors-origins", "localhost").server.cors_origins == ("localhost",)
