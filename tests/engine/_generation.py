"""What the real-engine tests share: greedy sampling and a generation drained to its end."""

from __future__ import annotations

import attrs

from bubo.domain.generation import GenerationFinished, GenerationRequest, TokenGenerated
from bubo.domain.sampling import SamplingParams
from bubo.engine import Engine

__all__ = ["GREEDY", "Generated", "generate"]

GREEDY = SamplingParams(temperature=0.0)


@attrs.frozen
class Generated:
    """One generation's tokens, in order, and how it finished."""

    tokens: tuple[TokenGenerated, ...]
    finished: GenerationFinished

    @property
    def ids(self) -> tuple[int, ...]:
        return tuple(token.token_id for token in self.tokens)

    @property
    def text(self) -> str:
        return "".join(token.text for token in self.tokens)


async def generate(engine: Engine, request: GenerationRequest) -> Generated:
    """Run *request* to its end; a generation that ends without finishing (it failed) fails the test."""
    tokens: list[TokenGenerated] = []
    finished = None
    async with engine.open_generation(request) as events:
        async for event in events:
            if isinstance(event, TokenGenerated):
                tokens.append(event)
            elif isinstance(event, GenerationFinished):
                finished = event
    assert finished is not None, "the generation did not finish"
    return Generated(tuple(tokens), finished)
