"""The multimodal projector through llama.cpp's mtmd, on SmolLM2 and a tiny random-weight Gemma 3 projector.

The projector is built here (tests/_tiny_gguf/mmproj.py) with random weights:
what the model "sees" is noise, so these tests assert on shapes, counts,
determinism and errors only.  Its images are 4 embeddings between Gemma 3's
text markers, which SmolLM2's vocabulary reads as plain text.
"""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import attrs
import llama_cpp
import numpy as np
import numpy.typing as npt
import pytest
from llama_cpp import mtmd_cpp

from bubo.engine._images import Bitmap
from bubo.engine._lasting import state_identity
from bubo.engine._projector import MediaTokens, Projector, ProjectorRefused
from bubo.engine._protocols import ContextFull
from bubo.engine._vision import Vision, VisionOptions
from bubo.engine.base import EngineFailure
from bubo.engine.llama import LlamaOptions
from bubo.errors import InvalidRequest
from bubo.model import read_projector

from .._tiny_gguf.mmproj import IMAGE_TOKENS, build_mmproj, n_embd_of

pytestmark = pytest.mark.llama


def picture(width: int, height: int, seed: int = 0) -> Bitmap:
    rgb = np.random.default_rng(seed).integers(0, 256, size=3 * width * height, dtype=np.uint8)
    return Bitmap(width, height, rgb.tobytes())


def load(path: Path, model: object, *, output_width: int | None) -> Projector:
    return Projector.load(
        path,
        model,
        use_gpu=False,
        n_threads=2,
        image_min_tokens=None,
        image_max_tokens=None,
        output_width=output_width,
    )


@pytest.fixture(name="model", scope="module")
def _model(model_path: Path) -> Iterator[object]:
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(
        str(model_path).encode(), llama_cpp.llama_model_default_params()
    )
    assert model
    yield model
    llama_cpp.llama_model_free(model)


@pytest.fixture(name="mmproj", scope="module")
def _mmproj(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj.gguf", n_embd=n_embd_of(model_path))


@pytest.fixture(name="projector", scope="module")
def _projector(mmproj: Path, model: object) -> Iterator[Projector]:
    projector = load(mmproj, model, output_width=read_projector(mmproj).output_width)
    yield projector
    projector.close()


class Context:
    """A small llama.cpp context over the model: two sequences, 64-token batches."""

    def __init__(self, model: object, *, n_ubatch: int = 64) -> None:
        params = llama_cpp.llama_context_default_params()
        params.n_ctx = 512
        params.n_batch = 64
        params.n_ubatch = n_ubatch
        params.n_seq_max = 2
        params.n_threads = params.n_threads_batch = 2
        self.ctx = llama_cpp.llama_init_from_model(model, params)
        assert self.ctx
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
        self.memory = llama_cpp.llama_get_memory(self.ctx)
        self.batch = llama_cpp.llama_batch_init(64, 0, 1)

    def decode(self, tokens: tuple[int, ...], *, position: int, seq_id: int) -> npt.NDArray[np.float32]:
        """Decode *tokens* at *position…* of *seq_id*; a copy of the last token's logits."""
        for i, token in enumerate(tokens):
            self.batch.token[i] = token
            self.batch.pos[i] = position + i
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = seq_id
            self.batch.logits[i] = i == len(tokens) - 1
        self.batch.n_tokens = len(tokens)
        assert llama_cpp.llama_decode(self.ctx, self.batch) == 0
        logits = llama_cpp.llama_get_logits_ith(self.ctx, -1)
        return np.ctypeslib.as_array(logits, shape=(self.n_vocab,)).copy()

    def last_position(self, seq_id: int) -> int:
        return llama_cpp.llama_memory_seq_pos_max(self.memory, seq_id)

    def clear(self) -> None:
        llama_cpp.llama_memory_clear(self.memory, True)  # noqa: FBT003

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        llama_cpp.llama_free(self.ctx)


@pytest.fixture(name="context")
def _context(model: object) -> Iterator[Context]:
    context = Context(model)
    yield context
    context.close()


def text_tokens(model: object, text: str) -> tuple[int, ...]:
    vocab = llama_cpp.llama_model_get_vocab(model)
    out = (llama_cpp.llama_token * 64)()
    count = llama_cpp.llama_tokenize(vocab, text.encode(), len(text.encode()), out, 64, False, True)  # noqa: FBT003
    return tuple(out[:count])


def evaluate(projector: Projector, context: Context, media: MediaTokens, *, seq_id: int = 0) -> int:
    return projector.evaluate(context.ctx, media, n_past=0, seq_id=seq_id, n_batch=64, logits_last=False)


class TestLoading:
    def test_the_projector_takes_images_only(self, projector) -> None:
        assert (projector.vision, projector.audio) == (True, False)

    def test_one_images_encoder_work_is_its_embeddings_three_times(self, projector, model) -> None:
        """4 embeddings of SmolLM2's 576 floats: mtmd's output, the engine's copy, llama.cpp's input."""
        assert projector.encoder_bytes() == 3 * IMAGE_TOKENS * llama_cpp.llama_model_n_embd_inp(model) * 4

    def test_a_projector_for_another_width_is_refused_by_its_file_before_mtmd(self, model, tmp_path) -> None:
        """The width read from the file is compared first: the message names both widths exactly."""
        wrong = build_mmproj(tmp_path / "wrong.gguf", n_embd=64)
        with pytest.raises(ProjectorRefused) as refused:
            load(wrong, model, output_width=read_projector(wrong).output_width)
        assert refused.value.message == (
            f"the projector {wrong}: its output width 64 differs from the model's n_embd 576 "
            "(a projector made for another model)"
        )

    def test_without_the_width_mtmds_own_check_refuses_it_without_a_crash(self, model, tmp_path) -> None:
        wrong = build_mmproj(tmp_path / "wrong.gguf", n_embd=64)
        with pytest.raises(
            ProjectorRefused, match=r"llama.cpp could not load the projector .* \(n_embd 576\)"
        ):
            load(wrong, model, output_width=None)

    def test_a_projector_placing_images_with_m_rope_is_refused_and_freed(
        self, mmproj, model, monkeypatch
    ) -> None:
        """Forced: llama.cpp says M-RoPE only over an M-RoPE text model (Qwen2-VL's), which no fixture is."""
        native_free = mtmd_cpp.mtmd_free
        freed: list[int] = []

        def free(ctx: int) -> None:
            freed.append(ctx)
            native_free(ctx)

        monkeypatch.setattr(mtmd_cpp, "mtmd_decode_use_mrope", lambda _ctx: True)
        monkeypatch.setattr(mtmd_cpp, "mtmd_free", free)
        with pytest.raises(ProjectorRefused, match=r"M-RoPE positions .*: such models are not supported yet"):
            load(mmproj, model, output_width=None)
        assert len(freed) == 1  # the context mtmd made is not leaked

    def test_a_file_that_is_no_projector_is_refused(self, model, model_path) -> None:
        """The text model itself, passed as a projector: mtmd returns NULL and that is a refusal."""
        with pytest.raises(ProjectorRefused, match="could not load the projector"):
            load(model_path, model, output_width=None)

    def test_a_missing_file_is_refused(self, model, tmp_path) -> None:
        with pytest.raises(ProjectorRefused, match="could not load the projector"):
            load(tmp_path / "absent.gguf", model, output_width=None)


class TestTokenize:
    @pytest.mark.parametrize(("width", "height"), [(32, 32), (100, 60), (1, 1)])
    def test_an_image_is_four_embeddings_between_gemma3s_markers(
        self, projector, model, width, height
    ) -> None:
        """Every size is resized to the encoder's 32x32: 4 positions, Gemma 3's markers as SmolLM2 text."""
        media = projector.tokenize(picture(width, height))
        assert media.n_image == IMAGE_TOKENS
        assert media.before == text_tokens(model, "<start_of_image>")
        assert media.after == text_tokens(model, "<end_of_image>")
        assert len(media.before) == len(media.after) == 7  # '<', 'start', '_', 'of', '_', 'image', '>'

    def test_the_digest_is_the_pictures(self, projector) -> None:
        """The same pixels give the same digest; other pixels, or the same bytes at another size, another."""
        first, again = projector.tokenize(picture(32, 32)), projector.tokenize(picture(32, 32))
        assert first.digest == again.digest == picture(32, 32).digest()
        assert projector.tokenize(picture(32, 32, seed=1)).digest != first.digest
        assert projector.tokenize(Bitmap(16, 64, picture(32, 32).rgb)).digest != first.digest

    def test_the_native_chunks_are_freed_with_the_tokens(self, projector) -> None:
        media = projector.tokenize(picture(8, 8))
        chunks = weakref.ref(media._chunks)
        del media
        gc.collect()
        assert chunks() is None

    def test_tokenizing_from_several_threads_at_once_gives_what_one_thread_gets(
        self, projector, context
    ) -> None:
        """Eight workers tokenize while this thread evaluates images: the results are the serial ones."""
        images = [picture(20 + seed, 30, seed) for seed in range(8)]
        expected = [projector.tokenize(image) for image in images]
        results: list[list[MediaTokens]] = [[] for _ in images]
        errors: list[BaseException] = []
        start = threading.Barrier(len(images) + 1)

        def work(index: int) -> None:
            try:
                start.wait()
                results[index].extend(projector.tokenize(images[index]) for _ in range(5))
            except BaseException as error:  # noqa: BLE001 (reported to the test thread below)
                errors.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(images))]
        for thread in threads:
            thread.start()
        start.wait()
        for _ in range(5):
            context.clear()
            assert evaluate(projector, context, expected[0]) == IMAGE_TOKENS
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        for want, got in zip(expected, results, strict=True):
            assert [(m.before, m.n_image, m.after, m.digest) for m in got] == [
                (want.before, want.n_image, want.after, want.digest)
            ] * 5


class TestEvaluate:
    def test_the_image_takes_its_positions_and_the_text_after_reads_it(self, projector, context) -> None:
        """Evaluated at 0, the image fills positions 0-3; the text after it decodes at 4 into full logits."""
        media = projector.tokenize(picture(32, 32))
        assert evaluate(projector, context, media) == IMAGE_TOKENS
        assert context.last_position(0) == IMAGE_TOKENS - 1
        logits = context.decode(media.after, position=IMAGE_TOKENS, seq_id=0)
        assert logits.shape == (context.n_vocab,)
        assert np.isfinite(logits).all()
        assert context.last_position(0) == IMAGE_TOKENS + len(media.after) - 1

    def test_evaluation_is_deterministic_and_depends_on_the_image(self, projector, context) -> None:
        """The same image in two sequences gives the same logits after it; another image, others."""
        media, other = projector.tokenize(picture(32, 32)), projector.tokenize(picture(32, 32, seed=7))
        readings = []
        for seq_id, image in ((0, media), (1, media)):
            assert evaluate(projector, context, image, seq_id=seq_id) == IMAGE_TOKENS
            readings.append(context.decode(image.after, position=IMAGE_TOKENS, seq_id=seq_id))
        context.clear()
        evaluate(projector, context, other)
        readings.append(context.decode(other.after, position=IMAGE_TOKENS, seq_id=0))
        assert np.array_equal(readings[0], readings[1])
        assert not np.array_equal(readings[0], readings[2])

    def test_an_image_goes_after_text_at_any_position(self, projector, context, model) -> None:
        """A prompt's text, then the image at the next position, then its closing text."""
        media = projector.tokenize(picture(32, 32))
        prompt = text_tokens(model, "Look:") + media.before
        context.decode(prompt, position=0, seq_id=0)
        n_past = projector.evaluate(
            context.ctx, media, n_past=len(prompt), seq_id=0, n_batch=64, logits_last=False
        )
        assert n_past == len(prompt) + IMAGE_TOKENS
        assert context.last_position(0) == n_past - 1

    def test_an_image_larger_than_a_micro_batch_is_refused_and_the_sequence_kept(
        self, projector, model
    ) -> None:
        """Gemma 3's image attends to itself, so it must fit one micro-batch; the refusal changes nothing."""
        small = Context(model, n_ubatch=2)
        try:
            small.decode(text_tokens(model, "Hello"), position=0, seq_id=0)
            before = small.last_position(0)
            with pytest.raises(EngineFailure, match=r"an image of 4 embeddings needs a micro-batch"):
                projector.evaluate(
                    small.ctx,
                    projector.tokenize(picture(32, 32)),
                    n_past=before + 1,
                    seq_id=0,
                    n_batch=64,
                    logits_last=False,
                )
            assert small.last_position(0) == before
        finally:
            small.close()


class TestEncodeApart:
    def test_workers_encode_while_the_decode_thread_decodes_and_get_the_serial_embeddings(
        self, projector, context
    ) -> None:
        """Four workers encode (taking turns inside) while this thread evaluates: each gets what one alone gets."""
        medias = [projector.tokenize(picture(32, 32, seed)) for seed in range(4)]
        expected = [projector.encode(media) for media in medias]
        assert expected[0].shape == (IMAGE_TOKENS, projector.n_embd)
        results: list[list[npt.NDArray[np.float32]]] = [[] for _ in medias]
        errors: list[BaseException] = []
        start = threading.Barrier(len(medias) + 1)

        def work(index: int) -> None:
            try:
                start.wait()
                results[index].extend(projector.encode(medias[index]) for _ in range(5))
            except BaseException as error:  # noqa: BLE001 (reported to the test thread below)
                errors.append(error)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(medias))]
        for thread in threads:
            thread.start()
        start.wait()
        for _ in range(5):
            context.clear()
            assert evaluate(projector, context, medias[0]) == IMAGE_TOKENS
        for thread in threads:
            thread.join(timeout=60)
        assert errors == []
        for want, got in zip(expected, results, strict=True):
            assert all(np.array_equal(want, each) for each in got)

    def test_embeddings_encoded_apart_read_as_evaluate_reads_them(self, projector, context) -> None:
        """encode in a worker, then evaluate_encoded on the decode thread: the same logits as evaluate."""
        media = projector.tokenize(picture(32, 32))
        evaluate(projector, context, media, seq_id=0)
        whole = context.decode(media.after, position=IMAGE_TOKENS, seq_id=0)
        encoded: list[npt.NDArray[np.float32]] = []
        worker = threading.Thread(target=lambda: encoded.append(projector.encode(media)))
        worker.start()
        worker.join(timeout=60)
        n_past = projector.evaluate_encoded(context.ctx, media, encoded[0], n_past=0, seq_id=1, n_batch=64)
        assert n_past == IMAGE_TOKENS
        assert np.array_equal(context.decode(media.after, position=IMAGE_TOKENS, seq_id=1), whole)

    def test_embeddings_of_another_shape_are_refused(self, projector, context) -> None:
        media = projector.tokenize(picture(32, 32))
        with pytest.raises(EngineFailure, match=r"not the image's float32 \(4, 576\)"):
            projector.evaluate_encoded(
                context.ctx, media, np.zeros((3, 576), np.float32), n_past=0, seq_id=0, n_batch=64
            )
        assert context.last_position(0) == -1


class TestEvaluateFailures:
    def test_asking_for_logits_at_an_image_is_refused(self, projector, context) -> None:
        """llama.cpp computes none there: the flag it would ignore is an error, before any work."""
        with pytest.raises(EngineFailure, match="an image's positions have no logits"):
            projector.evaluate(
                context.ctx,
                projector.tokenize(picture(32, 32)),
                n_past=0,
                seq_id=0,
                n_batch=64,
                logits_last=True,
            )
        assert context.last_position(0) == -1

    def test_no_room_for_the_image_is_context_full_and_leaves_the_sequence_as_it_was(
        self, projector, context
    ) -> None:
        """Room for 2 more cells, an image of 4: llama_decode finds no slot (1); the loop makes room."""
        room = llama_cpp.llama_n_ctx_seq(context.ctx)
        filler = (28,) * 62
        for start in range(0, room - 2, len(filler)):
            context.decode(filler[: room - 2 - start], position=start, seq_id=0)
        assert context.last_position(0) == room - 3
        with pytest.raises(ContextFull, match="no room left for the image") as failed:
            projector.evaluate(
                context.ctx,
                projector.tokenize(picture(32, 32)),
                n_past=room - 2,
                seq_id=0,
                n_batch=64,
                logits_last=False,
            )
        assert not failed.value.fatal
        assert context.last_position(0) == room - 3
        context.clear()
        assert evaluate(projector, context, projector.tokenize(picture(32, 32))) == IMAGE_TOKENS

    def test_a_sequence_the_context_lacks_is_refused_before_llama_cpp_sees_it(
        self, projector, context
    ) -> None:
        """llama.cpp would abort the process on it; the projector refuses it first."""
        media = projector.tokenize(picture(32, 32))
        with pytest.raises(EngineFailure, match=r"the context has no sequence 7 \(it has 2\)"):
            projector.evaluate(context.ctx, media, n_past=0, seq_id=7, n_batch=64, logits_last=False)


class TestClose:
    def test_a_closed_projector_refuses_work_and_its_tokens_still_free(self, mmproj, model) -> None:
        projector = load(mmproj, model, output_width=None)
        media = projector.tokenize(picture(32, 32))
        projector.close()
        with pytest.raises(EngineFailure, match="the projector was closed"):
            projector.tokenize(picture(32, 32))
        with pytest.raises(EngineFailure, match="the projector was closed"):
            projector.encode(media)
        chunks = weakref.ref(media._chunks)
        del media
        gc.collect()
        assert chunks() is None
        projector.close()  # a second close does nothing


class TestRefusedImages:
    def test_an_audio_only_projector_would_refuse_images(self, projector) -> None:
        """The vision flag gates tokenize: flipped on this object, an image is a 400 naming the field."""
        projector.vision = False
        try:
            with pytest.raises(InvalidRequest) as refused:
                projector.tokenize(picture(4, 4), param="messages[0].content[1]")
            assert refused.value.param == "messages[0].content[1]"
        finally:
            projector.vision = True


def test_the_projector_is_part_of_what_a_kv_state_is(mmproj: Path, model_path: Path, tmp_path: Path) -> None:
    """Slot files and the disk tier never restore an image's cells under another projector (or none)."""
    params = llama_cpp.llama_context_default_params()
    plain = LlamaOptions(model_path=model_path)
    other = build_mmproj(tmp_path / "mmproj-other.gguf", n_embd=n_embd_of(model_path), seed=1)
    identities = {
        state_identity(plain, params),
        state_identity(attrs.evolve(plain, mmproj=mmproj), params),
        state_identity(attrs.evolve(plain, mmproj=other), params),
        state_identity(attrs.evolve(plain, mmproj=mmproj, image_max_tokens=64), params),
    }
    assert len(identities) == 4
    assert state_identity(plain, params) == state_identity(plain, params)


def test_an_image_that_cannot_be_one_micro_batch_stops_start_up(mmproj: Path, model: object) -> None:
    """Gemma 3's image positions attend to each other: the whole image must fit --ubatch-size."""
    options = VisionOptions(path=mmproj, max_pixels=10**6, max_images=4, n_ubatch=IMAGE_TOKENS - 1)
    with pytest.raises(
        ProjectorRefused, match=rf"--ubatch-size {IMAGE_TOKENS} or more \(it is {IMAGE_TOKENS - 1}\)"
    ):
        Vision(options, model)
    Vision(attrs.evolve(options, n_ubatch=IMAGE_TOKENS), model).close()
