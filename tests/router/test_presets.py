"""--models-preset: llama-server's INI file of models, read for bubo serve (router/presets.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio
from quart_trio import QuartTrio

from bubo.config import ConfigError, load_settings
from bubo.router.catalog import CatalogEntry, build_catalog
from bubo.router.command import child_command
from bubo.router.presets import Preset, read_presets

from .test_router_app import AUTH, context, make_router, models_dir, post, settled


def presets(tmp_path: Path, text: str) -> tuple[Preset, ...]:
    path = tmp_path / "models.ini"
    path.write_text(text)
    return read_presets(path)


class TestReading:
    def test_llama_server_s_example(self, tmp_path: Path) -> None:
        """version, [*] under each section, every key spelling, switches and the preset's own keys."""
        (tmp_path / "m.gguf").write_bytes(b"GGUF")
        read = presets(
            tmp_path,
            "version = 1\n\n; settings for every model\n[*]\nc = 8192\nn-gpu-layers = 8\n\n"
            "[small]\nmodel = " + str(tmp_path / "m.gguf") + "\nctx-size = 4096\nBUBO_TEMP = 0.2\n"
            "LLAMA_ARG_TOP_K = 20\nno-webui = true\ncontext-shift = on\nalias = fast, tiny\ntags = local\n"
            "load-on-startup = true\nstop-timeout = 5\n",
        )
        (small,) = read
        assert small.name == "small"
        assert small.model == tmp_path / "m.gguf"
        assert small.args == (
            "--ctx-size=8192", "--n-gpu-layers=8",  # [*] first, so the section's own win
            "--ctx-size=4096", "--temp=0.2", "--top-k=20", "--webui=off", "--context-shift=on",
        )  # fmt: skip
        assert (small.aliases, small.tags) == (("fast", "tiny"), ("local",))
        assert (small.load_on_startup, small.stop_timeout, small.dedup) == (True, 5.0, False)

    def test_a_section_turns_the_projector_off_or_names_its_own(self, tmp_path: Path) -> None:
        """no-mmproj = true is --mmproj=off (the child then reads text only); mmproj = PATH names a file."""
        (tmp_path / "mmproj.gguf").write_bytes(b"GGUF")
        text = f"[a]\nno-mmproj = true\n[b]\nmmproj = {tmp_path / 'mmproj.gguf'}\n"
        a, b = presets(tmp_path, text)
        assert (a.args, b.args) == (("--mmproj=off",), (f"--mmproj={tmp_path / 'mmproj.gguf'}",))
        with pytest.raises(ConfigError, match="only true turns it off"):
            presets(tmp_path, "[a]\nno-mmproj = false\n")

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("[a]\nhf-repo = ggml-org/x\n", r"\[a\] hf-repo: not an option of bubo serve"),
            ("[a]\nport = 9\n", r"\[a\] port: set by the router"),
            ("[a]\nmodels-max = 2\n", r"\[a\] models-max: set by the router"),
            ("[a]\nctx-size = many\n", r"\[a\]: --ctx-size: expected an integer"),
            ("[a]\nwebui = perhaps\n", r"expected true or false"),
            ("[a\nc = 1\n", r"models\.ini"),
        ],
    )
    def test_refusals_name_the_section_and_key(self, tmp_path: Path, text: str, message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            presets(tmp_path, text)


class TestCatalog:
    def test_a_section_gives_a_directory_model_settings(self, tmp_path: Path) -> None:
        folder = models_dir(tmp_path, "a", "b")
        entries = {
            e.name: e for e in build_catalog(folder, presets(tmp_path, "[a]\nc = 512\nalias = first\n"))
        }
        assert entries["a"].path == folder / "a.gguf"
        assert (entries["a"].args, entries["a"].aliases) == (("--ctx-size=512",), ("first",))
        assert entries["b"].args == ()

    def test_a_section_of_its_own_needs_its_file(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match=r"\[other\]: no model of --models-dir has this name"):
            build_catalog(models_dir(tmp_path, "a"), presets(tmp_path, "[other]\nc = 512\n"))

    def test_dedup_hides_the_directory_s_entry_of_the_same_file(self, tmp_path: Path) -> None:
        folder = models_dir(tmp_path, "a")
        text = f"[nice-name]\nmodel = {folder / 'a.gguf'}\ndedup-cache-models = 1\n"
        entries = {e.name: e for e in build_catalog(folder, presets(tmp_path, text))}
        assert (entries["nice-name"].listed, entries["a"].listed) == (True, False)

    def test_a_name_claimed_twice_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="'b' is both"):
            build_catalog(models_dir(tmp_path, "a", "b"), presets(tmp_path, "[a]\nalias = b\n"))

    def test_the_child_gets_the_names_tags_and_settings(self, tmp_path: Path) -> None:
        """Precedence as llama-server's: the router's command line over the section over [*]."""
        folder = models_dir(tmp_path, "a")
        (entry,) = build_catalog(
            folder, presets(tmp_path, "[*]\nc = 1024\n[a]\nalias = x\ntags = t1,t2\ntemp = 0.5\n")
        )
        command = child_command(entry, 4000, ("--ctx-size=512",), ("--top-k=3",))
        assert command[4:] == (
            f"--model={folder / 'a.gguf'}", "--host=127.0.0.1", "--port=4000", "--served-model-name=a,x",
            "--tags=t1,t2", "--ctx-size=1024", "--temp=0.5", "--ctx-size=512", "--top-k=3",
        )  # fmt: skip


def test_router_mode_from_a_preset_file_alone(tmp_path: Path) -> None:
    """--models-preset without --models-dir (and without -m) is router mode too."""
    path = tmp_path / "models.ini"
    path.write_text("")
    assert load_settings({"router__models_preset": str(path)}, environ={}).router_mode


async def _ids(app: QuartTrio, query: str = "") -> dict[str, dict]:
    response = await app.test_client().get("/models" + query, headers=AUTH)
    assert response.status_code == 200, await response.get_data()
    return {m["id"]: m for m in (await response.get_json())["data"]}


async def _health_during_a_held_reload(app: QuartTrio) -> tuple[bool, set[str]]:
    """Whether /health answered while a reload's scan was held, and the models the reload listed."""
    router = context(app)
    scan = router.catalog
    started, release, finished = threading.Event(), threading.Event(), threading.Event()

    def held_scan() -> tuple[CatalogEntry, ...]:
        started.set()
        release.wait(timeout=10)  # on the event loop this freezes the test for 10 s, then fails it
        finished.set()
        return scan()

    router.catalog = held_scan
    listed: list[set[str]] = []

    async def reload() -> None:
        listed.append(set(await _ids(app, "?reload=1")))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(reload)
        with trio.fail_after(30):
            await trio.to_thread.run_sync(started.wait, 30)
        health = await app.test_client().get("/health", headers=AUTH)
        answered_while_held = health.status_code == 200 and not finished.is_set()
        release.set()
    return answered_while_held, listed[0]


class TestRouter:
    async def test_aliases_route_and_show(self, tmp_path: Path) -> None:
        """A request may name a model by its alias; /models lists aliases and tags."""
        preset = tmp_path / "models.ini"
        preset.write_text("[a]\nalias = nickname\ntags = local\n")
        async for app in make_router(tmp_path, "a", "b", router__models_preset=str(preset)):
            answer = await (await post(app, "/completion", {"model": "nickname"})).get_json()
            assert answer["model"] == "a"
            listed = await _ids(app)
            assert (listed["a"]["aliases"], listed["a"]["tags"]) == (["nickname"], ["local"])

    async def test_reload_reads_the_file_again(self, tmp_path: Path) -> None:
        """GET /models?reload=1: a removed section goes, a new one comes, an unchanged loaded model stays."""
        for name in ("x", "y", "z"):
            (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
        preset = tmp_path / "models.ini"
        preset.write_text(f"[ma]\nmodel = {tmp_path / 'x.gguf'}\n[mb]\nmodel = {tmp_path / 'y.gguf'}\n")
        async for app in make_router(tmp_path, router__models_preset=str(preset)):
            await post(app, "/completion", {"model": "mb"})
            assert set(await _ids(app)) == {"ma", "mb"}
            preset.write_text(f"[mb]\nmodel = {tmp_path / 'y.gguf'}\n[mc]\nmodel = {tmp_path / 'z.gguf'}\n")
            assert set(await _ids(app)) == {"ma", "mb"}  # read again only when asked
            listed = await _ids(app, "?reload=1")
            assert set(listed) == {"mb", "mc"}
            assert listed["mb"]["status"]["value"] == "loaded"

    async def test_a_bad_file_on_reload_keeps_the_models(self, tmp_path: Path) -> None:
        preset = tmp_path / "models.ini"
        preset.write_text("[a]\nc = 512\n")
        async for app in make_router(tmp_path, "a", router__models_preset=str(preset)):
            preset.write_text("[a]\nnonsense = 1\n")
            response = await app.test_client().get("/models?reload=1", headers=AUTH)
            assert response.status_code == 400
            assert "nonsense" in (await response.get_json())["error"]["message"]
            assert set(await _ids(app)) == {"a"}

    async def test_a_reload_reads_the_directory_off_the_event_loop(self, tmp_path: Path) -> None:
        """/health answers while a reload's scan is held; the reload then lists what the scan found."""
        async for app in make_router(tmp_path, "a"):
            (tmp_path / "models" / "b.gguf").write_bytes(b"GGUF")
            answered_while_held, listed = await _health_during_a_held_reload(app)
            assert answered_while_held
            assert listed == {"a", "b"}

    async def test_load_on_startup(self, tmp_path: Path) -> None:
        preset = tmp_path / "models.ini"
        preset.write_text("[b]\nload-on-startup = true\n")
        async for app in make_router(tmp_path, "a", "b", router__models_preset=str(preset)):
            record = context(app).registry.get("b")
            assert record.instance is not None
            assert (await settled(record)).loaded
            assert context(app).registry.get("a").instance is None
