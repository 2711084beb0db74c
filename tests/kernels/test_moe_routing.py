"""noaux_tc routing, grouping and combine: exact indices vs the reference (ties on purpose) and invariants."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import moe_grouped_gemm, moe_routing as mr

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host


@pytest.mark.parametrize("T,E,k,G,TG,norm", [(7, 24, 3, 4, 2, True), (5, 16, 2, 1, 1, True),
                                             (3, 12, 4, 3, 3, False), (6, 10, 1, 5, 2, True)])
def test_route_matches_reference(T, E, k, G, TG, norm):
    rng = np.random.default_rng(T * E)
    logits = rng.standard_normal((T, E)).astype(np.float32)
    bias = (0.3 * rng.standard_normal(E)).astype(np.float32)
    idx, w = mr.route(logits, bias, k, G, TG, norm, 2.5)
    ridx, rw = mr.route_ref(logits, bias, k, G, TG, norm, 2.5)
    np.testing.assert_array_equal(H(idx), ridx)
    np.testing.assert_allclose(H(w), rw, rtol=1e-5)
    # invariants: normalised weights sum to the scale; chosen experts lie in the kept groups
    if norm:
        np.testing.assert_allclose(H(w).sum(axis=1), 2.5, rtol=1e-5)
    choice = 1 / (1 + np.exp(-logits.astype(np.float64))) + bias
    gsize = E // G
    gscore = np.sort(choice.reshape(T, G, gsize), axis=-1)[..., -2:].sum(-1) if gsize > 1 else choice
    for t in range(T):
        kept = set(np.argsort(-gscore[t], kind="stable")[:TG]) if TG < G else set(range(G))
        assert {int(e) // gsize for e in H(idx)[t]} <= kept


@pytest.mark.parametrize("E,k,G,TG", [(16, 2, 1, 1), (24, 3, 4, 2)])
def test_route_reads_the_router_columns_of_the_fused_product(E, k, G, TG):
    """The target's MoE routes on y[:, :E] of the fused router + shared-expert GEMM: a strided view, no copy."""
    rng = np.random.default_rng(E)
    y = rng.standard_normal((5, E + 12)).astype(np.float32)                 # [T, E + 2 Is]
    bias = (0.3 * rng.standard_normal(E)).astype(np.float32)
    idx, w = mr.route(kd.backend.asarray(y)[:, :E], bias, k, G, TG, True, 2.5)
    ridx, rw = mr.route_ref(y[:, :E], bias, k, G, TG, True, 2.5)
    np.testing.assert_array_equal(H(idx), ridx)
    np.testing.assert_allclose(H(w), rw, rtol=1e-5)


def test_ties_prefer_lower_expert_and_group_index():
    # all experts equal: the lowest indices of the lowest-index kept groups win
    logits = np.zeros((2, 8), np.float32)
    bias = np.zeros(8, np.float32)
    idx, w = mr.route(logits, bias, 3, 4, 2, True, 1.0)
    np.testing.assert_array_equal(H(idx), [[0, 1, 2], [0, 1, 2]])
    np.testing.assert_allclose(H(w), 1 / 3, rtol=1e-6)
    # a tie between experts 5 and 2 at the top: 2 first; group scores tie between groups 1 and 2 -> group 1
    logits = np.array([[-9, -9, 3, -9, -9, 3, -9, -9]], np.float32)
    idx, _ = mr.route(logits, bias, 2, 1, 1, True, 1.0)
    np.testing.assert_array_equal(H(idx), [[2, 5]])
    np.testing.assert_array_equal(H(idx), mr.route_ref(logits, bias, 2, 1, 1, True, 1.0)[0])
    g = np.array([[-9, -9, 1, 1, 1, 1, -9, -9]], np.float32)          # groups of 2: group 1 == group 2
    idx, _ = mr.route(g, bias, 2, 4, 1, True, 1.0)
    np.testing.assert_array_equal(H(idx), [[2, 3]])


def test_bias_selects_but_does_not_weight():
    logits = np.array([[2.0, 0.0, 0.0, 0.0]], np.float32)
    bias = np.array([0.0, 5.0, 0.0, 0.0], np.float32)
    idx, w = mr.route(logits, bias, 1, 1, 1, False, 1.0)
    assert H(idx)[0, 0] == 1
    assert H(w)[0, 0] == pytest.approx(0.5)                # sigmoid(0), not sigmoid(0) + 5


@pytest.mark.parametrize("T,k,E,used", [(9, 3, 7, 7), (21, 2, 12, 5), (33, 2, 8, 8)])   # 5 of 12: empty experts, first
# and last; 33 x 2: a DDTree-32 verify (the GPU: one scan chunk of 128 threads)
def test_group_by_expert_and_combine_round_trip(T, k, E, used):
    rng = np.random.default_rng(11)
    Hd = 5
    experts = np.arange(1, E, 2)[:used] if used < E else np.arange(E)          # used < E: odd ids only
    idx = np.stack([rng.permutation(experts)[:k] for _ in range(T)]).astype(np.int32)
    counts, offsets, order, slot = (H(a) for a in mr.group_by_expert(idx, E))
    rc, ro, rorder, rslot = mr.group_by_expert_ref(idx, E)
    for got, want in ((counts, rc), (offsets, ro), (order, rorder), (slot, rslot)):
        np.testing.assert_array_equal(got, want)
    for tile_rows in (1, 3, 16):                                        # the tile table from the same launch
        tiled = [H(a) for a in mr.group_by_expert_tiled(idx, E, tile_rows)]
        for got, want in zip(tiled, (rc, ro, rorder, rslot, moe_grouped_gemm.tile_table_ref(ro, tile_rows))):
            np.testing.assert_array_equal(got, want)
    flat = idx.reshape(-1)
    assert np.all(np.diff(flat[order]) >= 0)                            # expert-major
    for e in range(E):                                                  # stable: token order within an expert
        assert np.all(np.diff(order[offsets[e]:offsets[e + 1]]) > 0)
    x = rng.standard_normal((T, Hd)).astype(np.float32)
    xs = H(mr.gather_rows(x, order, k))                                 # the experts' input rows, expert-major
    np.testing.assert_array_equal(xs, x[order // k])
    assert not np.array_equal(xs, x[np.arange(T * k) // k])             # the grouping moved rows
    ys = xs * 2.0                                                       # "expert output": 2x its input row
    w = rng.random((T, k)).astype(np.float32)
    got = H(mr.combine(ys, w, slot))
    np.testing.assert_allclose(got, 2.0 * x * w.sum(1, keepdims=True), rtol=1e-5)
    acc = kd.backend.asarray(np.ones((T, Hd), np.float32))
    mr.combine(ys, w, slot, out=acc)
    np.testing.assert_allclose(H(acc), 1 + got, rtol=1e-5)


def test_grouping_no_assignments():
    """No tokens: every count, offset and tile is 0 (nothing launched), tiled or not."""
    got = [H(a) for a in mr.group_by_expert_tiled(np.zeros((0, 2), np.int32), 5, 16)]
    for a in (got[0], got[1], got[4]):
        assert a.shape in ((5,), (6,)) and not a.any()
    assert got[2].size == got[3].size == 0


@pytest.mark.parametrize("call, arg", [
    (lambda: mr.route(np.zeros((2, 6), np.float32), np.zeros(6, np.float32), 2, 4, 1), "n_group: 4 does not divide"),
    (lambda: mr.route(np.zeros((2, 6), np.float32), np.zeros(6, np.float32), 5, 3, 1), "top_k: expected an integer <= 2"),
    (lambda: mr.route(np.zeros((2, 6), np.float32), np.zeros(5, np.float32), 2), r"bias: expected shape \(6\)"),
    (lambda: mr.route(np.zeros((2, 6), np.float32), np.zeros(6, np.float32), 2, 2, 3), "topk_group: expected an integer <= 2"),
    (lambda: mr.group_by_expert(np.zeros((2, 2), np.int64), 4), "idx: expected dtype int32"),
    (lambda: mr.group_by_expert_tiled(np.zeros((2, 2), np.int32), 4, 0), "tile_rows: expected an integer >= 1"),
    (lambda: mr.gather_rows(np.zeros((2, 4), np.float32), np.zeros(3, np.int32), 2), r"order: expected shape \(4\)"),
    (lambda: mr.gather_rows(np.zeros((2, 4), np.float32), np.zeros(4, np.int32), 0), "k: expected an integer >= 1"),
    (lambda: mr.gather_rows(np.zeros((2, 4), np.float64), np.zeros(4, np.int32), 2), "x: expected dtype float32"),
])
def test_bad_input(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()
