"""Model statuses in llama-server's shapes, through unloaded → loading → loaded → unloaded or failed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bubo.errors import InvalidRequest, NotFound
from bubo.router.catalog import CatalogEntry
from bubo.router.registry import Instance, ModelRecord, Registry, exit_code_of

ARGS = ("python", "-m", "bubo", "serve", "--model", "/m/a.gguf")


def _registry(*names: str) -> Registry:
    return Registry.of(CatalogEntry(name=n, path=Path(f"/m/{n}.gguf")) for n in names)


def _start(record: ModelRecord, now: float = 0.0) -> Instance:
    instance = Instance(model=record.name, port=1234, args=ARGS)
    record.start(instance, now)
    return instance


def test_a_model_never_loaded_is_plainly_unloaded() -> None:
    """{"value": "unloaded"}, no args."""
    record = _registry("a").get("a")
    assert record.status() == {"value": "unloaded"}


def test_loading_then_loaded_show_the_child_s_args() -> None:
    """While the child starts, loading with its command line; once /ready answered, loaded."""
    record = _registry("a").get("a")
    instance = _start(record)
    assert record.status() == {"value": "loading", "args": list(ARGS)}
    instance.mark_loaded({"context_length": 512, "id": "ignored"})
    assert record.status() == {"value": "loaded", "args": list(ARGS)}
    described = record.describe(created=7)
    assert described["context_length"] == 512  # the child's own fields are added
    assert described["id"] == "a"  # but never replace the router's


def test_an_unload_the_router_asked_for_is_no_failure() -> None:
    """A requested stop ends unloaded, without failed or exit_code, whatever the exit status."""
    record = _registry("a").get("a")
    instance = _start(record)
    instance.mark_loaded({})
    instance.request_stop()
    instance.mark_exited(137)
    record.finish(instance)
    assert record.status() == {"value": "unloaded", "args": list(ARGS)}


def test_a_child_that_dies_marks_the_model_failed_with_its_exit_code() -> None:
    """llama-server's failed shape: unloaded, failed: true, exit_code."""
    record = _registry("a").get("a")
    instance = _start(record)
    instance.mark_loaded({})
    instance.mark_exited(exit_code_of(-9))
    record.finish(instance)
    assert record.status() == {"value": "unloaded", "args": list(ARGS), "failed": True, "exit_code": 137}
    assert "context_length" not in record.describe(created=7)


def test_loading_again_after_a_failure_clears_it() -> None:
    """The next load shows loading, not the old failure."""
    record = _registry("a").get("a")
    first = _start(record)
    first.mark_exited(1)
    record.finish(first)
    _start(record)
    assert record.status() == {"value": "loading", "args": list(ARGS)}


@pytest.mark.parametrize(("returncode", "reported"), [(0, 0), (1, 1), (-9, 137), (-15, 143)])
def test_exit_codes_read_as_shells_and_llama_server_report_them(returncode: int, reported: int) -> None:
    """A signal N reads 128 + N."""
    assert exit_code_of(returncode) == reported


def test_unknown_and_missing_models_are_404_and_400() -> None:
    """model_not_found names the models there are; missing_model when there is no name."""
    registry = _registry("a", "b")
    with pytest.raises(NotFound) as not_found:
        registry.get("c")
    assert not_found.value.code == "model_not_found"
    assert "'a', 'b'" in not_found.value.message
    with pytest.raises(InvalidRequest) as missing:
        registry.get(None)
    assert missing.value.code == "missing_model"


def test_a_request_without_model_goes_to_the_one_loaded_model_only() -> None:
    """With exactly one model loaded it is chosen; with none or several, 400 missing_model."""
    registry = _registry("a", "b")
    with pytest.raises(InvalidRequest):
        registry.only_loaded()
    _start(registry.get("a")).mark_loaded({})
    assert registry.only_loaded() is registry.get("a")
    _start(registry.get("b")).mark_loaded({})
    with pytest.raises(InvalidRequest) as several:
        registry.only_loaded()
    assert "'a', 'b'" in several.value.message


def test_an_alias_names_its_model() -> None:
    """A preset's alias is looked up like the model's name."""
    registry = Registry.of([CatalogEntry(name="a", path=Path("/m/a.gguf"), aliases=("fast", "small"))])
    assert registry.get("fast") is registry.get("a") is registry.get("small")
    assert registry.get("a").describe(created=1)["aliases"] == ["fast", "small"]


def test_a_deduplicated_entry_is_served_but_not_listed() -> None:
    """dedup-cache-models hides an entry from GET /models; requests still reach it."""
    registry = Registry.of(
        [
            CatalogEntry(name="a", path=Path("/m/a.gguf")),
            CatalogEntry(name="b", path=Path("/m/a.gguf"), listed=False),
        ]
    )
    assert [r.name for r in registry.listed()] == ["a"]
    assert registry.get("b").name == "b"


class TestReload:
    def test_models_not_running_are_added_updated_and_removed(self) -> None:
        """A reload replaces what does not run at once."""
        registry = _registry("a", "b")
        stopped = registry.reload(
            [CatalogEntry(name="b", path=Path("/m/b2.gguf")), CatalogEntry(name="c", path=Path("/m/c.gguf"))]
        )
        assert stopped == []
        assert sorted(registry.records) == ["b", "c"]
        assert registry.get("b").entry.path == Path("/m/b2.gguf")

    def test_running_models_stay_unless_changed_or_gone(self) -> None:
        """Unchanged: keeps running; changed: unloaded, loads anew later; gone: unloaded, then dropped."""
        registry = _registry("same", "changed", "gone")
        same, changed, gone = (registry.get(n) for n in ("same", "changed", "gone"))
        instances = [_start(record) for record in (same, changed, gone)]
        stopped = registry.reload(
            [
                CatalogEntry(name="same", path=Path("/m/same.gguf")),
                CatalogEntry(name="changed", path=Path("/m/new.gguf")),
            ]
        )
        assert stopped == [changed, gone]
        assert registry.get("changed") is changed
        assert changed.entry.path == Path("/m/new.gguf")
        with pytest.raises(NotFound):
            registry.get("gone")
        assert gone in registry.running()  # it still counts under --models-max until it has exited
        instances[2].mark_exited(0)
        gone.finish(instances[2])
        registry.forget(instances[2])
        assert gone not in registry.running()
