"""llama-server's paths without /v1 answer as their /v1 twins (clients set with a bare base URL use them)."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("path", "body", "object_type"),
    [
        (
            "/chat/completions",
            {"model": "bubo", "messages": [{"role": "user", "content": "Hi"}]},
            "chat.completion",
        ),
        ("/responses", {"model": "bubo", "input": "Hi"}, "response"),
    ],
)
async def test_post_without_v1(app, path: str, body: dict[str, object], object_type: str) -> None:
    response = await app.test_client().post(path, json=body)
    assert response.status_code == 200
    assert (await response.get_json())["object"] == object_type


async def test_a_stored_response_without_v1(app) -> None:
    client = app.test_client()
    created = await (await client.post("/responses", json={"model": "bubo", "input": "Hi"})).get_json()
    fetched = await client.get(f"/responses/{created['id']}")
    assert (await fetched.get_json())["id"] == created["id"]
    assert (await client.delete(f"/responses/{created['id']}")).status_code == 200
    assert (await client.get(f"/v1/responses/{created['id']}")).status_code == 404
