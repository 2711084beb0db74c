"""The tensor-core skinny GEMM (kernels/mma_gemm.py) against the NumPy product: m-tiles past M, a block's columns
past N, K not a multiple of a chunk or of the warps' slices, accumulate, strided rows, the docstring example, the
layout rule, bad arguments; small shapes, so the simulator runs them. On the GPU, the verify's products against
cuBLAS, and the same bits twice."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import _cublas, mma_gemm as mg


def _run(x, w, out=None, accumulate=False):
    xp = kd.backend
    out_d = xp.asarray(out) if out is not None else xp.empty((x.shape[0], w.shape[0]), np.float32)
    return xp.to_host(mg.mma_linear(xp.asarray(x), xp.asarray(w), out_d, accumulate))


@pytest.mark.parametrize("M,K,N", [(33, 64, 11), (16, 20, 8), (1, 4, 3), (5, 36, 17)])
def test_ragged_shapes_match_numpy(kernel_backend, M, K, N):
    """33 rows: three m-tiles, the last with one row; 16: one full tile. K = 20: a chunk and a quarter (lanes past K
    read zeros); 36 with K = 64's two warps (simulator: one warp a chunk). N = 11, 17: a block's columns past N."""
    rng = np.random.default_rng(M + K)
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    np.testing.assert_allclose(_run(x, w), x @ w.T, rtol=1e-5, atol=1e-5)


def test_warps_split_k(kernel_backend):
    """K = 96 in chunks of 16 over three warps of two chunks each, the warps' sums added in order; 17 rows: two
    m-tile blocks, the second with one row."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((17, 96)).astype(np.float32)
    w = rng.standard_normal((8, 96)).astype(np.float32)
    out = kd.backend.empty((17, 8), np.float32)
    got = kd.backend.to_host(mg.run(kd.backend.asarray(x), kd.backend.asarray(w), out, warps=(3, 2)))
    np.testing.assert_allclose(got, x @ w.T, rtol=1e-5, atol=1e-5)


def test_split_aims_at_the_warp_target(monkeypatch):
    monkeypatch.setattr(mg, "MAX_KW", 16)
    monkeypatch.setattr(mg, "WARPS_TARGET", 512)
    assert mg.split(33, 256, 240) == (6, 3)          # 90 tiles: ~6 warps each; 16 chunks as 6 x 3 -> 6 warps
    assert mg.split(16, 256, 240) == (16, 1)         # 30 tiles: one chunk a warp
    assert mg.split(33, 256, 4096) == (1, 16)        # 1536 tiles: one warp each
    assert mg.split(16, 4, 8) == (1, 1)


def test_accumulate_adds_onto_out(kernel_backend):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 8)).astype(np.float32)
    w = rng.standard_normal((5, 8)).astype(np.float32)
    base = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(x, w, base.copy(), True), base + x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(x, w, base.copy(), False), x @ w.T, rtol=1e-5, atol=1e-5)


def test_strided_rows(kernel_backend):
    rng = np.random.default_rng(3)
    xx = rng.standard_normal((2, 32)).astype(np.float32)
    w = rng.standard_normal((3, 8)).astype(np.float32)
    x = kd.backend.asarray(xx)[:, 4:12]                  # rows 32 floats apart, 16-byte aligned, k contiguous
    got = kd.backend.to_host(mg.mma_linear(x, kd.backend.asarray(w), kd.backend.empty((2, 3), np.float32)))
    np.testing.assert_allclose(got, xx[:, 4:12] @ w.T, rtol=1e-5, atol=1e-5)


def test_docstring_example(kernel_backend):
    w = np.array([[1, 0, 0, 0], [0, 0, 0, 2]], np.float32)
    assert _run(np.array([[1, 2, 3, 4]], np.float32), w).tolist() == [[1, 8]]


def test_reads_names_the_layout_it_loads():
    x = np.zeros((33, 256), np.float32)
    w = np.zeros((4096, 256), np.float32)
    out = np.zeros((33, 4096), np.float32)
    assert mg.reads(x, w.T, out)
    assert not mg.reads(np.zeros((81, 256), np.float32), w.T, np.zeros((81, 4096), np.float32))   # > MAX_ROWS
    assert not mg.reads(x, np.ascontiguousarray(w.T), out)             # b row-major [k, n]: k is not contiguous
    assert not mg.reads(x[:, :254], w[:, :254].T, out)                   # K not a multiple of 4
    assert not mg.reads(np.zeros((33, 258), np.float32)[:, :256], w.T, out)   # rows 258 floats apart: unaligned


def test_too_many_rows_and_bad_layouts_are_named(kernel_backend):
    with pytest.raises(ValueError, match="x: expected at most 80 rows"):
        mg.mma_linear(np.ones((81, 4), np.float32), np.ones((2, 4), np.float32))
    if kd.backend.name != "numpy":
        with pytest.raises(ValueError, match="K a multiple of 4"):
            mg.mma_linear(kd.backend.asarray(np.ones((3, 6), np.float32)), kd.backend.asarray(np.ones((2, 6),
                                                                                                       np.float32)))


def test_empty_k_writes_zeros(numpy_backend):
    out = mg.mma_linear(np.ones((2, 0), np.float32), np.ones((3, 0), np.float32), np.ones((2, 3), np.float32))
    assert not out.any()


def _bf16(a):
    """a rounded to bf16 (to nearest even), kept as float32: exact in TF32."""
    b = a.view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["fp32", "bf16", "mixed"])
@pytest.mark.parametrize("M,K,N,accumulate", [(33, 256, 4096, False), (33, 256, 1536, False), (16, 256, 240, False),
                                              (33, 768, 256, True), (65, 128, 384, False), (80, 192, 256, True)])
def test_matches_cublas_at_the_model_shapes(M, K, N, accumulate, weights):
    """The verify's and the draft's products at 16, 33, 65 and 80 rows: cuBLAS's product to rounding, and the same
    bits on a second run (a fixed order of the warps' sums). Weights exact in TF32 (bf16) take the two-MMA step;
    "mixed" has one fp32 column in a bf16 weight, so one block's warps run the three MMAs and the others two."""
    rng = np.random.default_rng(M + N)
    x = kd.backend.asarray(rng.standard_normal((M, K)).astype(np.float32))
    wh = rng.standard_normal((N, K)).astype(np.float32)
    if weights != "fp32":
        col = wh[3].copy()
        wh = _bf16(wh)
        if weights == "mixed":
            wh[3] = col
    w = kd.backend.asarray(wh)
    base = kd.backend.asarray(rng.standard_normal((M, N)).astype(np.float32))
    want = kd.backend.to_host(_cublas.gemm(x, w.T, base.copy(), accumulate=accumulate))
    got = kd.backend.to_host(mg.mma_linear(x, w, base.copy(), accumulate))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=2e-5 * np.sqrt(K))
    assert np.array_equal(got, kd.backend.to_host(mg.mma_linear(x, w, base.copy(), accumulate)))
