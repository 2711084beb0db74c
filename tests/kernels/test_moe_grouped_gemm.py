"""Grouped expert GEMM: the tile table and both kernels vs the reference on the simulator at tiny shapes (empty
experts, one expert with every row, rows and Kdim off the tile), the reference vs a row-by-row loop, the MoE of the
model without a host read, and the GPU kernels at a Kimi-like decode shape."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import moe_grouped_gemm as mg
from kdtree_numba.kernels import moe_routing as mr
from kdtree_numba.kernels import swiglu

from ..helpers import poisoned

H = kd.backend.to_host


def offsets_of(counts):
    off = np.zeros(len(counts) + 1, np.int32)
    off[1:] = np.cumsum(counts)
    return off


def problem(counts, K, M, seed):
    rng = np.random.default_rng(seed)
    off = offsets_of(counts)
    xs = rng.standard_normal((int(off[-1]), K)).astype(np.float32)          # [N, K]
    W = rng.standard_normal((len(counts), M, K)).astype(np.float32)         # [E, M, K]
    return xs, W, off


def loop_ref(xs, W, off):
    """Row by row: the expert of row n is the e with off[e] <= n < off[e+1]; float64."""
    out = np.empty((xs.shape[0], W.shape[1]))
    for n in range(xs.shape[0]):
        e = int(np.searchsorted(off, n, side="right")) - 1
        out[n] = W[e].astype(np.float64) @ xs[n].astype(np.float64)
    return out


# simulator tiles: TM 4, TN 16, TK 16 (GPU: 16, 64, 32)
CASES = {
    "empty_experts_rows_off_tile": ([6, 0, 1, 2, 8], 37, 21),       # N 17, an expert over two row tiles
    "one_expert_has_every_row": ([0, 0, 20, 0], 20, 10),            # three row tiles of one expert, K 20
    "empty_ends_one_row_each": ([0, 1, 1, 0, 3, 0], 40, 24),        # K 40 = 2.5 steps, M 24 = 3 column tiles
    "kdim_past_one_gemv_step": ([2, 0, 1], 296, 16),                # v3: one unrolled step of 256 + a tail of 40
}


@pytest.mark.parametrize("variant", [1, 2, 3, 4])
@pytest.mark.parametrize("case", list(CASES))
def test_kernel_matches_reference(case, variant, kernel_backend):
    counts, K, M = CASES[case]
    xs, W, off = problem(counts, K, M, seed=len(case))
    out = poisoned((xs.shape[0], M))
    got = mg.grouped_linear(xs, W, off, out=out, variant=variant)
    assert got is out
    want = mg.grouped_linear_ref(xs, W, off)
    np.testing.assert_allclose(H(got), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_default_variant_is_the_gemv_for_decode_sized_rows_and_skinny_for_a_short_k():
    assert mg.default_variant(8, 384, 7168) == 3                            # Kimi decode: T 1 x top-8
    assert mg.default_variant(384 // mg.GEMV_ROWS_PER_EXPERT, 384, 7168) == 3
    assert mg.default_variant(384 // mg.GEMV_ROWS_PER_EXPERT + 1, 384, 7168) == 2
    assert mg.default_variant(2, 8, 256) == 4                               # the default pair's decode step
    assert mg.default_variant(2, 8, mg.SKINNY_MAX_K + 1) == 3               # ... with a long K: the GEMV
    assert mg.default_variant(130, 8, 256) == 4                             # the default pair's DDTree-64 verify
    assert mg.default_variant(130, 8, 192) == 4                             # ... its down projection
    assert mg.default_variant(130, 8, mg.SKINNY_MAX_K + 1) == 2             # long K: v2 (Kimi-like, measured)
    assert mg.default_variant(mg.SKINNY_MAX_ROWS + 1, 8, 256) == 2          # past the measured rows


def test_tile_table_matches_reference(kernel_backend):
    rng = np.random.default_rng(5)
    counts = rng.integers(0, 3 * mg.TM, 70)                             # three chunks of 32 experts
    counts[[0, 31, 32, 69]] = 0
    off = offsets_of(counts)
    tiles = H(mg.tile_table(off))
    np.testing.assert_array_equal(tiles, mg.tile_table_ref(off))
    assert tiles[-1] == sum(-(-c // mg.TM) for c in counts)
    assert tiles[-1] <= mg.row_tile_bound(int(off[-1]), counts.size)


def test_tiles_given_once_serve_two_gemms_and_no_rows_is_fine(kernel_backend):
    xs, W, off = problem([3, 0, 2], 9, 5, seed=1)
    tiles = mg.tile_table(off)
    np.testing.assert_allclose(H(mg.grouped_linear(xs, W, off, tiles=tiles)), mg.grouped_linear_ref(xs, W, off),
                               rtol=1e-5, atol=1e-5)
    empty = mg.grouped_linear(np.zeros((0, 9), np.float32), W, np.zeros(4, np.int32))
    assert H(empty).shape == (0, 5)


def test_reference_equals_a_row_by_row_loop():
    for seed, counts in enumerate([[5, 0, 17, 1, 0, 40], [0, 0, 0, 33], [1] * 9]):
        xs, W, off = problem(counts, 29, 13, seed)
        np.testing.assert_allclose(mg.grouped_linear_ref(xs, W, off), loop_ref(xs, W, off), rtol=1e-5, atol=1e-5)
        assert mg.tile_table_ref(off, 16)[-1] == sum(-(-c // 16) for c in counts)


def test_row_tile_bound_holds_for_every_split():
    rng = np.random.default_rng(3)
    for _ in range(200):
        E, N, tm = int(rng.integers(1, 40)), int(rng.integers(0, 300)), int(rng.integers(1, 20))
        counts = rng.multinomial(N, rng.dirichlet(np.full(E, 0.3)))
        assert mg.tile_table_ref(offsets_of(counts), tm)[-1] <= mg.row_tile_bound(N, E, tm)


def test_moe_reads_nothing_back_to_the_host(monkeypatch):
    """Target._moe: no to_host (on the GPU that was a stream sync per MoE layer), and the routed + shared experts
    it adds up equal a token-by-token NumPy MoE."""
    target = kd.tiny_target(2, hidden_size=32, n_routed_experts=6, n_group=2, topk_group=2, num_experts_per_tok=3)
    cfg = target.config
    L = next(L for L in target.layers if "gate" in L)
    h = np.random.default_rng(4).standard_normal((5, cfg.hidden_size)).astype(np.float32)

    def no_host_read(a):
        raise AssertionError("Target._moe read an array back to the host")
    with kd.backend.use(target.backend):
        hd = kd.backend.asarray(h)
        monkeypatch.setattr(kd.backend, "to_host", no_host_read)
        got = target._moe(L, hd)
        monkeypatch.undo()
        got = H(got)
    w = {key: H(v) for key, v in L.items()}
    silu = lambda g: g / (1 + np.exp(-g))                                   # noqa: E731
    idx, wts = mr.route_ref(h @ w["gate"].T, w["bias"], cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group,
                            cfg.norm_topk_prob, cfg.routed_scaling_factor)
    I = cfg.moe_intermediate_size
    want = np.zeros_like(h, dtype=np.float64)
    for t in range(h.shape[0]):
        for j, e in enumerate(idx[t]):
            gu = w["experts_gu"][e] @ h[t]
            want[t] += wts[t, j] * (w["experts_down"][e] @ (silu(gu[:I]) * gu[I:]))
        gu = w["shared_gu"] @ h[t]
        want[t] += w["shared_down"] @ (silu(gu[:gu.size // 2]) * gu[gu.size // 2:])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("call, msg", [
    (lambda: mg.grouped_linear(np.zeros((4, 3), np.float32), np.zeros((2, 5, 4), np.float32),
                               np.array([0, 2, 4], np.int32)), r"W: expected shape \(\*, \*, 3\)"),
    (lambda: mg.grouped_linear(np.zeros((4, 3), np.float32), np.zeros((2, 5, 3), np.float32),
                               np.array([0, 4], np.int32)), r"offsets: expected shape \(3\)"),
    (lambda: mg.grouped_linear(np.zeros((4, 3), np.float32), np.zeros((2, 5, 3), np.float32),
                               np.array([0, 2, 4], np.int64)), "offsets: expected dtype int32"),
    (lambda: mg.grouped_linear(np.zeros((4, 3), np.float64), np.zeros((2, 5, 3), np.float32),
                               np.array([0, 2, 4], np.int32)), "xs: expected dtype float32"),
    (lambda: mg.grouped_linear(np.zeros((4, 3), np.float32), np.zeros((2, 5, 3), np.float32),
                               np.array([0, 2, 4], np.int32), variant=5), "variant: expected 1, 2, 3, 4 or None"),
])
def test_bad_input(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


def test_offsets_that_do_not_cover_the_rows_are_refused(numpy_backend):
    with pytest.raises(ValueError, match="offsets: expected 0 = offsets"):
        mg.grouped_linear(np.zeros((4, 3), np.float32), np.zeros((2, 5, 3), np.float32),
                          np.array([0, 2, 3], np.int32))


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("variant", [1, 2, 3, 4])
@pytest.mark.parametrize("T", [1, 64, 300])
def test_kimi_like_decode_shape_on_the_gpu(T, variant):
    """E 384, top-8, hidden 1024, expert intermediate 512 (Kimi: 7168, 2048): gate/up then down, random routing."""
    E, k, Hd, I = 384, 8, 1024, 512
    rng = np.random.default_rng(T)
    idx, _ = mr.route(rng.standard_normal((T, E)).astype(np.float32), np.zeros(E, np.float32), k)
    counts, offsets, order, slot = mr.group_by_expert(idx, E)
    h = kd.backend.asarray(rng.standard_normal((T, Hd)).astype(np.float32))
    xs = kd.backend.xp.take(h, order // k, axis=0)                         # [T*k, H]
    w_gu = kd.backend.asarray((rng.standard_normal((E, 2 * I, Hd)) / np.sqrt(Hd)).astype(np.float32))
    w_down = kd.backend.asarray((rng.standard_normal((E, Hd, I)) / np.sqrt(I)).astype(np.float32))
    tiles = mg.tile_table(offsets)
    np.testing.assert_array_equal(H(tiles), mg.tile_table_ref(H(offsets)))
    gu = mg.grouped_linear(xs, w_gu, offsets, out=poisoned((T * k, 2 * I)), tiles=tiles, variant=variant)
    want = mg.grouped_linear_ref(H(xs), H(w_gu), H(offsets))
    np.testing.assert_allclose(H(gu), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
    act = swiglu.swiglu(gu)                                                # [T*k, I]
    ys = mg.grouped_linear(act, w_down, offsets, out=poisoned((T * k, Hd)), tiles=tiles, variant=variant)
    want = mg.grouped_linear_ref(H(act), H(w_down), H(offsets))
    np.testing.assert_allclose(H(ys), want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
