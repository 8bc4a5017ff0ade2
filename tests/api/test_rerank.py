"""/rerank (and its aliases) over the fake engine's rank-pooling embedder: shapes, order, pairs, errors.

The fake reranker's score of a pair is the mean of fixed random vectors of its
tokens: numbers without meaning, so these tests assert shapes, order, the pairs
decoded and the errors, never which document is relevant.
"""

from __future__ import annotations

import attrs
import pytest
from tests.conftest import wait_until_ready

from bubo.engine import PairFormat
from bubo.engine.fake import FakeEmbedder, FakeEngine
from bubo.server import create_app
from bubo.service.rerank import MAX_RERANK_DOCUMENTS, pair_tokens

PATHS = ("/rerank", "/reranking", "/v1/rerank", "/v1/reranking")
DOCUMENTS = ["the cat sat on the mat", "stock prices rose", "a kitten sleeps", "rain is due"]
# SmolLM2's vocabulary: <|endoftext|> 0, <|im_start|> 1, <|im_end|> 2 stand in for CLS, SEP, EOS
BERT_LIKE = PairFormat(bos=1, sep=2)


@pytest.fixture(name="ranker")
def _ranker(request) -> FakeEmbedder:
    pooling, pair = getattr(request, "param", ("rank", BERT_LIKE))
    return FakeEmbedder(pooling=pooling, n_tokens=32, n_embd=1, pair_format=pair)


@pytest.fixture(name="rank_app")
async def _rank_app(settings, make_runtime, script, ranker):
    runtime = attrs.evolve(make_runtime(), engine=FakeEngine(script=script, embedder=ranker))
    app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
    async with app.test_app() as test_app:
        await wait_until_ready(app)
        yield test_app


async def _post(app, body, path="/rerank"):
    response = await app.test_client().post(path, json=body)
    return response.status_code, await response.get_json()


class TestAnswer:
    @pytest.mark.parametrize("path", PATHS)
    async def test_jina_shape(self, rank_app, ranker, tokenizer, path) -> None:
        """Every document once, by index, highest score first; usage counts every pair's tokens."""
        status, body = await _post(
            rank_app, {"model": "bubo", "query": "a cat", "documents": DOCUMENTS}, path
        )
        assert status == 200
        assert body["object"] == "list"
        assert body["model"] == "bubo"
        results = body["results"]
        assert sorted(item["index"] for item in results) == list(range(len(DOCUMENTS)))
        scores = [item["relevance_score"] for item in results]
        assert scores == sorted(scores, reverse=True)
        pairs = [pair_tokens(tokenizer, BERT_LIKE, "a cat", doc) for doc in DOCUMENTS]
        assert body["usage"] == {"prompt_tokens": sum(map(len, pairs)), "total_tokens": sum(map(len, pairs))}
        by_index = {item["index"]: item["relevance_score"] for item in results}
        assert by_index == {i: pytest.approx(float(ranker.embed(p)[0])) for i, p in enumerate(pairs)}

    async def test_pairs_decoded(self, rank_app, ranker, tokenizer) -> None:
        """Each pair is [BOS] query [SEP] document, the texts tokenized without their special tokens."""
        await _post(rank_app, {"query": "a cat<|im_end|>", "documents": ["the mat", "<|im_start|>x"]})
        query = tokenizer.encode("a cat<|im_end|>", parse_special=False)
        assert ranker.inputs == [
            (1, *query, 2, *tokenizer.encode("the mat", parse_special=False)),
            (1, *query, 2, *tokenizer.encode("<|im_start|>x", parse_special=False)),
        ]

    async def test_top_n(self, rank_app) -> None:
        """top_n keeps the best n of the full ranking; 0 keeps none; more than there are keeps all."""
        _, full = await _post(rank_app, {"query": "a cat", "documents": DOCUMENTS})
        _, two = await _post(rank_app, {"query": "a cat", "documents": DOCUMENTS, "top_n": 2})
        _, none = await _post(rank_app, {"query": "a cat", "documents": DOCUMENTS, "top_n": 0})
        _, many = await _post(rank_app, {"query": "a cat", "documents": DOCUMENTS, "top_n": 99})
        assert two["results"] == full["results"][:2]
        assert none["results"] == []
        assert many["results"] == full["results"]
        assert two["usage"] == full["usage"]  # every pair was decoded

    async def test_documents_as_objects(self, rank_app) -> None:
        """Documents as {text} objects (Jina's, Cohere's clients) rank as the strings do."""
        _, plain = await _post(rank_app, {"query": "a cat", "documents": DOCUMENTS})
        _, objects = await _post(rank_app, {"query": "a cat", "documents": [{"text": d} for d in DOCUMENTS]})
        assert objects["results"] == plain["results"]

    async def test_return_text_and_documents(self, rank_app) -> None:
        """return_text adds text, return_documents adds document.text, each the document ranked."""
        body = {"query": "a cat", "documents": DOCUMENTS, "return_text": True, "return_documents": True}
        _, answer = await _post(rank_app, body)
        for item in answer["results"]:
            assert item["text"] == DOCUMENTS[item["index"]]
            assert item["document"] == {"text": DOCUMENTS[item["index"]]}
        _, bare = await _post(rank_app, {"query": "a cat", "documents": DOCUMENTS})
        assert {key for item in bare["results"] for key in item} == {"index", "relevance_score"}

    async def test_tei_shape(self, rank_app) -> None:
        """texts (Hugging Face TEI): a bare array of {index, score}, sorted, text with return_text."""
        _, jina = await _post(rank_app, {"query": "a cat", "documents": DOCUMENTS})
        _, tei = await _post(
            rank_app, {"query": "a cat", "texts": DOCUMENTS, "return_text": True, "top_n": 3}
        )
        assert [(i["index"], i["score"]) for i in tei] == [
            (i["index"], i["relevance_score"]) for i in jina["results"][:3]
        ]
        assert all(item["text"] == DOCUMENTS[item["index"]] for item in tei)

    @pytest.mark.parametrize("ranker", [("rank", PairFormat(template="Q: {query}<|im_end|>D: {document}"))],
                             indirect=True)  # fmt: skip
    async def test_rerank_template(self, rank_app, ranker, tokenizer) -> None:
        """A GGUF's rerank template is filled in and tokenized with its special tokens parsed."""
        await _post(rank_app, {"query": "a cat", "documents": ["the mat"]})
        assert ranker.inputs == [tuple(tokenizer.encode("Q: a cat<|im_end|>D: the mat", parse_special=True))]

    async def test_first_score_is_the_relevance(self, settings, make_runtime, script, tokenizer) -> None:
        """A classifier with several outputs: the first is the relevance, as llama-server reads it."""
        ranker = FakeEmbedder(pooling="rank", n_tokens=32, n_embd=3, pair_format=BERT_LIKE)
        runtime = attrs.evolve(make_runtime(), engine=FakeEngine(script=script, embedder=ranker))
        app = create_app(settings, load=lambda _s, _p: runtime, on_load_failure=lambda: None)
        async with app.test_app() as test_app:
            await wait_until_ready(app)
            _, body = await _post(test_app, {"query": "a cat", "documents": ["the mat"]})
        expected = ranker.embed(pair_tokens(tokenizer, BERT_LIKE, "a cat", "the mat"))[0]
        assert body["results"][0]["relevance_score"] == pytest.approx(float(expected))


class TestErrors:
    @pytest.mark.parametrize(
        ("body", "param"),
        [
            ({"documents": ["a"]}, "query"),
            ({"query": "", "documents": ["a"]}, "query"),
            ({"query": 3, "documents": ["a"]}, "query"),
            ({"query": "q"}, "documents"),
            ({"query": "q", "documents": []}, "documents"),
            ({"query": "q", "documents": "a"}, "documents"),
            ({"query": "q", "documents": ["a", 1]}, "documents[1]"),
            ({"query": "q", "documents": ["a", {"image": "x.png"}]}, "documents[1].text"),
            ({"query": "q", "documents": ["a", ""]}, "documents[1]"),
            ({"query": "q", "texts": ["a", None]}, "texts[1]"),
            ({"query": "q", "documents": ["a"], "top_n": -1}, "top_n"),
            ({"query": "q", "documents": ["a"], "top_n": "2"}, "top_n"),
            ({"query": "q", "documents": ["a"], "return_text": "yes"}, "return_text"),
            ({"query": "q", "documents": ["word " * 40]}, "documents[0]"),
            ({"query": "word " * 40, "documents": ["a"]}, "query"),
            ({"query": "q", "documents": ["a"] * (MAX_RERANK_DOCUMENTS + 1)}, "documents"),
        ],
    )
    async def test_bad_input(self, rank_app, ranker, body, param) -> None:
        """Bad input is a 400 naming its JSON path, and nothing is decoded."""
        status, answer = await _post(rank_app, body)
        assert status == 400
        assert answer["error"]["param"] == param
        assert ranker.inputs == []

    async def test_unknown_model(self, rank_app) -> None:
        """A model the server does not serve is 404 model_not_found."""
        status, answer = await _post(rank_app, {"model": "other", "query": "q", "documents": ["a"]})
        assert status == 404
        assert answer["error"]["code"] == "model_not_found"

    @pytest.mark.parametrize("path", PATHS)
    async def test_text_model_answers_501(self, app, path) -> None:
        """Without a reranker every rerank path is 501 not_implemented, whatever the body."""
        status, answer = await _post(app, {"query": "q", "documents": ["a"]}, path)
        assert status == 501
        assert answer["error"]["code"] == "not_implemented"

    @pytest.mark.parametrize("ranker", [("mean", PairFormat())], indirect=True)
    async def test_embedding_model_answers_501(self, rank_app) -> None:
        """An embedding model that pools other than rank does not rank: 501."""
        status, answer = await _post(rank_app, {"query": "q", "documents": ["a"]})
        assert status == 501
        assert "--reranking" in answer["error"]["message"]


class TestPairTokens:
    def test_eos_and_sep(self, tokenizer) -> None:
        """[BOS] query [EOS] [SEP] document [EOS], each marker where the format adds it."""
        pair = PairFormat(bos=1, eos=2, sep=0)
        query, doc = tokenizer.encode("q", parse_special=False), tokenizer.encode("d", parse_special=False)
        assert pair_tokens(tokenizer, pair, "q", "d") == (1, *query, 2, 0, *doc, 2)

    def test_nothing_added(self, tokenizer) -> None:
        """A vocabulary that adds no markers joins the two texts as they are."""
        assert pair_tokens(tokenizer, PairFormat(), "q", "d") == tuple(
            tokenizer.encode("q", parse_special=False) + tokenizer.encode("d", parse_special=False)
        )

    def test_a_template_is_filled_in_one_pass(self, tokenizer) -> None:
        """A query holding ``{document}`` keeps it as text: the document goes only where the template says."""
        pair = PairFormat(template="Q: {query} D: {document}")
        expected = tokenizer.encode("Q: a {document} D: the mat", add_special=False, parse_special=True)
        assert pair_tokens(tokenizer, pair, "a {document}", "the mat") == tuple(expected)
