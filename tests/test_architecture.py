"""The layers import downward only (docs/design.md, "Layers")."""

from __future__ import annotations

import ast
import itertools
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src" / "bubo"
DESIGN = SRC.parent.parent / "docs" / "design.md"

# package -> the bubo packages it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "domain": set(),
    "errors": set(),
    "model": {"domain", "errors"},
    "tokenizer": {"domain", "errors"},
    "templates": {"domain", "errors"},
    "grammar": {"domain", "errors"},
    "parsers": {"domain", "errors", "grammar"},
    "machine": set(),
    "engine": {"domain", "errors", "grammar", "machine"},
    "service": {"domain", "errors", "engine", "grammar", "model", "tokenizer", "templates", "parsers"},
    "api": {"domain", "errors", "engine", "model", "service"},
    "config": {"domain", "errors", "machine", "model", "parsers"},
    "loader": {
        "config",
        "domain",
        "engine",
        "errors",
        "model",
        "parsers",
        "service",
        "templates",
        "tokenizer",
    },
    "transport": {"api", "errors"},
    "server": {"domain", "errors", "api", "config", "loader", "model", "service"},
    "router": {"domain", "errors", "api", "config", "model", "server", "service"},
    "_logging": set(),
    "app": {"_logging", "config", "router", "server"},
    "cli": {"_logging", "config", "domain", "errors", "router", "server", "transport"},
    "__main__": {"cli"},
    "__init__": set(),
}
# third-party packages only some layers may touch
RESTRICTED = {
    "llama_cpp": {"engine"},
    "quart": {"api", "router", "server"},
    "quart_trio": {"api", "router", "server"},
    "hypercorn": {"cli", "transport"},
    "jinja2": {"templates"},
    "tokenizers": {"tokenizer"},
    "prometheus_client": {"api"},
    "PIL": {"engine"},
}
# The engine modules that hold llama.cpp objects.  The rest of the engine (the decode loop, a
# generation and its parts, slots, the fake engine) is written against engine/_protocols.py and is
# tested without a model: at module level it reaches neither llama_cpp nor one of these.
NATIVE_ENGINE = {
    "_draft_model",
    "llama",
    "_context",
    "_kv",
    "_kv_cells",
    "_kv_tiers",
    "_sampler",
    "_dry_stages",
    "_embedder",
    "_projector",
    "_projector_load",
    "_image_decoder",
    "_vision",
    "_grammar",
    "probe",
    "vocab",
    "_probe_child",
    "_loaded",
    "_lasting",
    "_model_info",
    "_current_load",
    "_producer",
    "_sequence_jobs",
}
DIALECTS = tuple(sorted(p.name for p in (SRC / "api").iterdir() if p.is_dir() and not p.name.startswith("_")))


def modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def layer_of(path: Path) -> str:
    parts = path.relative_to(SRC).with_suffix("").parts
    return parts[0]


def imports_of(path: Path, *, at_import: bool = False) -> set[str]:
    """What *path* imports anywhere, or (*at_import*) only in statements that run when it is imported."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = ["bubo", *path.relative_to(SRC).parent.parts]
    found: set[str] = set()
    for node in tree.body if at_import else ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
    return found


ENGINE_MODULES = sorted(p.stem for p in (SRC / "engine").glob("*.py") if p.stem != "__init__")


@pytest.mark.parametrize("name", [m for m in ENGINE_MODULES if m not in NATIVE_ENGINE])
def test_the_engine_logic_needs_no_model(name: str) -> None:
    """Importing the decode loop, a generation's parts or the fake engine reaches no native module."""
    seen, todo = set(), [name]
    while todo:
        module = todo.pop()
        seen.add(module)
        for imported in imports_of(SRC / "engine" / f"{module}.py", at_import=True):
            assert imported.partition(".")[0] != "llama_cpp", f"{module} imports llama_cpp (from {name})"
            if imported.startswith("bubo.engine."):
                target = imported.removeprefix("bubo.engine.").partition(".")[0]
                assert target not in NATIVE_ENGINE, f"{module} imports engine.{target} (from {name})"
                if target not in seen:
                    todo.append(target)


MAX_ENGINE_CLASS_LINES = 200


def test_no_engine_class_passes_200_lines() -> None:
    """Every engine class stays small: a class past 200 lines has more than one role."""
    over = {
        f"{path.stem}.{node.name}": node.end_lineno - node.lineno + 1
        for path in sorted((SRC / "engine").glob("*.py"))
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.ClassDef)
        and node.end_lineno is not None
        and node.end_lineno - node.lineno + 1 > MAX_ENGINE_CLASS_LINES
    }
    assert over == {}


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_imports_point_down(path: Path) -> None:
    """Each module imports only the layers beneath it."""
    layer = layer_of(path)
    assert layer in ALLOWED, f"{layer} has no place in the layer table"
    allowed = ALLOWED[layer]
    for name in imports_of(path):
        top, _, rest = name.partition(".")
        if top == "bubo":
            target = rest.partition(".")[0]
            assert target in allowed | {layer}, f"{layer} must not import bubo.{target}"
        if top in RESTRICTED:
            assert layer in RESTRICTED[top], f"{layer} must not import {top}"


@pytest.mark.parametrize("dialect", DIALECTS)
def test_dialects_do_not_import_each_other(dialect: str) -> None:
    """A dialect translates to the domain, never through another dialect."""
    folder = SRC / "api" / dialect
    others = {f"bubo.api.{d}" for d in DIALECTS if d != dialect}
    for path in folder.rglob("*.py"):
        for name in imports_of(path):
            assert not any(name == o or name.startswith(o + ".") for o in others), (
                f"{path.name} imports {name}"
            )


@pytest.mark.parametrize(
    "path",
    [p for p in (SRC / "api").rglob("*.py") if p.relative_to(SRC / "api").parts[0] not in DIALECTS],
    ids=lambda p: str(p.relative_to(SRC)),
)
def test_what_dialects_share_imports_no_dialect(path: Path) -> None:
    """The api modules beside the dialects (ops, debug, the shared private ones) import none of them."""
    dialects = {f"bubo.api.{d}" for d in DIALECTS}
    for name in imports_of(path):
        assert not any(name == d or name.startswith(d + ".") for d in dialects), f"imports {name}"


def layer_table() -> dict[str, set[str]]:
    """docs/design.md's layer table: each package and what it may import."""
    lines = DESIGN.read_text(encoding="utf-8").splitlines()
    start = lines.index("| package | may import | job |") + 2
    table: dict[str, set[str]] = {}
    for line in itertools.takewhile(lambda row: row.startswith("|"), lines[start:]):
        package, may_import = (cell.strip() for cell in line.strip("|").split("|")[:2])
        name = package.strip("`").removesuffix("/").removesuffix(".py")
        table[name] = set() if may_import == "nothing of Bubo" else {n.strip() for n in may_import.split(",")}
    return table


def test_the_layer_table_in_the_design_doc_is_this_one() -> None:
    """docs/design.md lists every layer with exactly what this test allows it."""
    assert layer_table() == {layer: allowed for layer, allowed in ALLOWED.items() if layer != "__init__"}


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(SRC)))
def test_the_request_converter_is_built_once_at_import_by_the_server(path: Path) -> None:
    """``server.REQUEST_CONVERTER`` is the one request converter: no route or other module builds one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    builds = [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "make_converter"
    ]
    at_import = [
        node.lineno
        for statement in tree.body
        if not isinstance(statement, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        for node in ast.walk(statement)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "make_converter"
    ]
    if path.relative_to(SRC) == Path("server.py"):
        assert builds == at_import, "server.py builds REQUEST_CONVERTER at import"
        assert len(builds) == 1, "server.py builds one converter"
    else:
        assert builds == [], (
            f"lines {builds} build a converter; read bodies with read_body(runtime, cls, ...)"
        )


def test_importing_the_app_loads_no_model() -> None:
    """`import bubo.app` builds the app without loading llama.cpp or the model."""
    code = "import sys, bubo.app; assert 'llama_cpp' not in sys.modules, 'llama_cpp imported'"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
