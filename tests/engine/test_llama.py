"""The llama.cpp engine on the real default model (SmolLM2-135M-Instruct)."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bubo.domain.generation import (
    GenerationFinished,
    GenerationRequest,
    GrammarSpec,
    PromptProgress,
    StopCause,
    ThinkingBudget,
    TokenGenerated,
)
from bubo.domain.messages import InputGrammar, ToolSpec
from bubo.domain.sampling import BANNED, SamplingParams
from bubo.engine import GrammarRejected
from bubo.engine._grammar import MAX_GBNF_NESTING
from bubo.engine._protocols import BatchEntry
from bubo.engine._sampler import Sampler
from bubo.engine.errors import EngineFailure
from bubo.engine.llama import LlamaEngine
from bubo.grammar import check_schema
from bubo.grammar.freeform import input_rules
from bubo.grammar.schema import LIMITS
from bubo.parsers.registry import tool_format
from bubo.tokenizer import HFTokenizer

from .._llama_options import loaded_engine
from ..grammar.test_freeform import APPLY_PATCH, codex_exec_grammar
from ..grammar.test_pattern import SUPPORTED
from ._generation import GREEDY, generate

pytestmark = pytest.mark.llama

QUESTION = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(name="engine", scope="module")
def _engine(model_path: Path) -> Iterator[LlamaEngine]:
    with loaded_engine(model_path=model_path, n_ctx=1024, n_threads=2, prefill_chunk=64) as engine:
        yield engine


async def run(
    engine: LlamaEngine, request: GenerationRequest
) -> tuple[str, list[TokenGenerated], GenerationFinished]:
    generated = await generate(engine, request)
    return generated.text, list(generated.tokens), generated.finished


def prompt(tokenizer: HFTokenizer, text: str = QUESTION) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text))


class TestGeneration:
    async def test_answers_a_simple_question(self, engine, tokenizer) -> None:
        """Greedy decoding answers the reference question and stops at end-of-turn."""
        text, tokens, finished = await run(
            engine, GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=64, sampling=GREEDY)
        )
        assert "Paris" in text
        assert finished.cause is StopCause.EOS
        assert finished.stats.completion_tokens == len(tokens)
        assert finished.stats.prompt_tokens == len(prompt(tokenizer))

    async def test_greedy_is_deterministic(self, engine, tokenizer) -> None:
        """The same greedy request gives the same tokens, cache or no cache."""
        request = GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=24, sampling=GREEDY)
        first = await run(engine, request)
        await run(
            engine,
            GenerationRequest(
                prompt_tokens=prompt(tokenizer, "Unrelated text"), max_new_tokens=4, sampling=GREEDY
            ),
        )
        second = await run(engine, request)
        assert [t.token_id for t in first[1]] == [t.token_id for t in second[1]]

    async def test_seeded_sampling_is_reproducible(self, engine, tokenizer) -> None:
        """With a seed, temperature sampling repeats exactly."""
        request = GenerationRequest(
            prompt_tokens=prompt(tokenizer, "Once upon a time"),
            max_new_tokens=20,
            sampling=SamplingParams(temperature=1.0, seed=1234),
        )
        assert (await run(engine, request))[0] == (await run(engine, request))[0]

    async def test_max_new_tokens(self, engine, tokenizer) -> None:
        """Generation stops at the limit with cause LIMIT."""
        _, tokens, finished = await run(
            engine,
            GenerationRequest(
                prompt_tokens=prompt(tokenizer, "Count: 1, 2, 3,"),
                max_new_tokens=5,
                sampling=GREEDY,
                ignore_eos=True,
            ),
        )
        assert len(tokens) == 5
        assert finished.cause is StopCause.LIMIT

    async def test_a_limit_inside_a_character_finishes_it(self, engine, tokenizer) -> None:
        """A limit reached inside a multi-byte character waits for its last byte (at most 3 tokens).

        The model repeats the owl, which SmolLM2 writes as three tokens (f0 9f, a6, 89): a
        limit of one token ends after the third with the whole character, never with U+FFFD.
        """
        owl = "\N{OWL}"
        assert len(tokenizer.encode(owl, parse_special=False)) == 3
        for limit, tokens_out in ((1, 3), (2, 3), (3, 3), (4, 6)):
            text, tokens, finished = await run(
                engine,
                GenerationRequest(
                    prompt_tokens=prompt(tokenizer, owl * 12),
                    max_new_tokens=limit,
                    sampling=GREEDY,
                    ignore_eos=True,
                ),
            )
            assert (text, len(tokens), finished.cause) == (
                owl * (tokens_out // 3),
                tokens_out,
                StopCause.LIMIT,
            )
            assert finished.stats.completion_tokens == tokens_out

    async def test_zero_new_tokens_only_evaluates_the_prompt(self, engine, tokenizer) -> None:
        """max_new_tokens 0 evaluates the prompt into the cache and samples nothing."""
        _, tokens, finished = await run(
            engine, GenerationRequest(prompt_tokens=prompt(tokenizer, "Warm the cache"), max_new_tokens=0)
        )
        assert tokens == []
        assert finished.cause is StopCause.LIMIT

    async def test_stop_word(self, engine, tokenizer) -> None:
        """A stop string ends generation; it and what follows are not released."""
        text, _, finished = await run(
            engine,
            GenerationRequest(
                prompt_tokens=prompt(tokenizer, "Count: 1, 2, 3,"),
                max_new_tokens=40,
                sampling=GREEDY,
                stop=(" 6",),
                ignore_eos=True,
            ),
        )
        assert finished.cause is StopCause.STOP_WORD
        assert finished.stop_word == " 6"
        assert " 6" not in text
        assert text.endswith("5,")

    async def test_context_end(self, engine, tokenizer) -> None:
        """Without a limit, generation stops when the context is full."""
        long_prompt = prompt(tokenizer, "word " * 1000)
        assert len(long_prompt) < 1024
        _, tokens, finished = await run(
            engine,
            GenerationRequest(
                prompt_tokens=long_prompt, max_new_tokens=None, sampling=GREEDY, ignore_eos=True
            ),
        )
        assert finished.cause is StopCause.CONTEXT
        assert len(long_prompt) + len(tokens) == 1024

    async def test_logit_bias_bans_a_token(self, engine, tokenizer) -> None:
        """A banned token is never sampled."""
        request = GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=12, sampling=GREEDY)
        _, tokens, _ = await run(engine, request)
        banned = tokens[0].token_id
        biased = GenerationRequest(
            prompt_tokens=request.prompt_tokens,
            max_new_tokens=12,
            sampling=SamplingParams(temperature=0.0, logit_bias=((banned, BANNED),)),
        )
        _, tokens, _ = await run(engine, biased)
        assert banned not in [t.token_id for t in tokens]

    async def test_repeat_last_n_minus_one_penalizes_the_whole_context(self, engine, tokenizer) -> None:
        """-1 means the context, as in llama-server (llama.cpp alone reads it as 0: penalties off)."""
        text = "<|im_start|>user\nSay 'go' ten times.<|im_end|>\n<|im_start|>assistant\ngo go go go"

        async def answer(last_n: int) -> str:
            sampling = SamplingParams(temperature=0.0, repeat_penalty=1.8, repeat_last_n=last_n)
            request = GenerationRequest(
                prompt_tokens=prompt(tokenizer, text), max_new_tokens=8, sampling=sampling
            )
            return (await run(engine, request))[0]

        off, whole = await answer(0), await answer(-1)
        assert whole != off
        assert whole == await answer(engine.info.n_ctx)

    async def test_logprobs(self, engine, tokenizer) -> None:
        """Greedy tokens are the top candidate; probabilities are normalised."""
        _, tokens, _ = await run(
            engine,
            GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=6, sampling=GREEDY, n_probs=5),
        )
        for token in tokens:
            assert token.logprob is not None
            assert token.logprob.top[0].token_id == token.token_id
            assert math.isclose(token.logprob.top[0].logprob, token.logprob.logprob)
            assert len(token.logprob.top) == 5
            assert sum(math.exp(t.logprob) for t in token.logprob.top) <= 1.0 + 1e-6
            assert [t.logprob for t in token.logprob.top] == sorted(
                (t.logprob for t in token.logprob.top), reverse=True
            )

    def test_pieces_match_the_tokenizer(self, engine, tokenizer) -> None:
        """The engine's token pieces equal the HF tokenizer's for every non-control token."""
        control = {
            t for t in range(tokenizer.n_vocab) if tokenizer.token_bytes(t) and engine.token_piece(t) == b""
        }
        assert control <= set(range(17))  # SmolLM2's 17 special tokens
        assert all(
            engine.token_piece(t) == tokenizer.token_bytes(t)
            for t in range(tokenizer.n_vocab)
            if t not in control
        )


class TestPromptCache:
    async def test_identical_prompt_reuses_all_but_the_last_token(self, engine, tokenizer) -> None:
        """A repeated prompt evaluates only its last token again."""
        request = GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=2, sampling=GREEDY)
        await run(engine, request)
        _, _, finished = await run(engine, request)
        assert finished.stats.cached_tokens == len(request.prompt_tokens) - 1
        assert finished.stats.cache.hit

    async def test_shared_prefix_is_reused(self, engine, tokenizer) -> None:
        """A prompt that extends the previous one evaluates only the new part."""
        first = prompt(
            tokenizer, "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        )
        await run(engine, GenerationRequest(prompt_tokens=first, max_new_tokens=1, sampling=GREEDY))
        second = first + prompt(tokenizer, "<|im_start|>assistant\n")
        _, _, finished = await run(
            engine, GenerationRequest(prompt_tokens=second, max_new_tokens=1, sampling=GREEDY)
        )
        assert finished.stats.cached_tokens == len(first)

    async def test_unrelated_prompt_is_a_miss(self, engine, tokenizer) -> None:
        """No common prefix: a miss with reason no_prefix."""
        await run(engine, GenerationRequest(prompt_tokens=prompt(tokenizer, "alpha beta"), max_new_tokens=1))
        _, _, finished = await run(
            engine, GenerationRequest(prompt_tokens=prompt(tokenizer, "Zebra crossing"), max_new_tokens=1)
        )
        assert (finished.stats.cached_tokens, finished.stats.cache.miss_reason) == (0, "no_prefix")


class TestTheBatchLimit:
    def test_a_step_larger_than_the_batch_is_refused_its_sequence_as_it_was(self, engine) -> None:
        """``llama_batch`` holds n_batch tokens: a larger step fails whole, its sequence as it was."""
        context = engine.current.context
        cache = context.caches[0]
        before = tuple(cache.tokens)
        too_many = context.n_batch + 1
        with pytest.raises(EngineFailure, match=f"a batch of {too_many} tokens exceeds {context.n_batch}"):
            context.decode_batch([BatchEntry(cache, (1,) * too_many)])
        assert tuple(cache.tokens) == before


class TestCancellation:
    async def test_cancel_during_generation_frees_the_slot(self, engine, tokenizer) -> None:
        """Leaving mid-generation stops the decode at the next token; the next request runs normally."""
        request = GenerationRequest(
            prompt_tokens=prompt(tokenizer, "Write a long story:"), max_new_tokens=500, ignore_eos=True
        )
        received = 0
        async with engine.open_generation(request) as events:
            async for event in events:
                if isinstance(event, TokenGenerated):
                    received += 1
                    if received == 5:
                        break
        assert engine.statistics().requests_processing == 0
        assert engine.statistics().slots[0].n_decoded < 40
        text, _, finished = await run(
            engine, GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=32, sampling=GREEDY)
        )
        assert "Paris" in text
        assert finished.cause is StopCause.EOS

    async def test_cancel_during_prefill_stops_within_a_chunk(self, engine, tokenizer) -> None:
        """A cancelled prefill stops after the chunk in progress (64 tokens here)."""
        long_prompt = prompt(tokenizer, "The history of the world in many words. " * 80)
        assert len(long_prompt) > 640
        with trio.move_on_after(5) as scope:
            async with engine.open_generation(
                GenerationRequest(prompt_tokens=long_prompt, max_new_tokens=1)
            ) as events:
                async for event in events:
                    if isinstance(event, PromptProgress) and event.processed >= 64:
                        scope.cancel()
        assert scope.cancelled_caught
        processed = engine.statistics().slots[0].n_prompt_tokens_processed
        assert processed <= 64 * 3  # the chunk in flight and at most one queued progress event
        assert engine.statistics().requests_processing == 0

    async def test_queued_request_cancelled_while_waiting(self, engine, tokenizer) -> None:
        """A request cancelled in the queue never runs and leaves the running one whole."""
        running = GenerationRequest(
            prompt_tokens=prompt(tokenizer), max_new_tokens=64, sampling=GREEDY, ignore_eos=True
        )
        results: list[str] = []

        async def first() -> None:
            results.append((await run(engine, running))[0])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            with trio.fail_after(5):
                await engine.wait_until(lambda statistics: statistics.requests_processing == 1)
            queued = trio.CancelScope()

            async def second() -> None:
                with queued:
                    async with engine.open_generation(running):
                        pytest.fail("the queued request must not get the slot while the first runs")

            nursery.start_soon(second)
            with trio.fail_after(5):
                await engine.wait_until(lambda statistics: statistics.requests_deferred == 1)
            assert engine.statistics().requests_processing == 1  # it waits while the first runs
            queued.cancel()
            with trio.fail_after(5):
                await engine.wait_until(lambda statistics: statistics.requests_deferred == 0)
        assert "Paris" in results[0]


class TestFreeformGrammars:
    @staticmethod
    def codex_tools() -> list[ToolSpec]:
        """Codex's exec (as Codex 0.169 sent it) and apply_patch freeform tools, as the Responses API offers them."""
        string = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"]}
        grammars = {"exec": codex_exec_grammar(), "apply_patch": APPLY_PATCH}
        return [
            ToolSpec(
                name=name,
                parameters=string,
                input_grammar=InputGrammar(argument="input", syntax="lark", definition=definition),
            )
            for name, definition in grammars.items()
        ]

    @pytest.mark.parametrize("parser", ["hermes", "json", "qwen3_coder"])
    def test_codex_grammars_compile_in_llama_cpp(self, engine: LlamaEngine, parser: str) -> None:
        """Each forced call grammar with Codex's real tool grammars is enforced and parsed by llama.cpp."""
        tools = self.codex_tools()
        for tool in tools:
            assert tool.input_grammar is not None
            assert input_rules(tool.input_grammar, "in", json_string=parser != "qwen3_coder") is not None
        spec = tool_format(parser).grammar(tools, prefix="", max_calls=1)
        assert spec.schemas == ()  # both inputs are written by their grammars, not as plain strings
        gbnf = engine.compile_grammar(spec)
        assert '"*** Begin Patch"' in gbnf

    async def test_a_forced_apply_patch_call_is_written_as_a_patch(self, engine, tokenizer) -> None:
        """Sampling under the Hermes call grammar: the input opens a patch and names a hunk, whatever the model."""
        apply_patch = self.codex_tools()[1]
        gbnf = engine.compile_grammar(tool_format("hermes").grammar([apply_patch], prefix="", max_calls=1))
        request = GenerationRequest(  # the text up to the hunk's name takes ~55 tokens
            prompt_tokens=prompt(tokenizer), max_new_tokens=96, sampling=GREEDY, grammar=gbnf
        )
        text, _, _ = await run(engine, request)
        head = '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "*** Begin Patch\\n*** '
        assert text.startswith(head), text
        assert text[len(head) :].startswith(("Add File: ", "Delete File: ", "Update File: ")), text


class TestConstraints:
    async def test_grammar_shapes_the_output(self, engine, tokenizer) -> None:
        """A GBNF grammar constrains what is sampled; the generation ends when it is complete."""
        grammar = engine.compile_grammar(GrammarSpec(rules='root ::= "yes" | "no"'))
        text, _, finished = await run(
            engine, GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=20, grammar=grammar)
        )
        assert text in ("yes", "no")
        assert finished.cause is StopCause.EOS

    async def test_schema_rules_are_generated(self, engine, tokenizer) -> None:
        """JSON-schema rules named in the spec are generated by llama.cpp's converter."""
        schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
        grammar = engine.compile_grammar(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))
        text, _, _ = await run(
            engine, GenerationRequest(prompt_tokens=prompt(tokenizer), max_new_tokens=30, grammar=grammar)
        )
        assert isinstance(json.loads(text)["n"], int)

    @pytest.mark.parametrize(
        ("bounds", "low", "high"),
        [
            ({"minimum": 18, "maximum": 120}, 18, 120),
            ({"exclusiveMinimum": -7.5, "exclusiveMaximum": 3}, -7, 2),
            ({"minimum": -1000, "maximum": -990}, -1000, -990),
            ({"minimum": 95}, 95, 10**16 - 1),
            ({"exclusiveMaximum": -95}, -(10**16) + 1, -96),
        ],
    )
    def test_integer_bounds_in_llama_cpp(self, engine, bounds, low, high) -> None:
        """llama.cpp's own grammar engine, fed one character token at a time, admits exactly the integers
        in range (a window around the bounds and the lengths' edges) and no other spelling."""
        admits = self.admitter(engine, {"type": "integer", **bounds})

        edges = {-1000, -100, -10, 0, 10, 100, 1000, low, high, 10**16, -(10**16)}
        for n in sorted({n + step for n in edges for step in range(-12, 13)}):
            assert admits(str(n)) == (low <= n <= high), n
        for n in (low, high):
            assert not admits(f"0{abs(n)}")
            assert not admits(f"{n}.0")
        assert not admits("-0")

    def test_a_string_holds_no_raw_control_character(self, engine) -> None:
        """JSON forbids them inside a string (RFC 8259): a newline is written escaped, or not at all."""
        admits = self.admitter(engine, {"type": "string"})
        assert admits('"a b"')
        assert admits('"a\\nb"')
        assert not admits('"a\nb"')
        assert not admits('"a\tb"')

    def test_references_resolve_inside_their_own_schema(self, engine) -> None:
        """Bundled references (root pointers, as check_schema returns them) into $defs, into an array and
        back to an enclosing schema: each points where it says, two targets with the same last token keep
        rules of their own, and the schema given to the converter is left as it was."""
        schema = {
            "$defs": {
                "a": {"type": "object", "properties": {"x": {"type": "integer"}}},
                "b": {"type": "object", "properties": {"x": {"type": "boolean"}}},
            },
            "anyOf": [{"$ref": "#/$defs/a/properties/x"}, {"$ref": "#/$defs/b/properties/x"}],
        }
        untouched = json.loads(json.dumps(schema))
        admits = self.admitter(engine, schema)
        assert schema == untouched
        assert admits("12")
        assert admits("true")
        assert not admits('"12"')

        listed = {"prefixItems": [{"type": "string"}, {"$ref": "#/prefixItems/0"}]}
        assert self.admitter(engine, {**listed, "type": "array"})('["a","b"]')

        tree = {"type": "object", "properties": {"next": {"$ref": "#"}}, "additionalProperties": False}
        admits = self.admitter(engine, tree)
        assert admits('{"next":{"next":{}}}')
        assert not admits('{"next":1}')

    @staticmethod
    def admitter(engine, schema):
        """Whether llama.cpp's own grammar engine, fed one character token at a time, admits a text whole."""
        gbnf = engine.compile_grammar(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))
        context = engine.current.context
        pieces = {engine.token_piece(token): token for token in range(context.n_vocab)}
        end = min(engine.info.eog_token_ids)

        def admits(text: str) -> bool:
            sampler = Sampler(SamplingParams(), n_vocab=context.n_vocab, vocab=context.vocab, grammar=gbnf)
            try:
                for char in text:
                    token = pieces[char.encode()]
                    if not sampler.allows(token):
                        return False
                    sampler.accept(token)
                return sampler.allows(end)
            finally:
                sampler.close()

        return admits

    @pytest.mark.parametrize(
        ("schema", "low", "high", "digits"),
        [
            ({"type": "number", "minimum": 0.5, "maximum": 9.5}, 50, 950, 2),
            ({"type": "number", "exclusiveMinimum": -1.25, "exclusiveMaximum": 0}, -124, -1, 2),
            ({"type": ["number", "null"], "minimum": 0, "maximum": 1, "multipleOf": 0.01}, 0, 100, 2),
            ({"type": "number", "exclusiveMinimum": 0.5, "maximum": 1}, 51, 100, 2),
        ],
    )
    def test_number_bounds_in_llama_cpp(self, engine, schema, low, high, digits) -> None:
        """Decimals in range (spelled with up to two fraction digits here) are admitted, none outside;
        no exponent, no ``-0``."""
        admits = self.admitter(engine, schema)
        for units in range(low - 60, high + 61):
            whole, fraction = divmod(abs(units), 10**digits)
            text = ("-" if units < 0 else "") + f"{whole}.{fraction:0{digits}d}"
            assert admits(text) == (low <= units <= high), text
        assert not admits("-0")
        assert not admits(f"{high / 10**digits}e0")
        if schema.get("multipleOf") == 0.01:
            assert not admits("0.005")
            assert admits("null")

    @pytest.mark.parametrize(
        ("schema", "admitted"),
        [
            ({"type": "integer", "multipleOf": 7}, lambda n: n % 7 == 0),
            ({"type": "integer", "multipleOf": 12, "exclusiveMinimum": 0}, lambda n: n > 0 and n % 12 == 0),
            ({"type": "integer", "multipleOf": 300, "maximum": 0}, lambda n: n <= 0 and n % 300 == 0),
            (
                {"type": "number", "multipleOf": 5, "minimum": -20, "maximum": 20},
                lambda n: -20 <= n <= 20 and n % 5 == 0,
            ),
        ],
    )
    def test_multiples_in_llama_cpp(self, engine, schema, admitted) -> None:
        """Exactly the multiples (within the bounds) are admitted, canonically spelled."""
        admits = self.admitter(engine, schema)
        for n in [*range(-1300, 1300), 10**15 * 7, 10**15 * 7 + 1]:
            assert admits(str(n)) == admitted(n), n
        assert not admits("-0")
        assert not admits("07")

    def test_unparsable_grammar(self, engine) -> None:
        """A grammar llama.cpp cannot parse is refused before any request runs it (a 400), not a crash."""
        with pytest.raises(GrammarRejected, match="could not parse"):
            engine.compile_grammar(GrammarSpec(rules="root ::= undefined-rule"))

    @pytest.mark.parametrize(
        "schema",
        [
            {
                "type": "string",
                "pattern": "[a-z]+",
            },  # JSON Schema patterns need not be anchored; llama.cpp's do
            {"$ref": "#/$defs/missing"},
        ],
    )
    def test_schemas_the_converter_refuses(self, engine, schema) -> None:
        """llama.cpp's converter reports these with assert; they are a GrammarRejected, not an AssertionError."""
        with pytest.raises(GrammarRejected, match="cannot be turned into a grammar"):
            engine.compile_grammar(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))

    @pytest.mark.parametrize(
        "schema",
        [
            {"type": "string", "maxLength": LIMITS.repetition},
            {"type": "string", "minLength": LIMITS.repetition},
            {"type": "array", "items": {"type": "integer"}, "minItems": 10, "maxItems": LIMITS.repetition},
            {"type": "string", "pattern": "^" + "(" * 31 + f"a{{0,{LIMITS.repetition}}}" + ")" * 31 + "$"},
            {"enum": [f"value {i}" for i in range(LIMITS.alternatives)]},
            {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(LIMITS.properties)}},
            {"type": "object", "properties": {"x": {"const": "y" * (LIMITS.literal_chars - 10)}}},
        ],
        ids=["maxLength", "minLength", "maxItems", "pattern", "enum", "properties", "literal"],
    )
    def test_schemas_at_the_limits_compile(self, engine, schema) -> None:
        """What the schema limits let through, llama.cpp parses: the limits are not above its own."""
        check_schema(schema, "schema")
        spec = GrammarSpec(rules="root ::= value", schemas=(("value", schema),))
        assert "value ::=" in engine.compile_grammar(spec)

    @pytest.mark.parametrize("pattern", SUPPORTED)
    def test_supported_patterns_compile(self, engine, pattern) -> None:
        """Each pattern the check lets through becomes GBNF that llama.cpp parses."""
        check_schema({"type": "string", "pattern": pattern}, "schema")
        schema = {"type": "string", "pattern": pattern}
        engine.compile_grammar(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))

    def test_nesting_past_the_parser_is_refused_before_it(self, engine) -> None:
        """Groups nested past MAX_GBNF_NESTING are refused before llama.cpp's recursive parser sees them.

        20,000 levels overflowed its stack (SIGSEGV) in a worker thread.
        """
        engine.compile_grammar(
            GrammarSpec(rules="root ::= " + "(" * MAX_GBNF_NESTING + '"a"' + ")" * MAX_GBNF_NESTING)
        )
        deep = "root ::= " + "(" * 20_000 + '"a"' + ")" * 20_000
        with pytest.raises(
            GrammarRejected, match=f"nests groups 20000 deep; at most {MAX_GBNF_NESTING}"
        ) as caught:
            engine.compile_grammar(GrammarSpec(rules=deep))
        assert caught.value.code == "schema_too_complex"

    def test_a_schema_the_converter_expands_too_deep_is_refused(self, engine) -> None:
        """Even past the schema check, maxLength 20,000 (20,000 nested groups) cannot reach the parser."""
        schema = {"type": "string", "maxLength": 20_000}
        with pytest.raises(GrammarRejected, match="nests groups"):
            engine.compile_grammar(GrammarSpec(rules="root ::= value", schemas=(("value", schema),)))

    async def test_thinking_budget_inserts_the_end(self, engine, tokenizer) -> None:
        """Inside a started thought, the end marker is inserted after the budget."""
        budget = ThinkingBudget(budget=4, end_tokens=tuple(tokenizer.encode("\n</think>\n\n")), started=True)
        text, tokens, _ = await run(
            engine,
            GenerationRequest(
                prompt_tokens=prompt(tokenizer, "Once upon a time"),
                max_new_tokens=16,
                ignore_eos=True,
                thinking_budget=budget,
            ),
        )
        assert "\n</think>\n\n" in text
        assert text.index("</think>") > 0
        assert len(tokens) == 16
