"""Sparse sample-weighted aggregation against a naive per-element reference."""

from __future__ import annotations

import numpy as np
import pytest

from fedapp.models.slicing import SliceAccumulator, extract, is_averaged


def _naive_average(
    old: dict[str, np.ndarray], replies: list[tuple[dict[str, np.ndarray], float]]
) -> dict[str, np.ndarray]:
    """Per-element sum and count arrays of the global shape, float64: the definition itself."""
    out = {}
    for name, tensor in old.items():
        if not is_averaged(name):
            out[name] = tensor.copy()
            continue
        total = np.zeros(tensor.shape)
        weight = np.zeros(tensor.shape)
        for state, w in replies:
            if name in state:
                sub = state[name]
                for pos in np.ndindex(*sub.shape):
                    total[pos] += w * sub[pos]
                    weight[pos] += w
        new = tensor.astype(np.float64)
        covered = weight > 0
        new[covered] = total[covered] / weight[covered]
        out[name] = new.astype(tensor.dtype)
    return out


def _global(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "conv.weight": rng.standard_normal((6, 5, 3, 3)).astype(np.float32),
        "bn.weight": rng.standard_normal(6).astype(np.float32),
        "bn.running_mean": rng.standard_normal(6).astype(np.float32),
        "bn.running_var": rng.random(6).astype(np.float32) + 0.5,
        "bn.num_batches_tracked": np.array(7, dtype=np.int64),
        "head.weight": rng.standard_normal((4, 6)).astype(np.float32),
        "scale": np.array(1.5, dtype=np.float32),
        "unrouted.weight": rng.standard_normal((3, 3)).astype(np.float32),
    }


def _reply(rng: np.random.Generator, old: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Random leading slices (not nested across clients) of a random subset of tensors."""
    out = {}
    for name, tensor in old.items():
        if name.startswith("unrouted") or rng.random() < 0.2:
            continue
        shape = tuple(int(rng.integers(1, n + 1)) for n in tensor.shape)
        if tensor.dtype.kind == "f":
            out[name] = rng.standard_normal(shape).astype(tensor.dtype)
        else:
            out[name] = np.full(shape, 99, dtype=tensor.dtype)
    return out


@pytest.mark.parametrize("seed", range(6))
def test_accumulator_equals_naive_per_element_average(seed: int) -> None:
    rng = np.random.default_rng(seed)
    old = _global(rng)
    replies = [
        (_reply(rng, old), float(rng.integers(1, 500))) for _ in range(int(rng.integers(1, 8)))
    ]
    acc = SliceAccumulator(old)
    for state, weight in replies:
        acc.add(state, weight)
    got = acc.result()
    expected = _naive_average(old, replies)
    assert got.keys() == old.keys()
    for name in old:
        assert got[name].dtype == old[name].dtype and got[name].shape == old[name].shape
        np.testing.assert_allclose(got[name], expected[name], rtol=2e-6, atol=2e-6, err_msg=name)
    # Step counters keep their value; tensors nobody routed are untouched.
    assert got["bn.num_batches_tracked"] == 7
    np.testing.assert_array_equal(got["unrouted.weight"], old["unrouted.weight"])
    assert acc.total_weight == sum(w for _, w in replies)


def test_running_statistics_are_averaged_like_weights() -> None:
    old = {"bn.running_mean": np.zeros(4, np.float32), "bn.running_var": np.ones(4, np.float32)}
    acc = SliceAccumulator(old)
    acc.add({"bn.running_mean": np.full(2, 3.0, np.float32)}, 1.0)
    acc.add({"bn.running_mean": np.full(3, 6.0, np.float32)}, 2.0)
    new = acc.result()
    np.testing.assert_allclose(new["bn.running_mean"], [5.0, 5.0, 6.0, 0.0])
    np.testing.assert_array_equal(new["bn.running_var"], old["bn.running_var"])


def test_full_slices_give_plain_fedavg() -> None:
    rng = np.random.default_rng(0)
    old = {"w": rng.standard_normal((8, 4)).astype(np.float32)}
    states = [{"w": rng.standard_normal((8, 4)).astype(np.float32)} for _ in range(3)]
    weights = [1.0, 2.0, 5.0]
    acc = SliceAccumulator(old)
    for s, w in zip(states, weights, strict=True):
        acc.add(s, w)
    expected = sum(w * s["w"].astype(np.float64) for s, w in zip(states, weights, strict=True)) / 8
    np.testing.assert_allclose(acc.result()["w"], expected, rtol=1e-6)


def test_a_bad_reply_changes_nothing() -> None:
    old = {"a": np.zeros((2, 2), np.float32), "b": np.zeros(3, np.float32)}
    acc = SliceAccumulator(old)
    with pytest.raises(ValueError, match="does not fit"):
        acc.add({"a": np.ones((2, 2), np.float32), "b": np.ones(4, np.float32)}, 1.0)
    with pytest.raises(KeyError, match="not a global tensor"):
        acc.add({"a": np.ones((1, 1), np.float32), "zzz": np.ones(1, np.float32)}, 1.0)
    with pytest.raises(ValueError, match="positive"):
        acc.add({"a": np.ones((1, 1), np.float32)}, 0.0)
    np.testing.assert_array_equal(acc.result()["a"], old["a"])
    assert acc.total_weight == 0


def test_result_is_taken_once_and_leaves_the_old_state_alone() -> None:
    old = {"w": np.ones((2, 3), np.float32)}
    acc = SliceAccumulator(old)
    acc.add({"w": np.full((1, 2), 4.0, np.float32)}, 2.0)
    acc.add({"w": np.full((2, 1), 7.0, np.float32)}, 1.0)
    np.testing.assert_allclose(acc.result()["w"], [[5.0, 4.0, 1.0], [7.0, 1.0, 1.0]])
    np.testing.assert_array_equal(old["w"], np.ones((2, 3)))
    with pytest.raises(RuntimeError, match="already taken"):
        acc.result()
    with pytest.raises(RuntimeError, match="already taken"):
        acc.add({"w": np.ones((1, 1), np.float32)}, 1.0)


def test_extract_cuts_leading_slices_and_rejects_oversized_ones() -> None:
    state = {"w": np.arange(24, dtype=np.float32).reshape(4, 6), "n": np.array(3)}
    out = extract(state, {"w": (2, 3), "n": ()})
    np.testing.assert_array_equal(out["w"], state["w"][:2, :3])
    assert out["w"].flags.c_contiguous and out["n"].shape == () and out["n"] == 3
    with pytest.raises(ValueError, match="does not fit"):
        extract(state, {"w": (5, 1)})
