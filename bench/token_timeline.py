"""Where each millisecond of a token goes, from ``llama_decode`` to the client: the timeline's arithmetic.

Pure functions over a trace of bench/traced_serve.py (a :class:`Trace` as JSON)
and the arrival times a client saw, so that they are tested on synthetic data
(bench/test_token_timeline.py).  A token's times, in order:

- ``llama_decode`` of the step that computed its logits begins and ends;
- its sampling (``llama_sampler_sample``) begins and ends, on the decode thread;
- the decode thread queues it for trio (``Courier.post``), trio runs the hand-over;
- the frame carrying its text is written to the socket (``send_all`` begins, ends);
- the client reads it.

A stream is followed across the three places by its text: the tokens the
decode thread handed over, the frames written to a connection and the events
a client read all spell the same text (greedy, the same prompt), and a token's
time at each place is that of the piece (frame, event) holding its last
character.  Streams with the same text are told apart by time (the nearest).
"""

from __future__ import annotations

import bisect
import itertools
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import timing
from scenarios import _text_of

FRAME = re.compile(r"data: (\{.*?\})\n\n", re.DOTALL)

Piece = tuple[float, str]  # when a piece of text was seen, and the text


@attrs.frozen
class Token:
    """One generated token's times (``time.perf_counter`` seconds); ``None`` where it was not seen."""

    stream: int
    seq: int
    decode_start: float
    decode_end: float
    sample_start: float | None
    sample_end: float | None
    emit: float
    deliver: float | None
    write_start: float | None
    write_end: float | None
    arrival: float | None = None
    step_tokens: int = 1  # tokens in the step's llama_decode (one per stream while all generate)
    step_sampling: float = 0.0  # all sampling between this step's decode and the next (every stream's)


PHASES: tuple[tuple[str, str, str], ...] = (
    ("llama_decode", "decode_start", "decode_end"),
    ("decode thread: decode end to sampling", "decode_end", "sample_start"),
    ("sampling", "sample_start", "sample_end"),
    ("decode thread: sampled to hand-over (stops, event)", "sample_end", "emit"),
    ("hand-over: decode thread to trio", "emit", "deliver"),
    ("trio: event to frame written (service, encoding, ASGI)", "deliver", "write_start"),
    ("socket write", "write_start", "write_end"),
    ("written to read by the client", "write_end", "arrival"),
    ("total: decode start to bytes written", "decode_start", "write_end"),
    ("total: decode start to client", "decode_start", "arrival"),
)
"""Each phase of a token's way out: its name, and the times it lies between."""


def frames_written(writes: Sequence[Sequence[Any]]) -> dict[int, list[Piece]]:
    """Each connection's written text: per SSE frame, the time its write ended and the text it carries."""
    written: dict[int, list[Piece]] = defaultdict(list)
    for _start, end, connection, data in writes:
        raw = data.encode("latin-1").decode("utf-8", errors="replace")
        for match in FRAME.finditer(raw):
            text = _text_of(json.loads(match.group(1)))
            if text:
                written[int(connection)].append((float(end), text))
    return dict(written)


def frame_write_starts(writes: Sequence[Sequence[Any]]) -> dict[int, list[float]]:
    """Each connection's write start per text-carrying frame, in the order of :func:`frames_written`."""
    starts: dict[int, list[float]] = defaultdict(list)
    for start, _end, connection, data in writes:
        raw = data.encode("latin-1").decode("utf-8", errors="replace")
        for match in FRAME.finditer(raw):
            if _text_of(json.loads(match.group(1))):
                starts[int(connection)].append(float(start))
    return dict(starts)


def holders(texts: Sequence[str], pieces: Sequence[str]) -> list[int | None]:
    """For each of *texts* (tokens), the index of the piece holding its last character; empty: None.

    Raises:
        ValueError: the pieces do not spell the same text as the tokens.

    """
    if "".join(texts) != "".join(pieces):
        raise ValueError("the pieces do not spell the tokens' text")
    ends = list(itertools.accumulate(len(piece) for piece in pieces))
    found: list[int | None] = []
    position = 0
    for text in texts:
        position += len(text)
        found.append(bisect.bisect_left(ends, position) if text else None)
    return found


def match(
    texts: Mapping[int, tuple[str, float]], candidates: Mapping[int, tuple[str, float]]
) -> dict[int, int]:
    """Each of *texts* (key: text, first time) to the candidate of the same text nearest in time.

    A candidate is matched once; a text no candidate spells is left out.
    """
    matched: dict[int, int] = {}
    free = dict(candidates)
    for key, (text, at) in sorted(texts.items(), key=lambda item: item[1][1]):
        same = [(abs(seen - at), other) for other, (spelt, seen) in free.items() if spelt == text and text]
        if same:
            other = min(same)[1]
            matched[key] = other
            del free[other]
    return matched


def tokens(trace: Mapping[str, Sequence[Sequence[Any]]], arrivals: Sequence[Sequence[Piece]]) -> list[Token]:
    """Every token the trace saw handed over, with its times at each place (the client's from *arrivals*)."""
    decodes = sorted((float(s), float(e), int(n)) for s, e, n in trace["decode"])
    decode_ends = [end for _, end, _ in decodes]
    samples = sorted((float(s), float(e)) for s, e in trace["sample"])
    sample_ends = [end for _, end in samples]
    sampled_after = _sampling_after(decodes, samples)
    delivered = {(int(st), int(sq)): float(s) for s, _e, st, sq in trace["deliver"]}
    emitted: dict[int, list[tuple[float, int, str]]] = defaultdict(list)
    for at, stream, seq, text in trace["emit"]:
        emitted[int(stream)].append((float(at), int(seq), str(text)))
    written = frames_written(trace["write"])
    write_starts = frame_write_starts(trace["write"])
    by_stream = {s: ("".join(t for _, _, t in e), e[0][0]) for s, e in emitted.items()}
    by_connection = {c: ("".join(t for _, t in w), w[0][0]) for c, w in written.items()}
    by_client = {i: ("".join(t for _, t in a), a[0][0]) for i, a in enumerate(arrivals) if a}
    connection_of = match(by_stream, by_connection)
    client_of = {connection: client for client, connection in match(by_client, by_connection).items()}
    found: list[Token] = []
    for stream, emits in emitted.items():
        texts = [text for _, _, text in emits]
        connection = connection_of.get(stream)
        frames = written.get(connection, []) if connection is not None else []
        in_frame = holders(texts, [text for _, text in frames]) if frames else [None] * len(texts)
        client = client_of.get(connection) if connection is not None else None
        events = arrivals[client] if client is not None else []
        in_event = holders(texts, [text for _, text in events]) if events else [None] * len(texts)
        for (at, seq, _text), frame, event in zip(emits, in_frame, in_event, strict=True):
            step = bisect.bisect_right(decode_ends, at) - 1
            decode = decodes[step]
            sample_index = bisect.bisect_right(sample_ends, at) - 1
            sample = samples[sample_index] if sample_index >= 0 else None
            if sample is not None and sample[0] < decode[1]:
                sample = None  # no sampling after this step's decode: an inserted token
            found.append(
                Token(
                    stream=stream,
                    seq=seq,
                    decode_start=decode[0],
                    decode_end=decode[1],
                    sample_start=sample[0] if sample else None,
                    sample_end=sample[1] if sample else None,
                    emit=at,
                    deliver=delivered.get((stream, seq)),
                    write_start=write_starts[connection][frame]
                    if frame is not None and connection is not None
                    else None,
                    write_end=frames[frame][0] if frame is not None else None,
                    arrival=events[event][0] if event is not None else None,
                    step_tokens=decode[2],
                    step_sampling=sampled_after[step],
                )
            )
    return found


def _time_in(spans: Sequence[tuple[float, float]], first: int, until: float) -> float:
    """The time of *spans* (sorted) from index *first* on that end by *until*, in their order."""
    total = 0.0
    for start, end in spans[first:]:
        if end > until:
            break
        total += end - start
    return total


def _sampling_after(
    decodes: Sequence[tuple[float, float]], samples: Sequence[tuple[float, float]]
) -> list[float]:
    """For each decode, the sampling between its end and the next decode's start (seconds)."""
    starts = [start for start, _ in samples]
    after = []
    for index, (_, ended, _) in enumerate(decodes):
        until = decodes[index + 1][0] if index + 1 < len(decodes) else float("inf")
        first = bisect.bisect_left(starts, ended)
        after.append(_time_in(samples, first, until))
    return after


def phase_table(found: Sequence[Token]) -> dict[str, dict[str, float]]:
    """Each phase's p50, p95, p99 and mean in milliseconds over *found* (phases no token saw are left out)."""
    table: dict[str, dict[str, float]] = {}
    for name, begin, end in PHASES:
        values = [
            (getattr(token, end) - getattr(token, begin)) * 1000
            for token in found
            if getattr(token, begin) is not None and getattr(token, end) is not None
        ]
        if values:
            table[name] = timing.summary(values)
    return table


def between_steps(found: Sequence[Token], n: int) -> list[float]:
    """The decode thread's time between two consecutive steps of *n* tokens, less sampling, in ms.

    Only steps a stream of *found* took part in, one after the other (not the
    idle time between two requests); each step once, however many streams it served.
    """
    steps: dict[float, float] = {}
    for before, token in _consecutive(found):
        if before.step_tokens == token.step_tokens == n:
            steps[token.decode_start] = (token.decode_start - before.decode_end - before.step_sampling) * 1000
    return list(steps.values())


def after_hand_over(found: Sequence[Token]) -> list[float]:
    """The decode thread's time from handing a token over to the stream's next ``llama_decode``, in ms.

    What the loop does after the hand-over (posting to trio, the other streams'
    tokens, the next batch) and any wait for the GIL on the way.
    """
    return [(token.decode_start - before.emit) * 1000 for before, token in _consecutive(found)]


def handed_over_late(found: Sequence[Token]) -> float:
    """The share of tokens trio took only after the stream's next ``llama_decode`` had begun."""
    pairs = [(before, token) for before, token in _consecutive(found) if before.deliver is not None]
    late = sum(before.deliver is not None and before.deliver > token.decode_start for before, token in pairs)
    return late / len(pairs) if pairs else 0.0


def written_before_next_decode(found: Sequence[Token]) -> float:
    """The share of tokens whose frame was written before the stream's next ``llama_decode`` began.

    High: the event loop's work for a token ran between two steps, in series with
    the decode thread (which waits for the GIL), not beside ``llama_decode``.
    """
    pairs = [(before, token) for before, token in _consecutive(found) if before.write_end is not None]
    early = sum(
        before.write_end is not None and before.write_end < token.decode_start for before, token in pairs
    )
    return early / len(pairs) if pairs else 0.0


def _consecutive(found: Sequence[Token]) -> list[tuple[Token, Token]]:
    """Each stream's consecutive tokens from different steps, in order."""
    by_stream: dict[int, list[Token]] = defaultdict(list)
    for token in found:
        by_stream[token.stream].append(token)
    pairs = []
    for stream_tokens in by_stream.values():
        ordered = sorted(stream_tokens, key=lambda token: token.seq)
        pairs.extend((a, b) for a, b in itertools.pairwise(ordered) if a.decode_start != b.decode_start)
    return pairs


GAP_PARTS = ("llama_decode", "sampling", "decode thread Python", "delivery change")


def gap_parts(found: Sequence[Token], at: str = "arrival") -> list[dict[str, float]]:
    """Each gap between a stream's consecutive tokens (seen at *at*), in parts that add up to it, in ms.

    The gap from token k-1 to token k is the step from one decode's end to the
    next (``llama_decode`` of k, plus the decode thread's work between the two
    calls: every stream's sampling, and Python) plus the change of the delivery
    time (from ``llama_decode``'s end to *at*) between the two tokens.
    """
    parts = []
    for before, token in _consecutive(found):
        seen, seen_before = getattr(token, at), getattr(before, at)
        if seen is None or seen_before is None:
            continue
        sampling = before.step_sampling  # in the step between the two decodes
        between = token.decode_start - before.decode_end
        parts.append({
            "gap": (seen - seen_before) * 1000,
            "llama_decode": (token.decode_end - token.decode_start) * 1000,
            "sampling": sampling * 1000,
            "decode thread Python": (between - sampling) * 1000,
            "delivery change": ((seen - token.decode_end) - (seen_before - before.decode_end)) * 1000,
            "at": seen_before,
            "until": seen,
        })  # fmt: skip
    return parts


def tail(parts: Sequence[Mapping[str, float]], q: float = 95) -> dict[str, dict[str, float]]:
    """The gaps at or above their *q*-th percentile against all gaps: each part's median and tail mean, ms."""
    if not parts:
        return {}
    cut = timing.percentile([p["gap"] for p in parts], q)
    slow = [p for p in parts if p["gap"] >= cut]
    return {
        key: {
            "all, median": statistics.median(p[key] for p in parts),
            "tail, mean": statistics.fmean(p[key] for p in slow),
        }
        for key in ("gap", *GAP_PARTS)
    }


def collections_during(
    parts: Sequence[Mapping[str, float]], passes: Sequence[Sequence[Any]]
) -> dict[str, float]:
    """The share of gaps a garbage collection pass fell in: all gaps and the slowest 5 %, by thread."""
    if not parts:
        return {}
    cut = timing.percentile([p["gap"] for p in parts], 95)
    spans = [(float(s), float(e), str(thread)) for s, e, _g, thread in passes]

    def share(gaps: Sequence[Mapping[str, float]], on_decode: bool) -> float:
        hit = sum(
            any(
                p["at"] < e and s < p["until"] and (thread == "bubo-decode") == on_decode
                for s, e, thread in spans
            )
            for p in gaps
        )
        return hit / len(gaps) if gaps else 0.0

    slow = [p for p in parts if p["gap"] >= cut]
    return {
        "trio thread, all gaps": share(parts, on_decode=False),
        "trio thread, slowest 5 %": share(slow, on_decode=False),
        "decode thread, all gaps": share(parts, on_decode=True),
        "decode thread, slowest 5 %": share(slow, on_decode=True),
    }
