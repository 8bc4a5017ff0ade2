"""Fixtures for the API tests of a model that takes images: the fake engine with :class:`FakeVision`."""

from __future__ import annotations

from collections.abc import AsyncIterator

import attrs
import pytest
from quart_trio import QuartTrio
from tests.conftest import RuntimeFactory, serving_app

from bubo.config import Settings
from bubo.engine.fake import FakeEngine, FakeScript, FakeVision


@pytest.fixture(name="vision")
def _vision() -> FakeVision:
    """What reads the images (each read is kept in ``vision.read``)."""
    return FakeVision()


@pytest.fixture(name="vision_engine")
def _vision_engine(script: FakeScript, vision: FakeVision) -> FakeEngine:
    return FakeEngine(script=script, vision=vision)


@pytest.fixture(name="vision_app")
async def _vision_app(
    settings: Settings, make_runtime: RuntimeFactory, vision_engine: FakeEngine
) -> AsyncIterator[QuartTrio]:
    """The real app over a fake engine that takes images (as with ``--mmproj``)."""
    runtime = attrs.evolve(make_runtime(), engine=vision_engine)
    async with serving_app(settings, runtime) as test_app:
        yield test_app
