"""URLs inside a request's content are never fetched: images, documents and files by URL reach nobody.

A text model cannot read them; whether a dialect answers them with a 400 or
serves the turn with a placeholder, the listener on 127.0.0.1 that each URL
names hears nothing.  A model that takes images (``--mmproj``) answers an image
by URL with a 400 naming its field, and its listener hears nothing either.
(Schema references: test_schema_references.py.)
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
        "ollama chat images": (
            "/api/chat",
            {
                "model": "bubo",
                "stream": False,
                "messages": [{"role": "user", "content": "What is it?", "images": [image]}],
            },
        ),
        "ollama generate images": (
            "/api/generate",
            {"model": "bubo", "stream": False, "prompt": "What is it?", "images": [image]},
        ),
        "completion multimodal_data": (
            "/completion",
            {
                "prompt": {"prompt_string": "<__media__> What is it?", "multimodal_data": [image]},
                "n_predict": 4,
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


IMAGE_CASES = (
    "chat image_url",
    "messages image url",
    "responses input_image",
    "ollama chat images",
    "ollama generate images",
    "completion multimodal_data",
)


@pytest.mark.parametrize("case", [*IMAGE_CASES, "messages document url", "responses input_file"])
async def test_a_url_in_the_content_is_not_fetched(app, listener: Listener, case: str) -> None:
    path, body = bodies(listener.url)[case]
    response = await app.test_client().post(path, json=body)
    assert response.status_code < 500, await response.get_data()
    assert listener.connections == 0


@pytest.mark.parametrize("case", IMAGE_CASES)
async def test_a_model_that_takes_images_refuses_an_image_url(
    vision_app, vision, listener: Listener, case: str
) -> None:
    """A 400, nothing fetched, nothing read."""
    path, body = bodies(listener.url)[case]
    response = await vision_app.test_client().post(path, json=body)
    assert response.status_code == 400, await response.get_data()
    assert listener.connections == 0
    assert vision.read == []
