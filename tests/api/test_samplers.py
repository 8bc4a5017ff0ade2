"""llama.cpp's samplers on the wire: every dialect that has them takes them, /props and generation_settings
show them, bad values are a 400 naming the field (over the fake engine)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
from quart_trio import QuartTrio

from bubo.api._numbers import MAX_DRY_SEQUENCE_BREAKERS, MAX_SAMPLERS
from bubo.config import Settings, load_settings
from bubo.domain.sampling import SamplingParams
from bubo.engine.fake import FakeEngine

from ..conftest import RuntimeFactory, serving_app

# every new field, set to a value other than its default
FIELDS: dict[str, Any] = {
    "dynatemp_range": 0.5,
    "dynatemp_exponent": 2.0,
    "typical_p": 0.9,
    "xtc_probability": 0.5,
    "xtc_threshold": 0.2,
    "top_n_sigma": 1.5,
    "mirostat": 2,
    "mirostat_tau": 3.0,
    "mirostat_eta": 0.2,
    "dry_multiplier": 0.8,
    "dry_base": 2.0,
    "dry_allowed_length": 3,
    "dry_penalty_last_n": 128,
    "dry_sequence_breakers": ["\n", "###"],
}
EXPECTED = {**FIELDS, "dry_sequence_breakers": ("\n", "###")}

ROUTES = {
    "/completion": {"prompt": "Hi", "n_predict": 2},
    "/v1/completions": {"model": "bubo", "prompt": "Hi", "max_tokens": 2},
    "/v1/chat/completions": {
        "model": "bubo",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 2,
    },
}


def chosen(sampling: SamplingParams) -> dict[str, Any]:
    return {name: getattr(sampling, name) for name in EXPECTED}


@pytest.mark.parametrize("route", ROUTES)
class TestFields:
    async def test_every_sampler_field_reaches_the_engine(self, app, fake_engine: FakeEngine, route) -> None:
        """Each of llama.cpp's samplers is taken on /completion and, as llama-server does, on the OpenAI routes."""
        response = await app.test_client().post(route, json={**ROUTES[route], **FIELDS})
        assert response.status_code == 200, await response.get_json()
        assert chosen(fake_engine.requests[-1].sampling) == EXPECTED

    @pytest.mark.parametrize(
        ("samplers", "order"),
        [
            (["top_k", "temperature"], ("top_k", "temperature")),
            (["temp", "typical", "nucleus", "min-p"], ("temperature", "typ_p", "top_p", "min_p")),
            ("dkypmxt", ("dry", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")),
            ("es", ("penalties", "top_n_sigma")),
            ([], ()),
        ],
    )
    async def test_samplers_as_names_or_letters(self, app, fake_engine, route, samplers, order) -> None:
        """samplers is a list of stage names (llama.cpp's other spellings too) or a string of letters."""
        response = await app.test_client().post(route, json={**ROUTES[route], "samplers": samplers})
        assert response.status_code == 200
        assert fake_engine.requests[-1].sampling.samplers == order

    async def test_ignore_eos(self, app, fake_engine, route) -> None:
        """ignore_eos is honoured on every route (llama-server takes it on the OpenAI ones too)."""
        response = await app.test_client().post(route, json={**ROUTES[route], "ignore_eos": True})
        assert response.status_code == 200
        assert fake_engine.requests[-1].ignore_eos

    @pytest.mark.parametrize(
        ("fields", "param"),
        [
            ({"mirostat": 3}, "mirostat"),
            ({"mirostat": -1}, "mirostat"),
            ({"typical_p": 1.5}, "typical_p"),
            ({"xtc_probability": -0.1}, "xtc_probability"),
            ({"xtc_threshold": 2.0}, "xtc_threshold"),
            ({"dry_allowed_length": -1}, "dry_allowed_length"),
            ({"dry_penalty_last_n": -2}, "dry_penalty_last_n"),
            ({"dry_multiplier": 1e39}, "dry_multiplier"),
            ({"dry_sequence_breakers": []}, "dry_sequence_breakers"),
            ({"dry_sequence_breakers": ["a", ""]}, "dry_sequence_breakers[1]"),
            ({"dry_sequence_breakers": ["a\u0000b"]}, "dry_sequence_breakers[0]"),
            ({"dry_sequence_breakers": ["x"] * (MAX_DRY_SEQUENCE_BREAKERS + 1)}, "dry_sequence_breakers"),
            ({"dry_sequence_breakers": "\n"}, "dry_sequence_breakers"),
            ({"samplers": ["top_k", "nope"]}, "samplers[1]"),
            ({"samplers": "kq"}, "samplers"),
            ({"samplers": ["top_k"] * (MAX_SAMPLERS + 1)}, "samplers"),
            ({"samplers": [1]}, "samplers[0]"),
        ],
    )
    async def test_bad_values_are_a_400_naming_the_field(
        self, app, fake_engine, route, fields, param
    ) -> None:
        """A value out of range, an unknown sampler or an empty breaker list: 400 with the field as param."""
        response = await app.test_client().post(route, json={**ROUTES[route], **fields})
        assert response.status_code == 400
        body = await response.get_json()
        assert body["error"]["param"] == param, body
        assert not fake_engine.requests


class TestShown:
    async def test_generation_settings_show_what_the_request_ran_with(self, app) -> None:
        """/completion's generation_settings carry every sampler field, by llama-server's names."""
        body = await (
            await app.test_client().post(
                "/completion", json={**ROUTES["/completion"], **FIELDS, "samplers": "kt"}
            )
        ).get_json()
        settings = body["generation_settings"]
        assert {name: settings[name] for name in FIELDS} == FIELDS
        assert settings["samplers"] == ["top_k", "temperature"]

    async def test_props_show_the_server_defaults(self, flagged_app) -> None:
        """/props' default_generation_settings.params show the sampler flags the server was started with."""
        params = (await (await flagged_app.test_client().get("/props")).get_json())[
            "default_generation_settings"
        ]["params"]
        assert {name: params[name] for name in FLAG_VALUES} == FLAG_VALUES
        assert params["samplers"] == ["penalties", "top_k", "typ_p", "temperature"]
        assert params["dry_sequence_breakers"] == ["\n", "::"]

    async def test_a_request_overrides_the_flags(self, flagged_app, fake_engine) -> None:
        """The flags are defaults: a request's own value wins, the rest keep the flags'."""
        await flagged_app.test_client().post(
            "/completion", json={"prompt": "Hi", "n_predict": 1, "mirostat": 0}
        )
        sampling = fake_engine.requests[-1].sampling
        assert (sampling.mirostat, sampling.typical_p, sampling.dry_multiplier) == (0, 0.7, 0.6)


FLAG_VALUES = {
    "dynatemp_range": 0.25,
    "dynatemp_exponent": 1.5,
    "typical_p": 0.7,
    "top_n_sigma": 2.0,
    "xtc_probability": 0.4,
    "xtc_threshold": 0.3,
    "mirostat": 1,
    "mirostat_tau": 4.0,
    "mirostat_eta": 0.05,
    "dry_multiplier": 0.6,
    "dry_base": 1.5,
    "dry_allowed_length": 4,
    "dry_penalty_last_n": 256,
}
FLAGS = {
    "generation__sampling__dynatemp_range": "0.25",
    "generation__sampling__dynatemp_exponent": "1.5",
    "generation__sampling__typical_p": "0.7",
    "generation__sampling__top_n_sigma": "2",
    "generation__sampling__xtc_probability": "0.4",
    "generation__sampling__xtc_threshold": "0.3",
    "generation__sampling__mirostat": "1",
    "generation__sampling__mirostat_tau": "4",
    "generation__sampling__mirostat_eta": "0.05",
    "generation__sampling__dry_multiplier": "0.6",
    "generation__sampling__dry_base": "1.5",
    "generation__sampling__dry_allowed_length": "4",
    "generation__sampling__dry_penalty_last_n": "256",
    "generation__sampling__dry_sequence_breakers": ["\n", "::"],
    "generation__sampling__samplers__letters": "ekyt",
}


@pytest.fixture(name="flagged_app")
async def _flagged_app(make_runtime: RuntimeFactory) -> AsyncIterator[QuartTrio]:
    """The app over the fake engine, started with every sampler flag."""
    settings: Settings = load_settings(FLAGS, environ={})
    runtime = attrs.evolve(make_runtime(), defaults=settings.generation)
    async with serving_app(settings, runtime) as test_app:
        yield test_app
