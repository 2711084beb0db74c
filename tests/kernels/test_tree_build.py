"""The GPU/sim tree build against the heap algorithm: same nodes, order, parents, depths, tokens, float64 weights."""
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import kdtree_numba as kd
from kdtree_numba.kernels import tree_build as tb, tree_heap as th

from ..helpers import softmax_logprobs

pytestmark = pytest.mark.usefixtures("kernel_backend")
EXAMPLES = 400 if kd.backend.process_name == "cuda" else 25
# CI (simulator) draws the same examples every run so it cannot flake; the GPU run explores fresh ones
DERANDOMIZE = kd.backend.process_name != "cuda"


def draft(rng, L, V, kind):
    x = (rng.standard_normal((L, V)) * rng.choice([0.3, 1.0, 3.0])).astype(np.float32)
    if kind == "uniform":
        x[:] = 0.0
    elif kind == "ties":
        x = np.round(x)
    elif kind == "some_uniform":
        x[rng.random(L) < 0.5] = 1.5
    elif kind == "peaked":
        x[:, 0] += 9
    elif kind == "neginf":
        x[rng.random((L, V)) < 0.5] = -np.inf
        x[:, min(1, V - 1)] = 0.0                                # one finite value per row
    return x


def kernel_tree(lp, ids, budget, mode, counts=False):
    """The kernel's tree of one request built with TreeBuilder ``mode`` (LEVELS / HEAP: the level loop / the heap
    path whatever ``heap_path`` picks); with ``counts``, also the candidates per depth (all 0: the heap path ran)."""
    builder = tb.TreeBuilder(1, *lp.shape, budget, mode=mode)
    builder.build(kd.backend.asarray(lp[None]), kd.backend.asarray(ids[None].astype(np.int32)))
    tree = builder.out.to_trees()[0]
    return (tree, kd.backend.to_host(builder.candidates)[0]) if counts else tree


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), derandomize=DERANDOMIZE)
@given(seed=st.integers(0, 2 ** 31), L=st.integers(1, 5), K=st.integers(1, 5), extra=st.integers(0, 3),
       budget=st.integers(1, 30), kind=st.sampled_from(["normal", "uniform", "ties", "some_uniform", "peaked",
                                                         "neginf"]))
def test_build_matches_heap(seed, L, K, extra, budget, kind):
    rng = np.random.default_rng(seed)
    lp, ids = softmax_logprobs(draft(rng, L, K + extra, kind), K)
    got, counts = kernel_tree(lp, ids, budget, 0, counts=True)          # mode 0: heap_path picks
    want = tb.build_tree_ref(lp, ids, budget)
    assert got == want, (got, want)
    heap = tb.heap_path(lp, budget, 0)
    assert (counts.max() == 0) == heap                                  # the kernel picked as the host says
    # the path mode 0 did not take, and the slow paths the level loop's fast ones fall back to (chains walked in
    # order, bitonic sort)
    other = tb.LEVELS if heap else tb.HEAP
    for mode in (other, tb.SLOW_CHAINS | tb.BITONIC):
        assert kernel_tree(lp, ids, budget, mode) == want, mode
    # invariants: prefix-closed, pops in non-increasing weight up to rounding, parents before children
    assert got.parents[0] == -1 and np.all(got.parents[1:] < np.arange(1, got.n + 1))
    assert np.all(got.depths == np.concatenate([[0], got.depths])[got.parents[1:]] + 1)


def test_batch_of_requests_and_budget_beyond_possible_nodes():
    rng = np.random.default_rng(5)
    lps, idss = zip(*(softmax_logprobs(draft(rng, 3, 6, k), 3) for k in ("normal", "uniform", "peaked")))
    trees = kd.build_trees(np.stack(lps), np.stack(idss), 50)          # 3 + 9 + 27 = 39 possible nodes
    for lp, ids, tree in zip(lps, idss, trees):
        assert tree == tb.build_tree_ref(lp, ids, 50)
        assert tree.n == 39


def test_single_depth_and_single_candidate():
    lp, ids = softmax_logprobs(np.array([[0.0, 2.0, 1.0]]), 3)
    t = kd.build_tree(lp, ids, 2)
    np.testing.assert_array_equal(t.tokens, [1, 2])
    np.testing.assert_array_equal(t.parents, [-1, 0, 0])
    lp, ids = softmax_logprobs(np.random.default_rng(0).standard_normal((4, 9)), 1)
    t = kd.build_tree(lp, ids, 10)                                      # K = 1: a chain
    np.testing.assert_array_equal(t.parents, [-1, 0, 1, 2, 3])
    assert kd.build_tree(lp, ids, 0).n == 0


@pytest.mark.parametrize("budget", [1, 3, 6, 7, 20])
def test_chain_shortcut(budget):
    """K = 1 (the DFlash chain) skips the level loop: the same tree, paths and padding as the heap's, and the level
    statistics the loop would have written - including a log-prob of exactly 0 at depth B + 1 (its child reaches
    G's floor, is counted, and cut) and a -inf row that ends the chain early."""
    H = kd.backend.to_host
    rows = [np.array([-0.5, -0.25, 0.0, -1.0, 0.0, -0.125, 0.0], np.float32),
            np.array([-0.5, -0.25, -np.inf, -1.0, -2.0, -0.125, -0.5], np.float32)]
    for lp_row in rows:
        L = lp_row.shape[0]
        lp = lp_row[:, None]                                         # [L, 1]
        ids = (np.arange(L, dtype=np.int32)[:, None] + 10)           # [L, 1]
        builder = tb.TreeBuilder(1, L, 1, budget)
        out = builder.build(kd.backend.asarray(lp[None]), kd.backend.asarray(ids[None]))
        tree = out.to_trees()[0]
        assert tree == tb.build_tree_ref(lp, ids, budget)
        n = tree.n
        paths, depth = tree.paths(L)
        np.testing.assert_array_equal(H(out.paths)[0, :n + 1], paths)
        np.testing.assert_array_equal(H(out.path_depth)[0, :n + 1], depth)
        np.testing.assert_array_equal(H(out.paths)[0, n + 1:, 1], np.arange(n + 1, budget + 1))   # root children
        want = tb.level_counts_ref(lp, budget)
        np.testing.assert_array_equal(H(builder.candidates)[0], want.candidates)
        np.testing.assert_array_equal(H(builder.probes)[0], want.probes)


@pytest.mark.parametrize("L, budget", [(70, 70), (70, 20)])
def test_long_chain_table(L, budget):
    """A chain of more than RANK_SORT nodes keeps its node table in global memory, a shorter one (even of a deep
    draft) in shared memory: both give the heap's tree and paths."""
    assert L > tb.RANK_SORT
    lp = -np.linspace(0.01, 0.7, L, dtype=np.float32)[:, None]          # [L, 1]
    ids = np.arange(L, dtype=np.int32)[:, None]
    out = tb.TreeBuilder(1, L, 1, budget).build(kd.backend.asarray(lp[None]), kd.backend.asarray(ids[None]))
    tree = out.to_trees()[0]
    assert tree == tb.build_tree_ref(lp, ids, budget) and tree.n == budget
    paths, _ = tree.paths(L)
    np.testing.assert_array_equal(kd.backend.to_host(out.paths)[0, :budget + 1], paths)


def test_inexact_telescoping_walks_chains_in_order():
    """W + lp[0] rounds here, so the heap's second child (W + lp[0] - lp[0]) + lp[1] differs in the last bit from
    W + lp[1]: the fast path must notice and walk the chain in the heap's order."""
    lp = np.array([[-4.363296e-09, -19.0], [-30.53238, -32.163254]], np.float32)
    ids = np.array([[0, 1], [0, 1]], np.int32)
    w = np.float64(lp[0, 0])
    assert (w + np.float64(lp[1, 0]) - np.float64(lp[1, 0])) + np.float64(lp[1, 1]) != w + np.float64(lp[1, 1])
    for mode in (tb.HEAP, tb.LEVELS):
        assert kernel_tree(lp, ids, 6, mode) == tb.build_tree_ref(lp, ids, 6), mode


def test_weights_keep_the_heaps_signed_zeros():
    """A log-prob of -0.0 (a one-token row) is the heap's first weight as it is: 0.0 + -0.0 would be +0.0, which
    Tree equality (bitwise weights) tells apart. Found by the GPU run's fresh examples (L = 1, K = 1) in the chain
    path; the heap and level paths (K = 2) are checked too."""
    for K in (1, 2):
        lp = np.full((2, K), -np.inf, np.float32)
        lp[:, 0] = -0.0
        ids = np.zeros((2, K), np.int32)
        want = tb.build_tree_ref(lp, ids, 2)
        assert np.signbit(want.logw).all()
        for mode in ((0,) if K == 1 else (tb.HEAP, tb.LEVELS)):
            assert kernel_tree(lp, ids, 2, mode) == want, (K, mode)


def test_heap_fits():
    """The heap path fits budgets up to HEAP_BUDGET with K > 1 while the log-prob rows a pop reads fit the
    kernel's 2 x MAX_BUDGET-float row buffer."""
    assert th.heap_fits(15, 4096, 64) and th.heap_fits(31, 4096, 64) and th.heap_fits(15, 2, 1)
    assert not th.heap_fits(15, 4096, th.HEAP_BUDGET + 1)
    assert not th.heap_fits(15, 1, 64)                                  # a chain: _chain_nodes
    assert not th.heap_fits(32, 4096, 64)                               # 32 x 65 rows > 2048 floats


def peaked_rows(L, V, K, boost, seed=11):
    """Rows of N(0, 4) logits with rank 0 raised by ``boost``: the higher, the deeper the tree."""
    x = np.random.default_rng(seed).standard_normal((L, V)) * 2
    x[:, 0] += boost
    return softmax_logprobs(x, K)


def test_depth_bound_bounds_the_depth():
    """depth_bound never falls below the tree's depth, and on the docstring's rows it is 2."""
    assert th.depth_bound(np.array([[-0.1, -2.5], [-0.2, -1.8]], np.float32), 2) == 2
    for boost in (0, 3, 6, 9, 12):
        for budget in (1, 4, 16, 64):
            lp, ids = peaked_rows(8, 96, 80, boost, seed=boost)
            depth = tb.build_tree_ref(lp, ids, budget).depths.max()
            assert depth <= th.depth_bound(lp, budget) <= 8, (boost, budget)


def test_heap_path_choice():
    """Mode 0 picks the heap for deep trees and the level loop for shallow ones (budget <= 8 x depth_bound), and
    the kernel picks as the host says: the heap path leaves the candidate counts 0."""
    deep, shallow = peaked_rows(5, 96, 32, 12), peaked_rows(5, 96, 32, 0)
    assert th.depth_bound(deep[0], 32) == 5 and th.depth_bound(shallow[0], 32) == 2     # 32 <= 40, 32 > 16
    assert tb.heap_path(deep[0], 32, 0) and not tb.heap_path(shallow[0], 32, 0)
    assert tb.heap_path(shallow[0], 32, tb.HEAP) and not tb.heap_path(deep[0], 32, tb.LEVELS)
    assert not any(tb.heap_path(deep[0], 32, m) for m in (tb.SLOW_CHAINS, tb.BITONIC))
    for (lp, ids), heap in ((deep, True), (shallow, False)):
        tree, counts = kernel_tree(lp, ids, 32, 0, counts=True)
        assert tree == tb.build_tree_ref(lp, ids, 32)
        assert (counts.max() == 0) == heap, counts


def test_heap_path_deep_tree():
    """The trained pair's kind of tree: peaked rows 15 deep, budget 64 - a tree many levels deep, where the level
    loop pays a level per depth. The heap path, the level loop and the heap reference agree node for node."""
    lp, ids = peaked_rows(15, 96, 80, 9)
    want = tb.build_tree_ref(lp, ids, 64)
    assert want.depths.max() == 15                                      # every depth reached
    assert tb.heap_path(lp, 64, 0)
    assert kd.build_tree(lp, ids, 64) == want
    assert kernel_tree(lp, ids, 64, tb.LEVELS) == want


@pytest.mark.parametrize("kind", ["uniform", "ties", "normal"])
def test_heap_lanes_widest_frontier(kind):
    """The sorted-lanes loop keeps 32 frontier nodes, enough for budget 64 (HEAP_BUDGET): wide rows where nearly
    every pop pushes both a sibling and a child grow the frontier to 32 nodes and past it (uniform rows: equal
    weights everywhere, every order decided by rank tuples); the heap reference and the level loop agree."""
    rng = np.random.default_rng(7)
    lp, ids = softmax_logprobs(draft(rng, 8, 80, kind), 72)
    want = tb.build_tree_ref(lp, ids, th.HEAP_BUDGET)
    assert kernel_tree(lp, ids, th.HEAP_BUDGET, tb.HEAP) == want
    assert kernel_tree(lp, ids, th.HEAP_BUDGET, tb.LEVELS) == want


def test_heap_lanes_rows_fill_the_buffer():
    """L x min(K, B + 1) = ROW_FLOATS exactly (32 depths x 64 ranks, budget 64): peaked rows make a chain 32 deep, so a
    depth-32 node pops and its (absent) child's log-probs are read - clamped into the staged rows, never past them
    (the simulator's shared arrays raise on an index past their end)."""
    assert th.heap_fits(32, 64, th.HEAP_BUDGET) and 32 * 64 == th.ROW_FLOATS
    rng = np.random.default_rng(11)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    x[:, 0] += 12                                           # rank 0 of every depth far ahead: the greedy chain
    lp, ids = softmax_logprobs(x, 64)
    got = kernel_tree(lp, ids, th.HEAP_BUDGET, tb.HEAP)
    assert got == tb.build_tree_ref(lp, ids, th.HEAP_BUDGET) and got.depths.max() == 32


def test_docstring_worked_example():
    lp = np.array([[-0.1, -2.5], [-0.2, -1.8]], np.float32)
    ids = np.array([[10, 11], [20, 21]], np.int32)
    t = kd.build_tree(lp, ids, 3)
    np.testing.assert_array_equal(t.tokens, [10, 20, 21])
    np.testing.assert_array_equal(t.parents, [-1, 0, 1, 1])
    assert t == tb.build_tree_ref(lp, ids, 3)


def test_paths_and_padding_for_verify():
    lp, ids = softmax_logprobs(np.random.default_rng(3).standard_normal((3, 2)), 2)
    builder = tb.TreeBuilder(1, 3, 2, 20)                               # 14 possible nodes < budget 20
    out = builder.build(kd.backend.asarray(lp[None]), kd.backend.asarray(ids[None]))
    H = kd.backend.to_host
    n = int(H(out.n)[0])
    tree = out.to_trees()[0]
    paths, depth = tree.paths(3)
    np.testing.assert_array_equal(H(out.paths)[0, :n + 1], paths)
    np.testing.assert_array_equal(H(out.path_depth)[0, :n + 1], depth)
    assert n == 14
    pad = H(out.paths)[0, n + 1:]                                       # padding nodes: children of the root
    np.testing.assert_array_equal(pad[:, 0], 0)
    np.testing.assert_array_equal(pad[:, 1], np.arange(n + 1, 21))


@pytest.mark.parametrize("lp, ids, budget, msg", [
    (np.array([[-1.0, -0.5]], np.float32), np.array([[0, 1]]), 2, "not sorted in descending order"),
    (np.array([[np.nan, -1.0]], np.float32), np.array([[0, 1]]), 2, "contains NaN"),
    (np.array([[-0.5, -1.0], [0.25, -1.0]], np.float32), np.array([[0, 1], [2, 3]]), 2,
     r"top_logprobs: 0.25 at \(request 0, depth 2, rank 0\) is not a log-probability \(expected values <= 0\)"),
    (np.array([[-1.0, -2.0]], np.float32), np.array([[0, 1]]), -1, "budget: expected an integer >= 0"),
    (np.array([[-1.0, -2.0]], np.float32), np.array([[0, 1]]), 2.0, "budget: expected an integer"),
    (np.array([[-1.0, -2.0]], np.float32), np.array([[0, 1, 2]]), 2, r"top_ids: expected shape \(1, 2\)"),
    (np.array([[-1.0, -2.0]], np.float64), np.array([[0, 1]]), 2, "top_logprobs: expected dtype float32"),
])
def test_bad_input(lp, ids, budget, msg):
    with pytest.raises(ValueError, match=msg):
        kd.build_tree(lp, ids, budget)
