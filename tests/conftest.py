"""Project-wide test configuration: tests marked ``gpu`` skip cleanly without a CUDA device; the
``fresh_grace`` fixture gives a test a grace without graphs, decisions or stats of earlier tests, and
``store`` a new empty store that every command uses by default."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Iterator
from pathlib import Path

import pytest


@functools.cache
def cuda_available() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    gpu_items = [item for item in items if item.get_closest_marker("gpu")]
    if gpu_items and not cuda_available():
        skip = pytest.mark.skip(reason="needs a CUDA device (marker gpu)")
        for item in gpu_items:
            item.add_marker(skip)


@pytest.fixture
def fresh_pool_groups() -> Iterator[None]:
    """grace.stats and the step pools' groups emptied before and after the test (CPU pool-group tests)."""
    from grace import poolgroups, stats

    stats.forget_all()
    poolgroups.forget_step_groups()
    yield
    stats.forget_all()
    poolgroups.forget_step_groups()


@pytest.fixture
def fresh_grace() -> Iterator[None]:
    """Dynamo's caches, grace's graphs and grace.stats emptied before and after the test."""
    import torch

    import grace
    from grace import stats

    torch._dynamo.reset()
    grace.reset()
    stats.forget_all()
    yield
    torch._dynamo.reset()
    grace.reset()


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A new empty store in ``tmp_path``, the default of every command (``cli_support.empty_store_in``)."""
    from cli_support import empty_store_in

    return empty_store_in(tmp_path, monkeypatch)
