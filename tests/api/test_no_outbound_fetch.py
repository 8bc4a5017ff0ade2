"""URLs inside a request's content are never fetched: images, documents and files by URL reach nobody.

A text model cannot read them; whether a dialect answers them with a 400 or
serves the turn with a placeholder, the listener on 127.0.0.1 that each URL
names hears nothing.  (Schema references: test_schema_references.py.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from tests._listener import Listener


@pytest.fixture(name="listener")
def _listener() -> Iterator[Listener]:
    with Listener() as listener:
        yield listener


def bodies(url: str) -> dict[str, tuple[str, dict[str, Any]]]:
    image = f"{url}/owl.png"
    return {
        "chat image_url": (
            "/v1/chat/completions",
            {
                "model": "bubo",
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": image}}]}
                ],
            },
        ),
        "messages image url": (
            "/v1/messages",
            {
                "model": "bubo",
                "max_tokens": 4,
                "messages": [
                    {"role": "user", "content": [{"type": "image", "source": {"type": "url", "url": image}}]}
                ],
            },
        ),
        "messages document url": (
            "/v1/messages",
            {
                "model": "bubo",
                "max_tokens": 4,
                "messages": [
                    {
                        "role": "user",
                        "content": [{"type": "document", "source": {"type": "url", "url": f"{url}/a.pdf"}}],
                    }
                ],
            },
        ),
        "responses input_image": (
            "/v1/responses",
            {
                "model": "bubo",
                "max_output_tokens": 16,
                "input": [{"role": "user", "content": [{"type": "input_image", "image_url": image}]}],
            },
        ),
        "responses input_file": (
            "/v1/responses",
            {
                "model": "bubo",
                "max_output_tokens": 16,
                "input": [{"role": "user", "content": [{"type": "input_file", "file_url": f"{url}/a.pdf"}]}],
            },
        ),
    }


@pytest.mark.parametrize(
    "case",
    [
        "chat image_url",
        "messages image url",
        "messages document url",
        "responses input_image",
        "responses input_file",
    ],
)
async def test_a_url_in_the_content_is_not_fetched(app, listener: Listener, case: str) -> None:
    path, body = bodies(listener.url)[case]
    response = await app.test_client().post(path, json=body)
    assert response.status_code < 500, await response.get_data()
    assert listener.connections == 0
