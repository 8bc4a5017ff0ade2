"""Checks run only under ``-p _fake_knob`` over a copy of Bubo that declares the fake knob's fields
(``test_sampler_table.py`` runs them): the knob added to the sampler table and declared in
``SamplingParams`` and ``SamplingOverrides`` reaches config, every request body that takes
llama-server's samplers, the reading of requests, ``generation_settings``, ``/props`` and the chat
page, with nothing else declared."""

from __future__ import annotations

import attrs
import pytest
from quart_trio import QuartTrio
from tests._knob_agreement import disagreements

from bubo.api._chat.wire import ChatCompletionRequest
from bubo.api.llamacpp import wire as llamacpp_wire
from bubo.api.ollama.options import generation_options
from bubo.api.openai import wire as openai_wire
from bubo.api.webui import ASSETS
from bubo.config import OPTIONS, ConfigError, load_settings, options_table, serve_flag_values
from bubo.domain.samplers import KNOBS
from bubo.engine.fake import FakeEngine
from bubo.errors import InvalidRequest

FAKE = "fake_knob"
HI = [{"role": "user", "content": "Hi"}]


def test_the_plugin_added_the_knob() -> None:
    assert KNOBS[-1].name == FAKE


def test_the_table_and_the_declarations_agree() -> None:
    """The copy of Bubo under test declares the fake knob (Bubo's own source would disagree)."""
    assert disagreements(KNOBS) == []


def test_config_has_its_flag_variable_default_and_range() -> None:
    option = next(option for option in OPTIONS if "--fake-knob" in option.flags)
    assert (option.env, option.dest) == ("BUBO_FAKE_KNOB", ("generation", "sampling", FAKE))
    assert (
        "| `--fake-knob` | `BUBO_FAKE_KNOB` | a knob only the sampler table's test has (0.25) |"
        in options_table()
    )
    assert getattr(load_settings({}, environ={}).generation.sampling, FAKE) == 0.25
    flagged = load_settings(serve_flag_values(["--fake-knob", "0.5"]), environ={})
    assert getattr(flagged.generation.sampling, FAKE) == 0.5
    with pytest.raises(
        ConfigError, match=r"^BUBO_FAKE_KNOB: fake_knob must be at least 0 and at most 1, got 2"
    ):
        load_settings({}, environ={"BUBO_FAKE_KNOB": "2"})


@pytest.mark.parametrize(
    "body", [ChatCompletionRequest, openai_wire.CompletionRequest, llamacpp_wire.CompletionRequest]
)
def test_every_llama_server_body_has_the_field(body: type) -> None:
    assert attrs.fields_dict(body)[FAKE].type == float | None


@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/completion", {"prompt": "Hi", "n_predict": 1}),
        ("/v1/completions", {"model": "bubo", "prompt": "Hi", "max_tokens": 1}),
        ("/v1/chat/completions", {"model": "bubo", "messages": HI, "max_tokens": 1}),
    ],
)
async def test_a_request_sets_it_and_a_value_out_of_range_is_refused_by_name(
    app: QuartTrio, fake_engine: FakeEngine, route: str, body: dict[str, object]
) -> None:
    response = await app.test_client().post(route, json={**body, FAKE: 0.75})
    assert response.status_code == 200, await response.get_json()
    assert getattr(fake_engine.requests[-1].sampling, FAKE) == 0.75
    refused = await app.test_client().post(route, json={**body, FAKE: 1.5})
    assert refused.status_code == 400
    assert (await refused.get_json())["error"]["param"] == FAKE


async def test_ollama_options_take_it_under_its_own_key(app: QuartTrio, fake_engine: FakeEngine) -> None:
    body = {"model": "bubo", "messages": HI, "stream": False}
    response = await app.test_client().post("/api/chat", json={**body, "options": {"fake_knob_option": 0.5}})
    assert response.status_code == 200, await response.get_json()
    assert getattr(fake_engine.requests[-1].sampling, FAKE) == 0.5
    refused = await app.test_client().post("/api/chat", json={**body, "options": {"fake_knob_option": -1}})
    assert refused.status_code == 400
    assert (await refused.get_json())["error"] == "fake_knob must be at least 0 and at most 1, got -1"
    with pytest.raises(InvalidRequest) as error:  # Ollama's error shape has no param: the one raised has
        generation_options({"fake_knob_option": -1})
    assert error.value.param == "options.fake_knob_option"


async def test_generation_settings_and_props_show_it(app: QuartTrio) -> None:
    response = await app.test_client().post("/completion", json={"prompt": "Hi", "n_predict": 1, FAKE: 0.75})
    assert (await response.get_json())["generation_settings"][FAKE] == 0.75
    props = await (await app.test_client().get("/props")).get_json()
    assert props["default_generation_settings"]["params"][FAKE] == 0.25


def test_the_chat_page_lists_it() -> None:
    assert '["fake_knob", "Fake knob", "float", 0.05]' in ASSETS["samplers.js"].decode()
