"""Tree accept (walk) and KV compaction against their references."""
import contextlib

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import kv_compaction as kc, sampling, tree_accept as ta

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host


def logits_choosing(chosen, V=16):
    x = np.zeros((len(chosen), V), np.float32)
    x[np.arange(len(chosen)), chosen] = 5.0
    return x


def test_docstring_example():
    tokens, parents = [5, 7, 9], [0, 0, 1]
    path, bonus = ta.accept(logits_choosing([7, 1, 3, 4]), tokens, parents, 3)
    assert (path, bonus) == ([0, 2], 3)
    assert ta.walk_ref([7, 1, 3, 4], tokens, parents, 3) == ([0, 2], 3)


def test_deep_walk_and_no_match():
    tokens, parents = [1, 2, 3, 4, 5], [0, 1, 2, 1, 4]              # 0 -> 1 -> 2 -> 3 and 1 -> 4 -> 5
    assert ta.accept(logits_choosing([1, 4, 3, 9, 5, 6]), tokens, parents, 5) == ([0, 1, 4, 5], 6)
    assert ta.accept(logits_choosing([11, 4, 3, 9, 5, 6]), tokens, parents, 5) == ([0], 11)
    assert ta.accept(logits_choosing([3]), np.zeros(1, np.int32), np.zeros(1, np.int32), 0) == ([0], 3)


def test_random_trees_match_reference_greedy_and_sampled():
    rng = np.random.default_rng(4)
    for trial in range(6):
        n, V = int(rng.integers(1, 12)), 6
        parents = np.array([rng.integers(0, j) for j in range(1, n + 1)], np.int32)
        tokens = rng.integers(0, V, n).astype(np.int32)
        for j in range(1, n + 1):          # siblings carry distinct tokens, as in a real tree
            sib = [i for i in range(1, j) if parents[i - 1] == parents[j - 1]]
            while tokens[j - 1] in tokens[[i - 1 for i in sib]]:
                tokens[j - 1] = (tokens[j - 1] + 1) % V
        x = (rng.standard_normal((n + 1, V)) * 2).astype(np.float32)
        depth = np.zeros(n + 1, np.int32)
        for j in range(1, n + 1):
            depth[j] = depth[parents[j - 1]] + 1
        for T in (0.0, 0.9):
            got = ta.accept(x, tokens, parents, n, T, seed=trial, stream=2)
            want = ta.walk_ref(sampling.choose_tokens_ref(x, T, trial, 2, row_streams=depth), tokens, parents, n)
            assert got == want                     # node j draws at position 2 + its depth


def test_nan_logits_are_reported():
    x = logits_choosing([1, 2])
    x[1, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        ta.accept(x, [1], [0], 1)


@pytest.mark.parametrize("backend_name", ["kernel", "numpy"])
def test_nan_in_a_rejected_node_does_not_matter(backend_name):
    """Plain decoding never computes a rejected node's logits, so a NaN there must not abort the round: root
    chooses 1 -> node 1 (token 1) accepted, node 2 (token 4) rejected with NaN logits, bonus = node 1's choice."""
    x = logits_choosing([1, 3, 0])
    x[2, :] = np.nan
    with kd.backend.use("numpy") if backend_name == "numpy" else contextlib.nullcontext():
        assert ta.accept(x, [1, 4], [0, 0], 2) == ([0, 1], 3)


@pytest.mark.parametrize("accepted,start", [([0, 2, 5], 10), ([0, 1, 2, 3], 4), ([0], 0),
                                            ([0] + list(range(3, 40, 2)), 1)])
def test_compaction_moves_rows_in_every_layer(accepted, start):
    rng = np.random.default_rng(len(accepted))
    cache = rng.standard_normal((3, start + 45, 133)).astype(np.float32)
    want = cache.copy()
    kc.compact_ref(want, start, np.array(accepted))
    dev = kd.backend.asarray(cache.copy())
    kc.compact(dev, start, np.array(accepted, np.int32))
    got = H(dev)
    np.testing.assert_array_equal(got, want)
    # invariants: the committed prefix is untouched and the accepted rows keep their order
    np.testing.assert_array_equal(got[:, :start], cache[:, :start])
    np.testing.assert_array_equal(got[:, start:start + len(accepted)], cache[:, [start + a for a in accepted]])


def test_compaction_with_device_count_uses_only_the_first_n():
    cache = np.arange(2 * 12 * 4, dtype=np.float32).reshape(2, 12, 4)
    dev = kd.backend.asarray(cache)
    kc.compact(dev, 2, np.array([0, 3, 7, -1], np.int32), kd.backend.asarray(np.array([3], np.int32)))
    want = cache.copy()
    kc.compact_ref(want, 2, np.array([0, 3, 7]))
    np.testing.assert_array_equal(H(dev), want)


@pytest.mark.parametrize("F", [5, 300])             # narrower and wider than the cache's 4 columns (grid columns)
def test_compaction_gathers_another_arrays_rows_in_the_same_launch(F):
    """gather=(src, dst): dst[j] = src[max(accepted[j], 0)] for every slot - padding -1 slots take row 0 - beside
    the unchanged compaction (the replayed round's features for the drafter), with a device-side start and count."""
    rng = np.random.default_rng(F)
    cache = rng.standard_normal((2, 12, 4)).astype(np.float32)
    src = rng.standard_normal((9, F)).astype(np.float32)
    accepted = np.array([0, 3, 7, -1], np.int32)
    dev, dst = kd.backend.asarray(cache), kd.backend.full((4, F), np.nan, np.float32)
    start = kd.backend.asarray(np.array([2], np.int32))
    kc.compact(dev, start, accepted, kd.backend.asarray(np.array([3], np.int32)), gather=(kd.backend.asarray(src), dst))
    want = cache.copy()
    kc.compact_ref(want, 2, np.array([0, 3, 7]))
    np.testing.assert_array_equal(H(dev), want)
    np.testing.assert_array_equal(H(dst), src[[0, 3, 7, 0]])


def test_bad_gathers_are_named():
    cache = kd.backend.zeros((2, 12, 4), np.float32)
    acc = np.array([0, 3], np.int32)
    src = kd.backend.zeros((9, 5), np.float32)
    with pytest.raises(ValueError, match=r"gather: expected a pair \(src \[T, F\], dst \[M, F\]\), got list"):
        kc.compact(cache, 2, acc, gather=[src, src])
    with pytest.raises(ValueError, match=r"gather dst: expected shape \(2, 5\), got \(3, 5\)"):
        kc.compact(cache, 2, acc, gather=(src, kd.backend.zeros((3, 5), np.float32)))
    with pytest.raises(ValueError, match="gather dst: expected the \\[M, F\\] array to gather into, got None"):
        kc.compact(cache, 2, acc, gather=(src, None))
