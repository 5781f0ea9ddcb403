"""The operator running in-process against the emulator, shared by the scenario tests here."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from operator_env import OperatorEnv


@pytest.fixture
async def env() -> AsyncIterator[OperatorEnv]:
    """An operator reconciling every 0.2 s against a fresh emulator."""
    async with OperatorEnv(interval_s=0.2) as e:
        yield e
