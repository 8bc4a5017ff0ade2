"""--models-dir without -m chooses router mode; its flags parse like every other."""

from __future__ import annotations

from pathlib import Path

import pytest

from bubo.config import ConfigError, load_settings
from bubo.router import create_router_app


def test_models_dir_without_model_is_router_mode(tmp_path: Path) -> None:
    """No default model is looked for; the router's defaults are llama-server's."""
    settings = load_settings({"router__models_dir": str(tmp_path)}, environ={})
    assert settings.router_mode
    assert settings.model.path is None
    assert (settings.router.models_max, settings.router.models_autoload) == (4, True)
    assert not settings.router.models_allow_extra_args


def test_a_model_wins_over_the_models_dir(tmp_path: Path, model_path: Path) -> None:
    """With -m, Bubo serves that model alone."""
    settings = load_settings(
        {"router__models_dir": str(tmp_path), "model__path": str(model_path)}, environ={}
    )
    assert not settings.router_mode


def test_router_flags_come_from_the_environment_too(tmp_path: Path) -> None:
    """BUBO_MODELS_DIR, BUBO_MODELS_MAX, BUBO_MODELS_AUTOLOAD."""
    environ = {"BUBO_MODELS_DIR": str(tmp_path), "BUBO_MODELS_MAX": "0", "BUBO_MODELS_AUTOLOAD": "off"}
    settings = load_settings({}, environ=environ)
    assert settings.router_mode
    assert (settings.router.models_max, settings.router.models_autoload) == (0, False)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"router__models_dir": "/no/such/dir"}, "--models-dir: no such directory"),
        ({"router__models_max": "-1"}, "models_max must not be negative"),
        ({"router__models_load_timeout": "0"}, "models_load_timeout must be above 0"),
    ],
)
def test_bad_router_values_are_one_line_errors(values: dict[str, str], message: str) -> None:
    """Each bad value names its flag or setting."""
    with pytest.raises(ConfigError, match=message):
        load_settings(values, environ={})


def test_the_router_serves_every_route_of_the_single_model_app(tmp_path: Path) -> None:
    """Each path a model serves is forwarded (or answered by the router), with the same methods."""
    from bubo.server import create_app

    settings = load_settings({"router__models_dir": str(tmp_path)}, environ={})
    router_rules = {rule.rule: rule.methods for rule in create_router_app(settings).url_map.iter_rules()}
    for rule in create_app(settings).url_map.iter_rules():
        assert rule.rule in router_rules, rule.rule
        assert rule.methods is not None
        assert rule.methods <= (router_rules[rule.rule] or set()) | {"HEAD", "OPTIONS"}, rule.rule
