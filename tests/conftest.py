"""Shared fixtures: the app's default run config and an isolated output folder."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))


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
