"""The skinny GEMM (kernels/skinny_gemm.py) against the NumPy product: ragged shapes (rows and columns that do not
fill a warp's 8 x 4 patch, K not a multiple of the 128-wide unrolled step), accumulate, strided rows, the docstring
example, the rule gemm.linear asks; small shapes, so the simulator runs them. On the GPU, gemm.linear at shapes
where it pays against cuBLAS."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import _cublas, gemm, skinny_gemm as sg


def _run(x, w, out=None, accumulate=False):
    xp = kd.backend
    out_d = xp.asarray(out) if out is not None else xp.empty((x.shape[0], w.shape[0]), np.float32)
    return xp.to_host(sg.skinny_linear(xp.asarray(x), xp.asarray(w), out_d, accumulate))


@pytest.mark.parametrize("k_warps", [1, 2])
@pytest.mark.parametrize("K", [20, 37, 130])            # K slices of 32: [0, 20) + an empty one; 32 + 5; 96 + 34
def test_ragged_shapes_match_numpy(kernel_backend, monkeypatch, k_warps, K):
    monkeypatch.setattr(sg, "K_WARPS", k_warps)
    rng = np.random.default_rng(K)
    M, N = sg.RW + 1, sg.CW + 1                          # a second row block and a second column group, both ragged
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    np.testing.assert_allclose(_run(x, w), x @ w.T, rtol=1e-5, atol=1e-5)


def test_k_warps_must_divide_the_block(kernel_backend, monkeypatch):
    monkeypatch.setattr(sg, "K_WARPS", sg.WARPS + 1)
    with pytest.raises(ValueError, match=f"K_WARPS: {sg.WARPS + 1} does not divide"):
        _run(np.ones((2, 4), np.float32), np.ones((3, 4), np.float32))


def test_accumulate_adds_onto_out(kernel_backend):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 40)).astype(np.float32)
    w = rng.standard_normal((5, 40)).astype(np.float32)
    base = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(x, w, out=base.copy(), accumulate=True), base + x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(x, w, out=base.copy()), x @ w.T, rtol=1e-5, atol=1e-5)


def test_strided_rows(kernel_backend):
    rng = np.random.default_rng(3)
    xx = rng.standard_normal((2, 70)).astype(np.float32)
    w = rng.standard_normal((3, 33)).astype(np.float32)
    x = kd.backend.asarray(xx)[:, 1:34]                  # rows 70 apart, k contiguous (a column slice, as q_a's)
    got = kd.backend.to_host(sg.skinny_linear(x, kd.backend.asarray(w), kd.backend.empty((2, 3), np.float32)))
    np.testing.assert_allclose(got, xx[:, 1:34] @ w.T, rtol=1e-5, atol=1e-5)


def test_docstring_example(kernel_backend):
    assert _run(np.array([[1, 2]], np.float32), np.array([[3, 4], [5, 6]], np.float32)).tolist() == [[11, 17]]


def test_rule_takes_the_verify_not_the_draft_or_a_step():
    assert sg.pays(65, 256, 384) and sg.pays(17, 128, 384) and sg.pays(128, 256, 256)
    assert not sg.pays(1, 256, 384)                      # a decode step: cuBLAS's GEMV
    assert not sg.pays(16, 256, 384)                     # the draft and the chain's verify
    assert not sg.pays(65, 768, 256)                     # K too long
    assert not sg.pays(65, 256, 1536) and not sg.pays(65, 256, 4096)   # too many outputs


def test_reads_takes_a_transposed_weight_only():
    """The layout test both gemm.linear and gemm_choice use: w [n, k] row-major seen as b = w.T, K <= MAX_K."""
    x = np.zeros((33, 256), np.float32)
    w = np.zeros((384, 256), np.float32)
    out = np.zeros((33, 384), np.float32)
    assert sg.reads(x, w.T, out)
    assert not sg.reads(x, np.ascontiguousarray(w.T), out)             # b row-major [k, n]: k is not contiguous
    assert not sg.reads(x[:, ::2], w[:, ::2].T, out)                      # x strided along k
    big = np.zeros((33, sg.MAX_K + 1), np.float32)
    assert not sg.reads(big, np.zeros((384, sg.MAX_K + 1), np.float32).T, out)


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,N", [(65, 256, 240), (33, 128, 384), (17, 192, 256), (128, 256, 256)])
def test_linear_matches_cublas_where_the_kernel_pays(M, K, N):
    """At 17-80 rows gemm.linear runs what kernels/gemm_choice.py timed fastest (this kernel is its default where
    ``pays``); at 128 rows this kernel. Either way the product is cuBLAS's to rounding."""
    assert sg.pays(M, K, N)
    rng = np.random.default_rng(M)
    x = kd.backend.asarray(rng.standard_normal((M, K)).astype(np.float32))
    w = kd.backend.asarray(rng.standard_normal((N, K)).astype(np.float32))
    base = kd.backend.asarray(rng.standard_normal((M, N)).astype(np.float32))
    want = _cublas.gemm(x, w.T, base.copy(), accumulate=True)
    got = gemm.linear(x, w, out=base.copy(), accumulate=True)
    np.testing.assert_allclose(kd.backend.to_host(got), kd.backend.to_host(want), rtol=1e-5, atol=1e-4)
