"""The tree build's floor (module docstring of kernels/tree_build.py, "The floor"): the kernel's per-level candidate
counts and bisection probes equal the NumPy spec ``level_counts_ref``, trees stay equal to the heap's on adversarial
rows, and on realistic peaked rows at budgets up to 1024 every level's candidates fit the shared-memory sort."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import tree_build as tb

from ..helpers import softmax_logprobs


def build(lps, idss, budget, **kw):
    """Kernel build of R requests: (trees, candidates [R, L], probes [R, L], overflow [R]) on the host; the level
    loop (mode LEVELS unless ``mode`` is given: small budgets would run the heap path, which keeps no counts)."""
    kw.setdefault("mode", tb.LEVELS)
    lp, ids = np.stack(lps), np.stack(idss).astype(np.int32)
    builder = tb.TreeBuilder(*lp.shape, budget, **kw)
    out = builder.build(kd.backend.asarray(lp), kd.backend.asarray(ids))
    H = kd.backend.to_host
    return out.to_trees(), H(builder.candidates), H(builder.probes), H(builder.overflow)


def rows(kind, L, V, K, seed):
    """Top-K (log-probs, ids) of L draft rows over V tokens."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((L, V)) * 3
    if kind == "uniform":
        x[:] = 0
    elif kind == "ties":                       # many equal log-probs
        x = np.round(x / 3)
    elif kind == "neginf":                     # -inf tails (probability 0) after a few tokens
        x[:, 3:] = -np.inf
    elif kind == "peaked":
        x[:, 0] += 6
    return softmax_logprobs(x, K)


def test_floor_worked_example():
    """The module docstring's floor example: 9 candidates > 2B at depth 2, one probe, 4 candidates left."""
    lp = np.array([[-0.1, -0.2, -0.3], [-0.5, -1.0, -2.0]], np.float32)
    ids = np.array([[10, 11, 12], [20, 21, 22]], np.int32)
    want = tb.build_tree_ref(lp, ids, 4)
    np.testing.assert_array_equal(want.tokens, [10, 11, 12, 20])
    ref = tb.level_counts_ref(lp, 4)
    np.testing.assert_array_equal(ref.candidates, [3, 4])
    np.testing.assert_array_equal(ref.probes, [0, 1])
    np.testing.assert_allclose(ref.floors[1], -1.1, rtol=1e-6)
    if kd.backend.process_name != "numpy":
        trees, cand, probes, _ = build([lp], [ids], 4)
        assert trees[0] == want
        np.testing.assert_array_equal(cand[0], ref.candidates)
        np.testing.assert_array_equal(probes[0], ref.probes)


@pytest.mark.usefixtures("kernel_backend")
@pytest.mark.parametrize("L, V, K, budget", [
    (3, 9, 9, 8),          # K = V, 8 x 8 candidates at depth 2 > 2B: the floor is raised
    (4, 12, 3, 7),         # K < B
    (3, 6, 6, 1),          # budget 1
    (2, 12, 12, 1024),     # budget 1024 (156 nodes possible)
])
def test_counts_match_spec_and_trees_match_heap(L, V, K, budget):
    kinds = ["normal", "uniform", "ties", "neginf", "peaked"]
    lps, idss = zip(*(rows(k, L, V, K, seed) for seed, k in enumerate(kinds)))
    trees, cand, probes, overflow = build(lps, idss, budget)
    assert not overflow.any()
    for r, kind in enumerate(kinds):
        assert trees[r] == tb.build_tree_ref(lps[r], idss[r], budget), kind
        ref = tb.level_counts_ref(lps[r], budget)
        np.testing.assert_array_equal(cand[r], ref.candidates, err_msg=kind)
        np.testing.assert_array_equal(probes[r], ref.probes, err_msg=kind)
    if (L, K, budget) == (3, 9, 8):
        assert probes.sum() > 0                # the bisection ran
        # the slow paths (chains walked in order, bitonic sort) under raised floors build the same trees
        slow = build(lps, idss, budget, mode=tb.SLOW_CHAINS | tb.BITONIC)
        assert slow[0] == trees and slow[2].sum() > 0


@pytest.mark.usefixtures("kernel_backend")
def test_realistic_rows_k_equals_v():
    """One peaked drafter-like request with K = V (top-K as wide as the vocabulary)."""
    lp, ids = rows("normal", 4, 512, 512, 7)
    trees, cand, probes, _ = build([lp], [ids], 64)
    assert trees[0] == tb.build_tree_ref(lp, ids, 64)
    ref = tb.level_counts_ref(lp, 64)
    np.testing.assert_array_equal(cand[0], ref.candidates)
    np.testing.assert_array_equal(probes[0], ref.probes)


@pytest.mark.usefixtures("kernel_backend")
def test_equal_weights_cannot_be_cut():
    """Degenerate ties: 3 equally likely tokens at depth 1, a uniform depth 2: 3 x 8 equal-weight children; no
    floor separates them (count(t) is all or G alone), so all 24 > 2B stay candidates - still the heap's tree."""
    lp = np.full((2, 16), -np.inf, np.float32)
    lp[0, :3] = np.log(np.float32(1 / 3))
    lp[1, :] = np.log(np.float32(1 / 16))
    ids = np.tile(np.arange(16, dtype=np.int32), (2, 1))
    trees, cand, probes, _ = build([lp], [ids], 8)
    assert trees[0] == tb.build_tree_ref(lp, ids, 8)
    np.testing.assert_array_equal(cand[0], [3, 24])
    ref = tb.level_counts_ref(lp, 8)
    np.testing.assert_array_equal(cand[0], ref.candidates)
    np.testing.assert_array_equal(probes[0], ref.probes)
    assert probes[0, 1] > 0


@pytest.mark.usefixtures("kernel_backend")
def test_overflow_flag_and_unreached_levels():
    """A capacity below a level's candidates sets overflow (that level's count is still recorded); levels after the
    tree ends hold 0."""
    lp, ids = rows("normal", 3, 8, 8, 1)
    _, cand, _, overflow = build([lp], [ids], 8, capacity=4)
    assert overflow[0] == 1 and cand[0, 0] == 8 and cand[0, 1] == 0
    lp, ids = rows("neginf", 4, 8, 8, 2)
    lp[2:] = -np.inf                                                    # depths 3, 4: nothing
    trees, cand, probes, overflow = build([lp], [ids], 8)
    assert overflow[0] == 0 and trees[0] == tb.build_tree_ref(lp, ids, 8)
    np.testing.assert_array_equal(cand[0, 2:], 0)
    np.testing.assert_array_equal(cand[0], tb.level_counts_ref(lp, 8).candidates)


@pytest.mark.parametrize("scale", [3.0, 4.0, 6.0])
@pytest.mark.parametrize("L", [8, 16])
def test_realistic_rows_stay_in_shared_memory(L, scale):
    """NumPy (any backend): peaked drafter-like rows (log_softmax of N(0, scale^2) logits over V = 4096, K = V) at
    budgets 64, 256, 1024. With the raised floor every level's candidates fit SORT_CACHE (with G's smallest weight
    alone, some do not), and the floor is sound: every depth-d node of the heap's top-B (depths <= d) is above it."""
    rng = np.random.default_rng(int(scale * 10) + L)
    V = 4096
    x = rng.standard_normal((L, V)) * scale
    m = x.max(-1, keepdims=True)
    lp = np.sort((x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))).astype(np.float32), -1)[:, ::-1].copy()
    ids = np.zeros(lp.shape, np.int32)
    worst = 0
    for budget in (64, 256, 1024):
        ref = tb.level_counts_ref(lp, budget)
        assert ref.candidates.max() <= tb.SORT_CACHE, (budget, ref.candidates)
        for d in range(1, L + 1):
            top = tb.build_tree_ref(lp[:d], ids[:d], budget)
            kept = top.logw[top.depths == d]
            if kept.size == 0:
                break
            assert kept.min() >= ref.floors[d - 1], (budget, d)
        if budget == 1024:
            # the starting floor alone (G's smallest weight): what the chains held before the bisection
            top = tb.build_tree_ref(lp[:1], ids[:1], budget)
            n_lp = min(V, budget)
            w2 = top.logw[:, None] + lp[1, :n_lp].astype(np.float64)[None, :]
            worst = np.count_nonzero(w2 >= tb._floor_below_ref(top.logw.min()))
    assert worst > tb.SORT_CACHE                # the bisection was needed at level 2, B = 1024


@pytest.mark.gpu
def test_equal_weights_above_the_cache_sort_in_global_memory():
    """3 x 1024 equal-weight candidates at B = 1024 (module docstring, degenerate inputs): > SORT_CACHE, sorted in
    global memory, the heap's tree all the same."""
    lp = np.full((2, 1024), -np.inf, np.float32)
    lp[0, :3] = np.log(np.float32(1 / 3))
    lp[1, :] = np.log(np.float32(1 / 1024))
    ids = np.tile(np.arange(1024, dtype=np.int32), (2, 1))
    trees, cand, _, overflow = build([lp], [ids], 1024)
    assert cand[0, 1] == 3072 and not overflow[0]
    assert trees[0] == tb.build_tree_ref(lp, ids, 1024)
