"""Fixtures of the fault matrix: live clusters shaped per fault (config, nodes, mounts)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gq import config as config_mod
from tests.conftest import LiveCluster, prepare, running

MakeCluster = Callable[..., LiveCluster]


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[MakeCluster]:
    """Start one live cluster of the test's shape; it is stopped and checked for leftovers."""
    with contextlib.ExitStack() as stack:
        def make(nodes: int = 2, fake_gpus: str = "8",
                 change: Callable[[config_mod.Config], None] | None = None) -> LiveCluster:
            live = prepare(tmp_path)
            if change is not None:
                live.configure(change)
            return stack.enter_context(running(live, nodes, fake_gpus))
        yield make
