"""The child's side of the router's contract: the socket it is handed (stopping is in test_router_app.py)."""

from __future__ import annotations

import pytest

from bubo.cli import serve_binds
from bubo.config import ConfigError, load_settings
from bubo.router.child import inherited_listener


def test_a_router_s_child_serves_on_the_socket_it_was_handed() -> None:
    """The descriptor in BUBO_ROUTER_LISTEN_FD is the child's one listener, whatever --host/--port say."""
    environ = {"BUBO_ROUTER_CHILD": "1", "BUBO_ROUTER_LISTEN_FD": "5"}
    assert inherited_listener(environ) == 5
    settings = load_settings({"server__port": "4321", "router__models_dir": "."}, environ={})
    assert serve_binds(settings, environ) == ["fd://5"]


def test_any_other_server_binds_its_own_addresses() -> None:
    """Without the router's mark the variable means nothing: --host and --port are bound."""
    environ = {"BUBO_ROUTER_LISTEN_FD": "5"}
    assert inherited_listener(environ) is None
    settings = load_settings(
        {"server__port": "4321", "server__hosts": "127.0.0.1,::1", "router__models_dir": "."}, environ={}
    )
    assert serve_binds(settings, environ) == ["127.0.0.1:4321", "[::1]:4321"]


@pytest.mark.parametrize("value", [None, "", "x", "-1"])
def test_a_router_s_child_without_its_socket_does_not_bind_one(value: str | None) -> None:
    """A child must never pick a port itself (another process could have it): it refuses to start."""
    environ = {"BUBO_ROUTER_CHILD": "1"}
    if value is not None:
        environ["BUBO_ROUTER_LISTEN_FD"] = value
    with pytest.raises(ConfigError, match="BUBO_ROUTER_LISTEN_FD"):
        inherited_listener(environ)
