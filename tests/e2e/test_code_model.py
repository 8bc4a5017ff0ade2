"""/infill, embeddings and slot files on a real server with Qwen2.5-Coder-0.5B (it has FIM tokens).

One server: --embeddings --pooling mean --slot-save-path; a 4096-token context so
that /infill's extra context has room (n_ctx - n_batch - 2 n_predict).
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import httpx
import pytest
from tests._models import qwen25_coder_path

from .._sse import payloads
from .conftest import Server, hypercorn_command, openai_client, serving

pytestmark = [pytest.mark.e2e, pytest.mark.llama]

GREEDY = {"temperature": 0, "top_k": 1}


@pytest.fixture(name="coder", scope="module")
def _coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("coder")
    env = {
        "BUBO_MODEL": str(qwen25_coder_path()),
        "BUBO_CTX_SIZE": "4096",
        "BUBO_PARALLEL": "2",
        "BUBO_EMBEDDINGS": "on",
        "BUBO_POOLING": "mean",
        "BUBO_SLOT_SAVE_PATH": str(folder / "slots"),
    }
    with serving(folder / "hypercorn.log", env=env, command=hypercorn_command) as server:
        yield server


@pytest.fixture(name="http")
def _http(coder: Server) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=coder.base_url, timeout=120) as client:
        yield client


class TestInfill:
    def test_fills_the_gap(self, http: httpx.Client) -> None:
        """The model completes the middle of a function from what comes before and after."""
        response = http.post(
            "/infill",
            json={
                "input_prefix": "def add(a, b):\n    return ",
                "input_suffix": "\n\nprint(add(1, 2))\n",
                "n_predict": 16,
                **GREEDY,
            },
        )
        assert response.status_code == 200
        body = response.json()
        assert body["content"].strip().startswith("a + b")
        assert body["prompt"].startswith("<|repo_name|>myproject\n<|file_sep|>filename\n<|fim_prefix|>")
        assert body["prompt"].endswith("<|fim_suffix|>\n\nprint(add(1, 2))\n<|fim_middle|>")

    def test_extra_context(self, http: httpx.Client) -> None:
        """input_extra files reach the model ahead of the gap's file; the answer uses them."""
        response = http.post(
            "/infill",
            json={
                "input_extra": [{"filename": "config.py", "text": "SECRET_PORT = 4817\n"}],
                "input_prefix": "from config import SECRET_PORT\n\nassert SECRET_PORT == ",
                "input_suffix": "\n",
                "n_predict": 8,
                **GREEDY,
            },
        )
        body = response.json()
        assert "<|file_sep|>config.py\nSECRET_PORT = 4817\n<|file_sep|>filename\n" in body["prompt"]
        assert body["content"].strip().startswith("4817")

    def test_stream(self, http: httpx.Client) -> None:
        """A streamed infill gives the same text as the plain one."""
        request = {
            "input_prefix": "def add(a, b):\n    return ",
            "input_suffix": "\n",
            "n_predict": 8,
            **GREEDY,
        }
        plain = http.post("/infill", json=request).json()["content"]
        with http.stream("POST", "/infill", json={**request, "stream": True}) as response:
            chunks = payloads(response.iter_lines())
        assert "".join(chunk["content"] for chunk in chunks) == plain


def _cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


class TestEmbeddings:
    def test_openai_sdk(self, coder: Server, http: httpx.Client) -> None:
        """The OpenAI SDK (base64 by default) gets n_embd-long vectors; paraphrases are closer than unrelated text."""
        n_embd = http.get("/props").json()["model_info"]["n_embd"]
        with openai_client(coder) as client:
            result = client.embeddings.create(
                model="bubo",
                input=[
                    "The cat sat on the mat.",
                    "A cat was sitting on the rug.",
                    "Quarterly revenue grew by four percent.",
                ],
            )
        vectors = [item.embedding for item in result.data]
        assert [len(v) for v in vectors] == [n_embd] * 3
        assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[0], vectors[2])
        assert _cosine(vectors[0], vectors[1]) > _cosine(vectors[1], vectors[2])
        assert result.usage.prompt_tokens == result.usage.total_tokens > 0

    def test_float_and_llama_shapes_agree(self, http: httpx.Client) -> None:
        """/v1/embeddings (float) and /embedding give the same normalized vector."""
        openai_shape = http.post("/v1/embeddings", json={"input": "hello world", "encoding_format": "float"})
        llama_shape = http.post("/embedding", json={"content": "hello world"})
        (vector,) = llama_shape.json()[0]["embedding"]
        assert vector == pytest.approx(openai_shape.json()["data"][0]["embedding"], abs=1e-5)
        assert math.fsum(x * x for x in vector) == pytest.approx(1.0, abs=1e-4)

    def test_too_long(self, http: httpx.Client) -> None:
        """An input over --ubatch-size (512) tokens is a 400 naming it; the server keeps serving."""
        response = http.post("/v1/embeddings", json={"input": ["short", "word " * 600]})
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "input[1]"
        assert http.post("/v1/embeddings", json={"input": "short"}).status_code == 200

    def test_generation_is_undisturbed(self, http: httpx.Client) -> None:
        """Embedding between two identical greedy generations changes nothing they produce."""
        request = {
            "prompt": "def fibonacci(n):",
            "n_predict": 24,
            "id_slot": 1,
            "cache_prompt": False,
            **GREEDY,
        }
        first = http.post("/completion", json=request).json()["content"]
        assert http.post("/v1/embeddings", json={"input": ["x = 1", "def f(): pass"]}).status_code == 200
        assert http.post("/completion", json=request).json()["content"] == first


class TestSlotFiles:
    def test_save_erase_restore(self, http: httpx.Client) -> None:
        """A restored slot continues exactly as before, reusing its saved prefix."""
        prompt = "# A module of small string utilities\n" + "".join(
            f"def helper_{i}(text):\n    return text.strip() + '{i}'\n\n" for i in range(8)
        )
        request = {"prompt": prompt, "n_predict": 12, "id_slot": 0, **GREEDY}
        first = http.post("/completion", json=request).json()
        n_prompt = first["timings"]["prompt_n"] + first["timings"]["cache_n"]
        saved = http.post("/slots/0?action=save", json={"filename": "helpers.bin"}).json()
        assert saved["id_slot"] == 0
        assert saved["n_saved"] >= n_prompt
        assert saved["n_written"] > 0
        assert http.post("/slots/0?action=erase").json() == {"id_slot": 0, "n_erased": saved["n_saved"]}
        assert http.get("/slots").json()[0]["n_prompt_tokens"] == 0
        restored = http.post("/slots/0?action=restore", json={"filename": "helpers.bin"}).json()
        assert restored["n_restored"] == saved["n_saved"]
        assert restored["n_read"] > 0
        again = http.post("/completion", json=request).json()
        assert again["content"] == first["content"]
        assert again["timings"]["cache_n"] == n_prompt - 1  # all but the last prompt token came from the file
        assert again["usage"]["gufo"]["cache_hit"] is True

    def test_names_stay_in_the_directory(self, http: httpx.Client) -> None:
        for name in ("../x", "/tmp/x"):
            response = http.post("/slots/0?action=save", json={"filename": name})
            assert response.status_code == 400
            assert response.json()["error"]["param"] == "filename"
