"""Every random purpose has its own stream: no two purposes, and no two draws of one purpose,
can share a key, and nothing in fedapp seeds a generator from the run seed any other way."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import numpy as np
import pytest

from fedapp.random_streams import Stream, stream_key, stream_rng, stream_seed, stream_seed32

PACKAGE = Path(__file__).resolve().parents[2] / "fedapp"
#: Modules that may build a generator themselves, and why.
SEEDS_GIVEN_BY_THE_CALLER = {
    "random_streams.py": "the streams themselves",
    "training/loops.py": "seed_local_work: torch's generators from a stream's seed",
    "partitions/budgets.py": "the FEAST authors' legacy draw, np.random.seed(seed)",
    "partitions/cohorts.py": "the FEAST authors' legacy cohorts, np.random.seed(round - 1)",
    "partitions/budget_dirichlet.py": "a partitioner given the partition stream's seed",
    "models/ga.py": "the GA's search seed, an argument of the search",
    "models/elastic_resnet.py": "initial weights from the seed its caller passes",
    "models/early_exits.py": "initial weights from the seed its caller passes",
    "models/bn_calibration.py": "augmentation during recalibration, from its caller's seed",
    "data/transforms.py": "the Beta draw of Mixup, seeded from the local work's generator",
    "tools/device_speed.py": "fedapp profile's fixed synthetic batch, not part of any run",
}
_GENERATOR_CALL = re.compile(r"default_rng\(|RandomState\(|manual_seed\(|SeedSequence\(")


def _keys() -> list[tuple[Stream, tuple[int, ...]]]:
    parts = [()]
    for length in (1, 2, 3):
        parts += list(itertools.product((0, 1, 7, 11), repeat=length))
    return [(stream, p) for stream in Stream for p in parts]


def test_no_two_purposes_or_draws_share_a_stream() -> None:
    """Distinct (purpose, parts) give distinct SeedSequence states, also where numpy pads a
    short key with zeros."""
    states = {}
    for stream, parts in _keys():
        state = tuple(np.random.SeedSequence(stream_key(42, stream, *parts)).generate_state(4))
        assert state not in states, f"{stream.name}{parts} meets {states.get(state)}"
        states[state] = (stream.name, parts)
    assert len(states) == len(Stream) * (1 + 4 + 16 + 64)


def test_the_count_of_parts_is_needed_because_numpy_pads_short_keys() -> None:
    """Without it, (seed, purpose) and (seed, purpose, 0) would be one stream: the old cohort
    of round 7 and the old teacher folds were keyed [seed, 7] alike."""
    padded = np.random.default_rng([42, 7]).random(3)
    np.testing.assert_array_equal(padded, np.random.default_rng([42, 7, 0]).random(3))
    assert stream_key(42, Stream.COHORT) != stream_key(42, Stream.COHORT, 0)
    assert stream_rng(42, Stream.COHORT).random() != stream_rng(42, Stream.COHORT, 0).random()


def test_purposes_are_numbered_once_and_keys_are_reproducible() -> None:
    assert len({int(s) for s in Stream}) == len(Stream)
    assert stream_seed(42, Stream.LOCAL_TRAINING, 3, 5) == stream_seed(
        42, Stream.LOCAL_TRAINING, 3, 5
    )
    assert stream_seed(42, Stream.LOCAL_TRAINING, 3, 5) != stream_seed(
        43, Stream.LOCAL_TRAINING, 3, 5
    )
    assert 0 <= stream_seed(42, Stream.PARTITION) < 2**63
    assert 0 <= stream_seed32(42, Stream.PARTITION) < 2**32
    with pytest.raises(ValueError, match=">= 0"):
        stream_key(42, Stream.COHORT, -1)


def test_every_generator_in_fedapp_comes_from_a_stream_or_a_given_seed() -> None:
    """A new ``default_rng(seed)`` somewhere would start a stream no other purpose is kept
    apart from; it must go through fedapp.random_streams (or be listed here with its reason)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        if name in SEEDS_GIVEN_BY_THE_CALLER:
            continue
        for number, line in enumerate(path.read_text().splitlines(), start=1):
            code = line.split("#", 1)[0]
            if _GENERATOR_CALL.search(code) and "stream_seed" not in code:
                offenders.append(f"{name}:{number}: {line.strip()}")
    assert not offenders, "generators seeded outside fedapp.random_streams:\n" + "\n".join(
        offenders
    )
    for name in SEEDS_GIVEN_BY_THE_CALLER:
        assert (PACKAGE / name).exists(), f"stale entry {name}"
