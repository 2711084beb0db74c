"""The cuda backend's GEMM path (kernels/_cublas.py): cuBLAS through ctypes, every operand layout the model
uses, equal to CuPy's own fp32 matmul, and capturable in a CUDA graph (which cupy.matmul is not)."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import _cublas, gemm

pytestmark = pytest.mark.gpu


def _rand(rng, *shape):
    return kd.backend.asarray(rng.standard_normal(shape).astype(np.float32))


@pytest.mark.parametrize("layout", ["nn", "nt", "tn", "tt", "row", "col", "k0", "strided"])
def test_gemm_layouts_match_cupy(layout):
    cp = kd.backend.cp
    rng = np.random.default_rng(0)
    M, K, N = 37, 70, 19
    if layout == "row":
        M = 1
    if layout == "col":
        N = 1
    if layout == "k0":
        K = 0
    a = _rand(rng, M, K) if layout[0] != "t" else _rand(rng, K, M).T
    b = _rand(rng, K, N) if layout[-1] != "t" or layout in ("row", "col") else _rand(rng, N, K).T
    if layout == "strided":
        a = _rand(rng, M, 2 * K)[:, ::2]                       # neither stride 1: copied first
    got = kd.backend.to_host(_cublas.gemm(a, b, kd.backend.empty((M, N), np.float32)))
    want = kd.backend.to_host(cp.matmul(a, b))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_batched_transposed_views_match_cupy():
    cp = kd.backend.cp
    rng = np.random.default_rng(1)
    q = _rand(rng, 5, 8, 24)                                    # [T, N, P]
    w = _rand(rng, 8, 24, 40)                                   # [N, P, Lkv]
    got = kd.backend.to_host(gemm.bmm(q.transpose(1, 0, 2), w))
    want = kd.backend.to_host(cp.matmul(q.transpose(1, 0, 2), w))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    wt = _rand(rng, 8, 40, 24).transpose(0, 2, 1)               # a transposed batch operand
    np.testing.assert_allclose(kd.backend.to_host(gemm.bmm(q.transpose(1, 0, 2), wt)),
                               kd.backend.to_host(cp.matmul(q.transpose(1, 0, 2), wt)), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("T", [1, 5])
def test_batched_writes_a_head_major_view_in_place(T):
    """out = a head-major view [N, T, Lkv] of a token-major [T, N, Lkv + R] buffer (the absorbed query): cuBLAS
    writes the product there with ldc = N (Lkv + R); the other columns keep their poison."""
    rng = np.random.default_rng(3)
    q = _rand(rng, T, 8, 24)                                    # [T, N, P]
    w = _rand(rng, 8, 24, 40)                                   # [N, P, Lkv]
    buf = kd.backend.full((T, 8, 46), np.nan, np.float32)       # [T, N, Lkv + 6]
    view = buf[:, :, :40].transpose(1, 0, 2)
    assert gemm.bmm(q.transpose(1, 0, 2), w, out=view) is view
    got = kd.backend.to_host(buf)
    want = kd.backend.to_host(kd.backend.cp.matmul(q.transpose(1, 0, 2), w)).transpose(1, 0, 2)
    np.testing.assert_allclose(got[:, :, :40], want, rtol=1e-5, atol=1e-5)
    assert np.isnan(got[:, :, 40:]).all()


@pytest.mark.parametrize("M,K", [(3, 256), (16, 256), (65, 256), (16, 2048)])   # small M and K: no workspace
def test_linear_is_captured_in_a_cuda_graph_and_replays_new_inputs(M, K):
    cp = kd.backend.cp
    rng = np.random.default_rng(2)
    x, w = _rand(rng, M, K), _rand(rng, 128, K)                 # (16, 256): the drafter's k projection
    out = kd.backend.empty((M, 128), np.float32)
    gemm.linear(x, w, out=out)                                  # direct once (handle, workspace)
    stream = kd.backend.stream
    stream.begin_capture()
    gemm.linear(x, w, out=out)
    graph = stream.end_capture()
    x[...] = _rand(rng, M, K)
    graph.launch(stream)
    np.testing.assert_array_equal(kd.backend.to_host(out), kd.backend.to_host(gemm.linear(x, w)))
    # against cuBLAS's own order of the K sums (65 rows run the skinny kernel, which adds two K halves): terms of
    # N(0, 1) x N(0, 1) make |out| up to ~40, so a cancelling element differs by ~1e-5 between two fp32 orders
    np.testing.assert_allclose(kd.backend.to_host(out), kd.backend.to_host(cp.matmul(x, w.T)), rtol=1e-5,
                               atol=1e-4)


def test_gemm_accumulate_is_beta_one():
    """accumulate=True: cuBLAS's beta = 1 adds the product onto out, equal to a GEMM then an add; a strided out is
    refused by name (the add is in place); rows with a stride are written in place."""
    rng = np.random.default_rng(4)
    x, w = _rand(rng, 16, 256), _rand(rng, 128, 256)
    out = _rand(rng, 16, 128)
    want = kd.backend.to_host(out) + kd.backend.to_host(gemm.linear(x, w))
    assert gemm.linear(x, w, out=out, accumulate=True) is out
    np.testing.assert_allclose(kd.backend.to_host(out), want, rtol=1e-5, atol=1e-5)
    wide = _rand(rng, 16, 200)                       # out with a row stride (cuBLAS's ldc = 200): in place
    want = kd.backend.to_host(wide).copy()
    want[:, :128] += kd.backend.to_host(gemm.linear(x, w))
    _cublas.gemm(x, w.T, wide[:, :128], accumulate=True)
    np.testing.assert_allclose(kd.backend.to_host(wide), want, rtol=1e-5, atol=1e-5)   # columns 128.. untouched
    with pytest.raises(ValueError, match="out: accumulate=True adds in place, expected contiguous rows"):
        _cublas.gemm(x, w.T, _rand(rng, 16, 256)[:, ::2], accumulate=True)


@pytest.mark.parametrize("M", [16, 17, 32, 33, 37, 40, 47, 65, 80, 81])
@pytest.mark.parametrize("layout", ["row-major", "transposed", "strided rows"])
@pytest.mark.parametrize("accumulate", [False, True])
def test_row_blocks_match_one_call(monkeypatch, M, layout, accumulate):
    """17-80 rows run as a strided batch of <= 16-row blocks and give the one-call product (ROW_BLOCKS = 0), for
    every layout of a and with accumulate. Rows equal blocks cannot share take overlapping blocks (17 = 9 at rows 0
    and 8, 37 = 13 at rows 0, 12, 24, 47 = 4 x 14 at stride 11) or, with accumulate, disjoint blocks and one call
    for the rows left (37 = 2 x 13 + 11); 16 and 81 rows take the one call either way."""
    rng = np.random.default_rng(M)
    K, N = 96, 200
    if layout == "row-major":
        a = _rand(rng, M, K)
    elif layout == "transposed":
        a = _rand(rng, K, M).T                                  # rows one element apart: op T
    else:
        a = _rand(rng, M, K + 32)[:, :K]                        # lda = K + 32
    w = _rand(rng, N, K)
    base = _rand(rng, M, N)
    got = kd.backend.to_host(_cublas.gemm(a, w.T, base.copy(), accumulate))
    monkeypatch.setattr(_cublas, "ROW_BLOCKS", 0)
    want = kd.backend.to_host(_cublas.gemm(a, w.T, base.copy(), accumulate))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("K, N", [(256, 1536), (256, 4096), (96, 200)])
@pytest.mark.parametrize("m", [9, 13])
@pytest.mark.parametrize("layout", ["row-major", "transposed"])
def test_a_row_block_row_does_not_depend_on_its_place(K, N, m, layout):
    """What overlapping row blocks rely on: a row's product has the same bits at every place in its block (two
    blocks write an overlapped row; both must write the same value). Every row at every place: the same rows
    shifted by j = 0 .. m - 1 through disjoint blocks of m rows. (768 such cases, shapes of 64-7168 x 100-4096,
    found no exception on an H100: docs/PERFORMANCE.md, fortieth session.)"""
    cp = kd.backend.cp
    rng = np.random.default_rng(m)
    nb = 3
    rows = nb * m + m
    x = _rand(rng, rows, K) if layout == "row-major" else _rand(rng, K, rows).T
    w = _rand(rng, N, K)
    outs = []
    for j in range(m):
        o = cp.empty((nb * m, N), np.float32)
        _cublas._strided_blocks(x[j:j + nb * m], w.T, o, False, nb, m, m)
        outs.append(kd.backend.to_host(o))
    for j in range(1, m):
        np.testing.assert_array_equal(outs[j][:nb * m - j], outs[0][j:], err_msg=f"shift {j}")


@pytest.mark.parametrize("M, blocks", [(16, False), (17, True), (32, True), (80, True), (81, False)])
def test_row_blocks_take_17_to_80_rows(monkeypatch, M, blocks):
    """The rows that take the blocks: 17 .. 80 (at 17-32 rows cuBLAS's own pick for a K = 768 product was a 27 us
    kernel of 8 blocks where two 16-row blocks take ~7 us: docs/PERFORMANCE.md, thirty-second session)."""
    rng = np.random.default_rng(M)
    a, w = _rand(rng, M, 64), _rand(rng, 100, 64)
    calls = []
    monkeypatch.setattr(_cublas, "_row_blocks", lambda *args: calls.append(1))
    _cublas.gemm(a, w.T, kd.backend.empty((M, 100), np.float32))
    assert calls == ([1] if blocks else [])


def test_row_blocks_only_for_weights_l2_holds(monkeypatch):
    """A weight of more than ROW_BLOCKS_WEIGHT floats is read once, in one call (every block would read it again)."""
    rng = np.random.default_rng(4)
    a, w = _rand(rng, 33, 64), _rand(rng, 100, 64)
    calls = []
    monkeypatch.setattr(_cublas, "_row_blocks", lambda *args: calls.append(1))
    monkeypatch.setattr(_cublas, "ROW_BLOCKS_WEIGHT", 64 * 100 - 1)
    _cublas.gemm(a, w.T, kd.backend.empty((33, 100), np.float32))
    assert calls == []
    monkeypatch.setattr(_cublas, "ROW_BLOCKS_WEIGHT", 64 * 100)
    _cublas.gemm(a, w.T, kd.backend.empty((33, 100), np.float32))
    assert calls == [1]


def test_concurrent_streams_get_workspaces_of_their_own():
    """A GEMM that uses cuBLAS's workspace (a long K: split-K) on a ``backend.branch`` side stream, while the main
    stream runs another: each stream has its own workspace (one shared buffer would let the two GEMMs' split-K
    partials overwrite each other), and both products are right."""
    rng = np.random.default_rng(5)
    a, b = _rand(rng, 8, 4096), _rand(rng, 8, 4096)
    w = _rand(rng, 256, 4096)
    want_a, want_b = (kd.backend.to_host(x) @ kd.backend.to_host(w).T for x in (a, b))
    main = kd.backend.stream.ptr
    with kd.backend.branch() as side:
        side_ptr = kd.backend.stream.ptr
        out_b = gemm.linear(b, w)
    out_a = gemm.linear(a, w)
    side.join()
    ws = _cublas._state["workspaces"]
    assert side_ptr != main and ws[side_ptr].ptr != ws[main].ptr
    np.testing.assert_allclose(kd.backend.to_host(out_a), want_a, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(kd.backend.to_host(out_b), want_b, rtol=1e-4, atol=1e-3)
