"""Shared set-up: the support modules on the path, a tier marker per folder, and an isolated
shard cache.

The folders mirror what a test exercises, and each folder's name is its marker: ``unit``
(fedapp's layers below the apps, and source checks), ``methods`` (each method's defining rules
and a short federation of it), ``federation`` (whole runs through the real ServerApp and
ClientApp over an in-process grid), ``system`` (real processes: ``flwr run``, SuperLink and
SuperNodes, Ray, the deployment scripts); a full-size check of most of a minute is also
``slow``. ``pytest -m "not system and not slow" -n auto`` is the fast tier: pytest-xdist runs it
on every core, one torch thread per worker (more would only contend).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
TIERS = ("unit", "methods", "federation", "system")
sys.path.insert(0, str(TESTS / "support"))
if os.environ.get("PYTEST_XDIST_WORKER"):  # set before any test module imports torch
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its folder's tier."""
    for item in items:
        folder = item.path.relative_to(TESTS).parts[0]
        if folder not in TIERS:
            raise pytest.UsageError(f"{item.nodeid}: tests live in one of {', '.join(TIERS)}")
        item.add_marker(folder)


@pytest.fixture(autouse=True, scope="session")
def _shard_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Client shards are cached in a folder of this session (also for the Flower processes the
    tests start, which inherit the environment), never in the user's ~/.cache."""
    previous = os.environ.get("FEDAPP_CACHE_DIR")
    os.environ["FEDAPP_CACHE_DIR"] = str(tmp_path_factory.mktemp("fedapp-cache"))
    yield
    if previous is None:
        del os.environ["FEDAPP_CACHE_DIR"]
    else:
        os.environ["FEDAPP_CACHE_DIR"] = previous
