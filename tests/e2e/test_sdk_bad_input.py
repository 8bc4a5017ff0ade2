"""A lone surrogate, as a JavaScript client's JSON.stringify sends it, in every dialect: a 400 in its envelope.

The official Python SDKs cannot send one (they encode strict UTF-8), so the
bodies go out raw. Each answer is the dialect's own error shape (what its SDK
turns into BadRequestError), and the server keeps answering.
"""

from __future__ import annotations

import httpx
import pytest

from .conftest import Server, openai_client

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

LONE = '"a\\ud800b"'  # the JSON escape of a lone high surrogate

BODIES = {
    "/v1/chat/completions": f'{{"model":"bubo","max_tokens":2,"messages":[{{"role":"user","content":{LONE}}}]}}',
    "/v1/completions": f'{{"model":"bubo","max_tokens":2,"prompt":{LONE}}}',
    "/v1/responses": f'{{"model":"bubo","max_output_tokens":16,"input":{LONE}}}',
    "/v1/messages": f'{{"model":"bubo","max_tokens":2,"messages":[{{"role":"user","content":{LONE}}}]}}',
    "/completion": f'{{"n_predict":2,"prompt":{LONE}}}',
}


@pytest.mark.parametrize("path", BODIES)
def test_refused_in_the_dialects_envelope(server: Server, path: str) -> None:
    response = httpx.post(
        server.base_url + path,
        content=BODIES[path].encode(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400
    body = response.json()
    if path == "/v1/messages":
        assert body["type"] == "error"
        assert body["error"]["type"] == "invalid_request_error"
    else:
        assert body["error"]["type"] == "invalid_request_error"
        assert body["error"]["code"] == "parse_error"
    assert "surrogate" in body["error"]["message"]
    with openai_client(server, timeout=60) as client:
        assert client.chat.completions.create(
            model="bubo", messages=[{"role": "user", "content": "Hi"}], max_tokens=2
        ).choices
