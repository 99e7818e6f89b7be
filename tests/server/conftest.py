"""Fixtures for the server tests: the tiny in-process model and a shared live server."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from lookahead.server import ServerConfig
from lookahead.testing import tiny_model

from .live import Live, serve


@pytest.fixture(scope="module", autouse=True)
def _one_torch_thread() -> Iterator[None]:
    """The tiny model is fastest on one thread, and two cores are shared with other work
    (restored after each module, so other test packages keep their setting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny() -> Any:
    return tiny_model("llama")


@pytest.fixture(scope="module")
def live(tiny: Any) -> Iterator[Live]:
    # adaptive=False: every step runs its full draft, so what a test exercises never depends on how
    # fast this machine happens to be (the speculation gate times the steps).
    with serve(tiny, ServerConfig(max_queue=64, adaptive=False)) as server:
        yield server
