"""llama.cpp's samplers and default constraints through a real `bubo serve`: httpx on /completion, the OpenAI
SDK's extra_body on chat, the flags shown in /props, bad values answered with a 400 by a server that stays up."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import openai
import pytest

from .conftest import Server, openai_client, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "maxLength": 12}},
    "required": ["answer"],
    "additionalProperties": False,
}
PROMPT = "Answer in JSON. What is the capital of France?"
USER = [{"role": "user", "content": "What is the capital of France?"}]
# Mirostat 2.0 aiming at almost no surprise keeps only the likeliest token: any seed samples the greedy answer
LOW_SURPRISE = {"temperature": 1.0, "mirostat": 2, "mirostat_tau": 0.01}


@pytest.fixture(name="server", scope="module")
def _server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """`bubo serve` with a default JSON schema and sampler flags in llama-server's spellings."""
    flags = ("-c", "1024", "--json-schema", json.dumps(SCHEMA), "--sampler-seq", "edkypmxt")
    flags += ("--dry-multiplier", "0.8", "--dry-sequence-breaker", "\n", "--dry-sequence-breaker", "###")
    with serving(tmp_path_factory.mktemp("samplers") / "serve.log", *flags, "--typical", "0.95") as server:
        yield server


@pytest.fixture(name="http")
def _http(server: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as client:
        yield client


def test_props_show_the_flags(http: httpx.Client) -> None:
    """/props' default_generation_settings.params carry the sampler flags the server started with."""
    params = http.get("/props").json()["default_generation_settings"]["params"]
    assert (params["dry_multiplier"], params["typical_p"]) == (0.8, 0.95)
    assert params["dry_sequence_breakers"] == ["\n", "###"]
    assert params["samplers"] == [
        "penalties",
        "dry",
        "top_k",
        "typ_p",
        "top_p",
        "min_p",
        "xtc",
        "temperature",
    ]


def test_the_default_schema_constrains_completion(http: httpx.Client) -> None:
    """--json-schema constrains a /completion that sets no constraint: the answer parses and fits the schema."""
    content = http.post("/completion", json={"prompt": PROMPT, "n_predict": 48, "seed": 3}).json()["content"]
    answer = json.loads(content)
    assert set(answer) == {"answer"}
    assert len(answer["answer"]) <= 12


def test_completion_samplers_and_its_own_grammar(http: httpx.Client) -> None:
    """A request's grammar replaces the default; Mirostat aiming at no surprise samples the greedy answer, and
    generation_settings show what ran."""
    grammar = 'root ::= "Paris" | "Lyon" | "Nice" | "London"'
    body = {"prompt": "The capital of France is", "n_predict": 4, "grammar": grammar}
    greedy = http.post("/completion", json={**body, "temperature": 0}).json()
    assert greedy["content"] in {"Paris", "Lyon", "Nice", "London"}
    for seed in (1, 2):
        answer = http.post("/completion", json={**body, **LOW_SURPRISE, "seed": seed}).json()
        assert answer["content"] == greedy["content"]
        settings = answer["generation_settings"]
        assert (settings["mirostat"], settings["mirostat_tau"], settings["seed"]) == (2, 0.01, seed)


def test_chat_takes_the_samplers_in_extra_body(server: Server) -> None:
    """The OpenAI SDK sends llama-server's sampler fields in extra_body; chat honours them.  (Mirostat drops
    the other stages, the server's DRY among them, so the greedy answer it matches is one without DRY.)"""
    grammar = "root ::= [a-z ]+"
    with openai_client(server) as client:
        greedy = client.chat.completions.create(
            model="bubo",
            messages=USER,
            max_tokens=24,
            temperature=0,
            extra_body={"grammar": grammar, "dry_multiplier": 0},
        )
        answers = [
            client.chat.completions.create(
                model="bubo",
                messages=USER,
                max_tokens=24,
                seed=seed,
                extra_body={**LOW_SURPRISE, "samplers": "kt", "grammar": grammar},
            )
            for seed in (1, 2)
        ]
        assert {answer.choices[0].message.content for answer in answers} == {
            greedy.choices[0].message.content
        }


def test_bad_values_are_a_400_and_the_server_stays_up(server: Server, http: httpx.Client) -> None:
    """An unknown sampler or mirostat 3 is a 400 naming the field, on /completion and through the SDK."""
    response = http.post("/completion", json={"prompt": "Hi", "samplers": ["top_k", "greedy"]})
    assert (response.status_code, response.json()["error"]["param"]) == (400, "samplers[1]")
    with openai_client(server) as client, pytest.raises(openai.BadRequestError) as error:
        client.chat.completions.create(model="bubo", messages=USER, extra_body={"mirostat": 3})
    assert error.value.param == "mirostat"  # type: ignore[attr-defined]
    assert http.get("/health").status_code == 200
