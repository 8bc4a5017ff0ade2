"""POST /slots/{id}?action=save|restore|erase over the fake engine: fields, confinement, records, quota."""

from __future__ import annotations

import json
import threading

import attrs
import pytest
import trio
import trio.testing
from dirty_equals import IsList, IsNumber
from tests.conftest import wait_until_ready
from tests.engine._hang import WAIT_S, HangingCall

from bubo.engine.fake import FakeEngine, fake_model_info
from bubo.engine.lora import LoraAdapter
from bubo.server import create_app
from bubo.service.slot_files import save_slot
from bubo.service.slot_store import SlotFileStore, SlotRecord

MIB = 1 << 20


@pytest.fixture(name="slot_dir")
def _slot_dir(tmp_path):
    return tmp_path / "slots"


MODEL_FINGERPRINT = "b" * 64  # what the loader would read off the fake model's file


def _store(
    slot_dir, *, max_bytes: int = 64 * MIB, max_files: int = 16, fingerprint: str = MODEL_FINGERPRINT
) -> SlotFileStore:
    return SlotFileStore(
        directory=slot_dir, max_bytes=max_bytes, max_files=max_files, fingerprint=fingerprint
    )


async def _serve(settings, runtime):
    return create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)


@pytest.fixture(name="slot_app")
async def _slot_app(settings, make_runtime, slot_dir):
    runtime = attrs.evolve(make_runtime(), slot_files=_store(slot_dir))
    app = await _serve(settings, runtime)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


async def _complete(client, prompt: str) -> dict:
    response = await client.post("/completion", json={"prompt": prompt, "n_predict": 4, "id_slot": 0})
    assert response.status_code == 200
    return await response.get_json()


class TestActions:
    async def test_save_erase_restore(self, slot_app, fake_engine, slot_dir) -> None:
        """save writes the slot's tokens; erase empties it; restore brings them back for the next request."""
        client = slot_app.test_client()
        first = await _complete(client, "The quick brown fox jumps over the lazy dog")
        n_tokens = first["tokens_evaluated"]
        saved = await client.post("/slots/0?action=save", json={"filename": "fox.bin"})
        assert saved.status_code == 200
        assert await saved.get_json() == {
            "id_slot": 0, "filename": "fox.bin", "n_saved": n_tokens, "n_written": IsNumber,
            "timings": {"save_ms": IsNumber},
        }  # fmt: skip
        assert (slot_dir / "fox.bin").is_file()
        erased = await client.post("/slots/0?action=erase")
        assert await erased.get_json() == {"id_slot": 0, "n_erased": n_tokens}
        assert (await (await client.get("/slots")).get_json())[0]["n_prompt_tokens"] == 0
        restored = await client.post("/slots/0?action=restore", json={"filename": "fox.bin"})
        assert restored.status_code == 200
        assert await restored.get_json() == {
            "id_slot": 0, "filename": "fox.bin", "n_restored": n_tokens, "n_read": IsNumber,
            "timings": {"restore_ms": IsNumber},
        }  # fmt: skip
        again = await _complete(client, "The quick brown fox jumps over the lazy dog and runs")
        assert again["timings"]["cache_n"] == n_tokens

    async def test_busy_slot(self, slot_app, script) -> None:
        """A slot a request holds answers 503 slot_busy, as llama-server does."""
        script.piece_delay = 0.2
        client = slot_app.test_client()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_complete, client, "hello there")
            with trio.fail_after(10):
                while not (await (await client.get("/slots")).get_json())[0]["is_processing"]:
                    await trio.sleep(0.01)
            response = await client.post("/slots/0?action=erase")
            assert response.status_code == 503
            assert (await response.get_json())["error"]["code"] == "slot_busy"

    async def test_without_slot_save_path(self, app) -> None:
        """Without --slot-save-path every action is 501 (llama-server's 'not supported')."""
        for action in ("save", "restore", "erase"):
            response = await app.test_client().post(f"/slots/0?action={action}", json={"filename": "x"})
            assert response.status_code == 501
            assert "--slot-save-path" in (await response.get_json())["error"]["message"]


class TestErrors:
    @pytest.mark.parametrize(
        "filename",
        ["../x", "/etc/passwd", "a/b", "..", ".", ".hidden", "x\\y", "x\x00", " x", "x" * 256, "", 7,
         "x.bin.bubo.json"],
    )  # fmt: skip
    @pytest.mark.parametrize("action", ["save", "restore"])
    async def test_file_names_stay_in_the_directory(
        self, slot_app, slot_dir, tmp_path, action, filename
    ) -> None:
        """Only plain names inside --slot-save-path: traversal and absolute paths are 400 on filename."""
        response = await slot_app.test_client().post(f"/slots/0?action={action}", json={"filename": filename})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "filename"
        assert not (tmp_path / "x").exists()

    @pytest.mark.parametrize("id_slot", ["1", "-1", "x", "01x", "99999999999999999999"])
    async def test_bad_slot_id(self, slot_app, id_slot) -> None:
        response = await slot_app.test_client().post(f"/slots/{id_slot}?action=erase")
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "id_slot"

    async def test_bad_action(self, slot_app) -> None:
        response = await slot_app.test_client().post("/slots/0?action=load", json={"filename": "x"})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "action"

    async def test_missing_file(self, slot_app) -> None:
        response = await slot_app.test_client().post("/slots/0?action=restore", json={"filename": "none.bin"})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["param"] == "filename"

    async def test_file_of_another_model_of_the_same_shape(self, settings, make_runtime, slot_dir) -> None:
        """A file another model saved (same shape, other weights: a fine-tune) is 400 slot_file_model_mismatch."""
        other = attrs.evolve(fake_model_info(), description="other 1M")
        saver = attrs.evolve(
            make_runtime(), engine=FakeEngine(info=other), slot_files=_store(slot_dir, fingerprint="f" * 64)
        )
        app = await _serve(settings, saver)
        async with app.test_app() as client_app:
            await wait_until_ready(app)
            client = client_app.test_client()
            await _complete(client, "hello there")
            assert (await client.post("/slots/0?action=save", json={"filename": "o.bin"})).status_code == 200
        loader = attrs.evolve(make_runtime(), slot_files=_store(slot_dir))
        app = await _serve(settings, loader)
        async with app.test_app() as client_app:
            await wait_until_ready(app)
            response = await client_app.test_client().post(
                "/slots/0?action=restore", json={"filename": "o.bin"}
            )
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("slot_file_model_mismatch", "filename")
        assert "other 1M" in error["message"]
        assert loader.engine.kv == {}

    async def test_file_without_record(self, slot_app, slot_dir) -> None:
        """A file this server did not save (no model record beside it) is refused."""
        slot_dir.mkdir()
        (slot_dir / "foreign.bin").write_text(json.dumps({"fake_slot": [1, 2]}))
        response = await slot_app.test_client().post(
            "/slots/0?action=restore", json={"filename": "foreign.bin"}
        )
        assert response.status_code == 400
        assert (await response.get_json())["error"]["code"] == "slot_file_invalid"

    async def test_record_of_an_older_bubo(self, slot_app, slot_dir, fake_engine) -> None:
        """A record without a checksum (Bubo's first format) is refused: the file is saved again instead."""
        slot_dir.mkdir()
        (slot_dir / "old.bin").write_text(json.dumps({"fake_slot": [1, 2]}))
        old = {"model": {"description": fake_engine.info.description}, "n_tokens": 2}
        (slot_dir / "old.bin.bubo.json").write_text(json.dumps(old))
        response = await slot_app.test_client().post("/slots/0?action=restore", json={"filename": "old.bin"})
        assert response.status_code == 400
        assert (await response.get_json())["error"]["code"] == "slot_file_invalid"

    @pytest.mark.parametrize("spoil", ["truncate", "alter", "extend"])
    async def test_tampered_file(self, slot_app, slot_dir, fake_engine, spoil) -> None:
        """A state file cut short, altered or grown after its save is 400 slot_file_corrupt, never loaded."""
        client = slot_app.test_client()
        await _complete(client, "The quick brown fox jumps over the lazy dog")
        assert (await client.post("/slots/0?action=save", json={"filename": "fox.bin"})).status_code == 200
        await client.post("/slots/0?action=erase")
        state = slot_dir / "fox.bin"
        data = state.read_bytes()
        state.write_bytes(
            {
                "truncate": data[: len(data) // 2],
                "alter": data.replace(b"[", b"[9", 1),
                "extend": data + b" ",
            }[spoil]
        )
        response = await client.post("/slots/0?action=restore", json={"filename": "fox.bin"})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("slot_file_corrupt", "filename")
        assert fake_engine.kv == {}
        assert [p.name for p in slot_dir.iterdir()] == IsList(
            "fox.bin", "fox.bin.bubo.json", check_order=False
        )


class TestAdapters:
    @pytest.fixture(name="lora_app")
    async def _lora_app(self, settings, make_runtime, slot_dir, script):
        engine = FakeEngine(script=script, lora=[LoraAdapter(id=0, path="/adapters/style.gguf", scale=1.0)])
        runtime = attrs.evolve(make_runtime(), engine=engine, slot_files=_store(slot_dir))
        app = await _serve(settings, runtime)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            yield test_app

    async def test_restore_under_another_adapter_set(self, lora_app, slot_dir) -> None:
        """The record names the adapter set; restoring under another is 400 slot_file_adapter_mismatch."""
        client = lora_app.test_client()
        await _complete(client, "The quick brown fox")
        assert (await client.post("/slots/0?action=save", json={"filename": "fox.bin"})).status_code == 200
        record = SlotRecord.from_json((slot_dir / "fox.bin.bubo.json").read_text())
        assert record.adapters == ((0, 1.0),)
        assert (await client.post("/lora-adapters", json=[{"id": 0, "scale": 0.5}])).status_code == 200
        response = await client.post("/slots/0?action=restore", json={"filename": "fox.bin"})
        assert response.status_code == 400
        error = (await response.get_json())["error"]
        assert (error["code"], error["param"]) == ("slot_file_adapter_mismatch", "filename")
        assert "adapter 0 at 1" in error["message"]
        assert "adapter 0 at 0.5" in error["message"]
        assert (await client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])).status_code == 200
        response = await client.post("/slots/0?action=restore", json={"filename": "fox.bin"})
        assert response.status_code == 200


class TestQuota:
    async def _app(self, settings, make_runtime, store):
        return await _serve(settings, attrs.evolve(make_runtime(), slot_files=store))

    async def test_file_quota(self, settings, make_runtime, slot_dir) -> None:
        """Past --slot-save-max-files a new name is 507 slot_quota_exceeded; saving over a kept name is not."""
        app = await self._app(settings, make_runtime, _store(slot_dir, max_files=2))
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            client = test_app.test_client()
            await _complete(client, "The quick brown fox")
            for name in ("a.bin", "b.bin"):
                assert (await client.post("/slots/0?action=save", json={"filename": name})).status_code == 200
            response = await client.post("/slots/0?action=save", json={"filename": "c.bin"})
            assert response.status_code == 507
            error = (await response.get_json())["error"]
            assert (error["code"], error["type"], error["param"]) == (
                "slot_quota_exceeded", "server_error", "filename"
            )  # fmt: skip
            assert "--slot-save-max-files" in error["message"]
            assert (await client.post("/slots/0?action=save", json={"filename": "a.bin"})).status_code == 200
        assert sorted(p.name for p in slot_dir.iterdir()) == [
            "a.bin", "a.bin.bubo.json", "b.bin", "b.bin.bubo.json"
        ]  # fmt: skip

    async def test_byte_quota(self, settings, make_runtime, slot_dir) -> None:
        """A save whose file would pass --slot-save-max-mib is 507 and leaves nothing behind."""
        app = await self._app(settings, make_runtime, _store(slot_dir, max_bytes=64))
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            client = test_app.test_client()
            await _complete(client, "The quick brown fox jumps over the lazy dog")
            response = await client.post("/slots/0?action=save", json={"filename": "fox.bin"})
            assert response.status_code == 507
            error = (await response.get_json())["error"]
            assert error["code"] == "slot_quota_exceeded"
            assert "--slot-save-max-mib" in error["message"]
        assert list(slot_dir.iterdir()) == []


class TestSaveWhileTheClientLeaves:
    async def test_the_state_and_its_record_are_written_together(
        self, make_runtime, fake_engine, slot_dir, tokenizer
    ) -> None:
        """A client gone while the engine writes the state: the state and its record still take the name."""
        store = _store(slot_dir)
        runtime = attrs.evolve(make_runtime(), slot_files=store)
        slot_dir.mkdir()
        (slot_dir / "fox.bin.bubo.json").write_text(json.dumps({"model": {}, "n_tokens": 999}))
        fake_engine.kv[0] = tuple(tokenizer.encode("The quick brown fox"))
        engine_save = fake_engine.save_slot

        async def save_then_client_leaves(slot_id, to):
            saved = await engine_save(slot_id, to)  # the engine's save runs to its end regardless
            scope.cancel()
            return saved

        fake_engine.save_slot = save_then_client_leaves
        with trio.CancelScope() as scope:
            await save_slot(runtime, store, 0, slot_dir / "fox.bin")
        record = SlotRecord.from_json((slot_dir / "fox.bin.bubo.json").read_text())
        assert (record.fingerprint, record.n_tokens) == (MODEL_FINGERPRINT, len(fake_engine.kv[0]))
        assert record.size_bytes == (slot_dir / "fox.bin").stat().st_size
        assert sorted(p.name for p in slot_dir.iterdir()) == ["fox.bin", "fox.bin.bubo.json"]


class TestAFileCallThatHangs:
    """llama.cpp's file call never returns (a hung disk): the action's wait is bounded, nothing else hangs."""

    async def test_the_action_fails_at_its_bound_the_engine_is_lost_and_shutdown_completes(
        self, settings, make_runtime, script, slot_dir, mock_clock
    ) -> None:
        engine = FakeEngine(script=script, n_slots=2)
        runtime = attrs.evolve(make_runtime(), engine=engine, slot_files=_store(slot_dir))
        app = await _serve(settings, runtime)
        answers = {}
        both_ended = threading.Event()
        with HangingCall() as file_call:
            script.slot_file_call = file_call
            async with app.test_app() as test_app:
                await wait_until_ready(app)
                client = test_app.test_client()

                async def save() -> None:
                    answers["save"] = await client.post("/slots/0?action=save", json={"filename": "fox.bin"})
                    if len(answers) == 2:
                        both_ended.set()

                async def stream() -> None:
                    body = {"prompt": "hello", "id_slot": 1, "stream": True}
                    answers["stream"] = await client.post("/completion", json=body)
                    if len(answers) == 2:
                        both_ended.set()

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(save)
                    await file_call.wait_stuck()
                    other = await client.post("/completion", json={"prompt": "hello", "id_slot": 1})
                    assert other.status_code == 200  # the other slot serves on meanwhile
                    script.piece_delay = 1.0  # a stream in the other slot is running when the bound passes
                    nursery.start_soon(stream)
                    await trio.testing.wait_all_tasks_blocked()
                    mock_clock.jump(engine.slot_action_wait_s)
                    # both end without more (trio) time passing; the bound is only on the test's own wait
                    assert await trio.to_thread.run_sync(both_ended.wait, WAIT_S)
                assert answers["save"].status_code == 500
                assert (await answers["save"].get_json())["error"]["code"] == "engine_error"
                frames = (await answers["stream"].get_data()).decode().split("\n\n")
                last = json.loads([f for f in frames if f.startswith("data: ")][-1].removeprefix("data: "))
                assert last["error"]["code"] == "device_lost"  # ended at once, not left to its client
                health = await client.get("/health")
                assert (health.status_code, await health.get_json()) == (503, {"status": "device_lost"})
                later = await client.post("/completion", json={"prompt": "hello", "id_slot": 1})
                assert (later.status_code, (await later.get_json())["error"]["code"]) == (503, "device_lost")
            assert engine.closed  # the app's shutdown closed the engine, the call still hanging
            assert file_call.returned == 0
