"""Settings from flags and BUBO_* variables; one clear line for every bad value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bubo.cli import warn_if_exposed
from bubo.config import (
    OPTIONS,
    ConfigError,
    ServerSettings,
    Settings,
    load_settings,
    serve_flag_values,
)
from bubo.machine import cpu_quota, default_threads


class TestLoading:
    def test_defaults(self, model_path: Path) -> None:
        """No flags: 127.0.0.1:8080, the default model, llama-server's sampling defaults."""
        settings = load_settings({}, environ={})
        assert (settings.server.hosts, settings.server.port) == (("127.0.0.1",), 8080)
        assert settings.model.path == model_path
        assert settings.model.ctx_size == 0
        assert settings.generation.n_predict == -1
        assert settings.generation.sampling.temperature == 0.8
        assert settings.server.api_key is None

    def test_environment(self) -> None:
        """Every BUBO_* variable lands in its setting."""
        settings = load_settings(
            {},
            environ={"BUBO_PORT": "9000", "BUBO_CTX_SIZE": "4096", "BUBO_TEMP": "0.2", "BUBO_API_KEY": "k"},
        )
        assert (settings.server.port, settings.model.ctx_size) == (9000, 4096)
        assert settings.generation.sampling.temperature == 0.2
        assert settings.server.api_key == "k"

    def test_flags_override_environment(self) -> None:
        """A flag beats its variable."""
        settings = load_settings({"server__port": "9001"}, environ={"BUBO_PORT": "9000"})
        assert settings.server.port == 9001

    def test_api_key_never_in_repr(self) -> None:
        """The key does not appear when settings are printed or logged."""
        assert "hunter2" not in repr(load_settings({"server__api_key": "hunter2"}, environ={}))

    def test_every_option_has_a_distinct_variable(self) -> None:
        """Each option's environment variable is BUBO_ + its long flag."""
        names = [option.env for option in OPTIONS]
        assert len(names) == len(set(names))
        assert {"BUBO_MODEL", "BUBO_SERVED_MODEL_NAME", "BUBO_N_PREDICT"} <= set(names)


class TestErrors:
    @pytest.mark.parametrize(
        ("environ", "message"),
        [
            ({"BUBO_PORT": "http"}, "BUBO_PORT: expected an integer, got 'http'"),
            ({"BUBO_PORT": "70000"}, "port must be between 0 and 65535, got 70000"),
            ({"BUBO_CTX_SIZE": "-1"}, "ctx_size must not be negative, got -1"),
            ({"BUBO_THREADS": "0"}, "threads must be at least 1, got 0"),
            ({"BUBO_TEMP": "nan"}, "BUBO_TEMP: expected a finite number, got 'nan'"),
            ({"BUBO_FLASH_ATTN": "maybe"}, "BUBO_FLASH_ATTN: expected one of auto, on, off, got 'maybe'"),
            ({"BUBO_MODEL": "/no/such.gguf"}, "BUBO_MODEL: no such file: /no/such.gguf"),
        ],
    )
    def test_one_clear_line(self, environ, message) -> None:
        """A bad value is a ConfigError naming the variable or setting."""
        with pytest.raises(ConfigError) as caught:
            load_settings({}, environ=environ)
        assert str(caught.value) == message

    def test_not_a_gguf(self, tmp_path: Path) -> None:
        """A model path that is not GGUF is refused before serving."""
        fake = tmp_path / "model.gguf"
        fake.write_bytes(b"not a model")
        with pytest.raises(ConfigError, match="is not a GGUF model file"):
            load_settings({"model__path": str(fake)}, environ={})


class TestCommandLine:
    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "bubo", *args],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )

    def test_bad_flag_value_is_one_line_and_status_2(self) -> None:
        """bubo serve with a bad value prints one line, no traceback, and exits 2."""
        result = self.run("serve", "--ctx-size", "lots")
        assert result.returncode == 2
        assert result.stderr.strip() == "bubo: --ctx-size: expected an integer, got 'lots'"

    def test_hypercorn_entry_point_with_bad_environment(self) -> None:
        """Importing bubo.app with a bad BUBO_* variable prints one line and exits 2."""
        import os

        env = {**os.environ, "BUBO_PORT": "x"}
        result = subprocess.run(
            [sys.executable, "-c", "import bubo.app"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
            check=False,
        )
        assert result.returncode == 2
        assert result.stderr.strip() == "bubo: BUBO_PORT: expected an integer, got 'x'"

    def test_help_lists_every_flag_with_its_variable(self) -> None:
        """bubo serve --help documents each flag and its environment variable."""
        result = self.run("serve", "--help")
        assert result.returncode == 0
        for option in OPTIONS:
            assert option.env in result.stdout


class TestExposure:
    """A non-loopback address without an API key is worth a warning; debug hooks refuse it."""

    @pytest.mark.parametrize("host", ["0.0.0.0", "192.168.1.20", "::"])
    def test_warns_beyond_loopback_without_a_key(self, host: str, caplog: pytest.LogCaptureFixture) -> None:
        warn_if_exposed(Settings(server=ServerSettings(hosts=(host,))))
        assert "without --api-key" in caplog.text

    @pytest.mark.parametrize(
        ("host", "key"), [("127.0.0.1", None), ("::1", None), ("localhost", None), ("0.0.0.0", "k")]
    )
    def test_quiet_on_loopback_or_with_a_key(self, host: str, key: str | None, caplog) -> None:
        warn_if_exposed(Settings(server=ServerSettings(hosts=(host,), api_key=key)))
        assert caplog.text == ""

    def test_debug_hooks_need_loopback(self) -> None:
        with pytest.raises(ConfigError, match="loopback"):
            load_settings({"server__debug_hooks": "on", "server__hosts": "127.0.0.1,0.0.0.0"}, environ={})

    def test_verbose_needs_loopback(self) -> None:
        """--verbose puts prompts in answers: refused at start-up on any other address, with why."""
        with pytest.raises(ConfigError, match=r"--verbose .* loopback addresses only, not 0\.0\.0\.0"):
            load_settings(serve_flag_values(["--verbose", "--host", "127.0.0.1,0.0.0.0"]), environ={})
        assert load_settings(serve_flag_values(["-v", "--host", "127.0.0.1,::1"]), environ={}).server.verbose
        assert not load_settings({}, environ={}).server.verbose

    def test_switches_accept_on_off_and_a_bare_flag(self) -> None:
        from_cli = load_settings(
            serve_flag_values(["--debug-hooks", "--memory-guard", "off", "-c", "512"]), environ={}
        )
        assert from_cli.server.debug_hooks  # the bare flag means on
        assert not from_cli.server.memory_guard
        assert from_cli.model.ctx_size == 512
        assert load_settings({"server__debug_hooks": "on"}, environ={}).server.debug_hooks
        assert not load_settings({}, environ={"BUBO_DEBUG_HOOKS": "off"}).server.debug_hooks
        with pytest.raises(ConfigError, match="on or off"):
            load_settings({}, environ={"BUBO_MEMORY_GUARD": "maybe"})

    @pytest.mark.parametrize(
        ("argv", "environ", "mode"),
        [
            ([], {}, "auto"),
            (["--repack", "on"], {}, "on"),
            (["-nr"], {}, "off"),  # llama-server's spelling
            (["--no-repack"], {"BUBO_REPACK": "on"}, "off"),  # the flag wins over the variable
            ([], {"BUBO_REPACK": "off"}, "off"),
        ],
    )
    def test_repack_mode(self, argv: list[str], environ: dict[str, str], mode: str) -> None:
        assert load_settings(serve_flag_values(argv), environ=environ).model.repack == mode

    def test_repack_probe_timeout_must_be_positive(self) -> None:
        with pytest.raises(ConfigError, match="repack_probe_timeout must be above 0"):
            load_settings({}, environ={"BUBO_REPACK_PROBE_TIMEOUT": "0"})

    def test_cache_dir_follows_xdg(self, tmp_path) -> None:
        assert load_settings({}, environ={"XDG_CACHE_HOME": str(tmp_path)}).cache_dir == tmp_path / "bubo"
        assert load_settings({}, environ={"XDG_CACHE_HOME": "relative"}).cache_dir == (
            Path.home() / ".cache" / "bubo"
        )
        assert load_settings({"cache_dir": str(tmp_path / "c")}, environ={}).cache_dir == tmp_path / "c"

    def test_cors_origins_are_checked(self) -> None:
        settings = load_settings({}, environ={"BUBO_CORS_ORIGINS": "http://localhost:3000, https://x.dev/"})
        assert settings.server.cors_origins == ("http://localhost:3000", "https://x.dev")
        with pytest.raises(ConfigError, match="not an origin"):
            load_settings({}, environ={"BUBO_CORS_ORIGINS": "localhost:3000"})


class TestSamplerFlags:
    def test_llama_server_spellings(self) -> None:
        """The sampler flags take llama-server's names; --mirostat-lr is eta and --mirostat-ent is tau."""
        sampling = load_settings(
            {},
            environ={
                "BUBO_TYPICAL": "0.9",
                "BUBO_MIROSTAT": "2",
                "BUBO_MIROSTAT_LR": "0.2",
                "BUBO_MIROSTAT_ENT": "3",
                "BUBO_TOP_NSIGMA": "1.5",
                "BUBO_DRY_MULTIPLIER": "0.8",
            },
        ).generation.sampling
        assert (sampling.typical_p, sampling.mirostat, sampling.mirostat_eta, sampling.mirostat_tau) == (
            0.9,
            2,
            0.2,
            3.0,
        )
        assert (sampling.top_n_sigma, sampling.dry_multiplier) == (1.5, 0.8)

    @pytest.mark.parametrize(
        ("argv", "order"),
        [
            (["--samplers", "top_k;temp;typical"], ("top_k", "temperature", "typ_p")),
            (["--sampler-seq", "edkt"], ("penalties", "dry", "top_k", "temperature")),
            (["--sampling-seq", "m"], ("min_p",)),
        ],
    )
    def test_the_samplers_order(self, argv: list[str], order: tuple[str, ...]) -> None:
        """--samplers takes names separated by ';', --sampler-seq (--sampling-seq) one letter each."""
        values = serve_flag_values(argv)
        assert load_settings(values, environ={}).generation.sampling.samplers == order

    def test_dry_sequence_breakers_repeat_and_none_clears_them(self) -> None:
        """Each --dry-sequence-breaker adds one, replacing the defaults; 'none' alone leaves none."""

        def breakers(*argv: str) -> tuple[str, ...]:
            values = serve_flag_values(argv)
            return load_settings(values, environ={}).generation.sampling.dry_sequence_breakers

        assert breakers() == ("\n", ":", '"', "*")
        assert breakers("--dry-sequence-breaker", "###", "--dry-sequence-breaker", "\n") == ("###", "\n")
        assert breakers("--dry-sequence-breaker", "none") == ()

    @pytest.mark.parametrize(
        ("environ", "message"),
        [
            ({"BUBO_MIROSTAT": "3"}, "BUBO_MIROSTAT: mirostat must be at least 0 and at most 2, got 3"),
            ({"BUBO_TYPICAL": "1.5"}, "BUBO_TYPICAL: typical_p must be at least 0 and at most 1, got 1.5"),
            (
                {"BUBO_DRY_PENALTY_LAST_N": "-2"},
                "BUBO_DRY_PENALTY_LAST_N: dry_penalty_last_n must be at least -1 and at most 2147483647, got -2",
            ),
            # the request's range (llama.h: "must be > 0.0"), which the flag once let through
            ({"BUBO_REPEAT_PENALTY": "0"}, "BUBO_REPEAT_PENALTY: repeat_penalty must be greater than 0"),
            ({"BUBO_TOP_P": "1.5"}, "BUBO_TOP_P: top_p must be at least 0 and at most 1, got 1.5"),
            ({"BUBO_SAMPLERS": "top_k;nope"}, "BUBO_SAMPLERS: 'nope' is not a sampler"),
            ({"BUBO_SAMPLER_SEQ": "kq"}, "BUBO_SAMPLER_SEQ: expected letters of edskypmxt, got 'kq'"),
            ({"BUBO_JSON_SCHEMA": "[1]"}, "BUBO_JSON_SCHEMA: a JSON schema is a JSON object"),
            (
                {"BUBO_GRAMMAR": 'root ::= "a"', "BUBO_JSON_SCHEMA": "{}"},
                "--grammar and --json-schema both constrain every answer",
            ),
        ],
    )
    def test_bad_values(self, environ: dict[str, str], message: str) -> None:
        """A bad sampler or constraint flag is one clear line naming it."""
        with pytest.raises(ConfigError) as error:
            load_settings({}, environ=environ)
        assert str(error.value).startswith(message)

    def test_json_schema_file(self, tmp_path: Path) -> None:
        """-jf reads the schema from a file, as -j takes it inline."""
        schema = tmp_path / "schema.json"
        schema.write_text('{"type": "object"}')
        settings = load_settings({"requests__json_schema__file": str(schema)}, environ={})
        assert settings.requests.json_schema == {"type": "object"}


def test_threads_default_to_one_a_core_of_this_machine() -> None:
    assert Settings().model.threads == default_threads(quota=cpu_quota())
