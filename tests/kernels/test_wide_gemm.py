"""The wide GEMM (kernels/wide_gemm.py) against the NumPy product: ragged shapes (rows past a panel, columns past a
tile, K not a multiple of the U-step or of the warps' slices), accumulate, strided rows, the docstring example, bad
arguments; small shapes, so the simulator runs them. On the GPU, the verify's widest products against cuBLAS."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import _cublas, skinny_gemm as sg, wide_gemm as wg


def _run(x, w, out=None, accumulate=False):
    xp = kd.backend
    out_d = xp.asarray(out) if out is not None else xp.empty((x.shape[0], w.shape[0]), np.float32)
    return xp.to_host(wg.wide_linear(xp.asarray(x), xp.asarray(w), out_d, accumulate))


@pytest.mark.parametrize("M,K", [(wg.PANEL + 2, 3), (wg.PANEL + 2, 13), (wg.PANEL + 2, 21), (wg.PANEL + 2, 24),
                                 (9, 24)])
def test_ragged_shapes_match_numpy(kernel_backend, M, K):
    """K: one warp's slice; both ragged; a U step past K; 16-byte copies. M: a second row panel, ragged; less than
    one. N: a second column tile, ragged."""
    rng = np.random.default_rng(K)
    N = wg.NT + 3
    x = rng.standard_normal((M, K)).astype(np.float32)
    w = rng.standard_normal((N, K)).astype(np.float32)
    np.testing.assert_allclose(_run(x, w), x @ w.T, rtol=1e-5, atol=1e-5)


def test_k_in_chunks(kernel_backend):
    """K past one staged chunk (KC): two chunks and a ragged third, 16-byte copies and one-float ones."""
    rng = np.random.default_rng(5)
    for K in (2 * wg.KC + 8, wg.KC + 3):
        x = rng.standard_normal((3, K)).astype(np.float32)
        w = rng.standard_normal((5, K)).astype(np.float32)
        np.testing.assert_allclose(_run(x, w), x @ w.T, rtol=1e-5, atol=1e-4)


def test_accumulate_adds_onto_out(kernel_backend):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((3, 10)).astype(np.float32)
    w = rng.standard_normal((5, 10)).astype(np.float32)
    base = rng.standard_normal((3, 5)).astype(np.float32)
    np.testing.assert_allclose(_run(x, w, base.copy(), True), base + x @ w.T, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(_run(x, w, base.copy(), False), x @ w.T, rtol=1e-5, atol=1e-5)


def test_strided_rows(kernel_backend):
    rng = np.random.default_rng(3)
    xx = rng.standard_normal((2, 30)).astype(np.float32)
    w = rng.standard_normal((3, 9)).astype(np.float32)
    x = kd.backend.asarray(xx)[:, 1:10]                  # rows 30 apart, k contiguous
    got = kd.backend.to_host(wg.wide_linear(x, kd.backend.asarray(w), kd.backend.empty((2, 3), np.float32)))
    np.testing.assert_allclose(got, xx[:, 1:10] @ w.T, rtol=1e-5, atol=1e-5)


def test_docstring_example(kernel_backend):
    assert _run(np.array([[1, 2]], np.float32), np.array([[3, 4], [5, 6]], np.float32)).tolist() == [[11, 17]]


def test_reads_takes_a_transposed_weight_only():
    x = np.zeros((33, 256), np.float32)
    w = np.zeros((4096, 256), np.float32)
    out = np.zeros((33, 4096), np.float32)
    assert wg.reads(x, w.T, out)
    assert wg.reads(np.zeros((33, 768), np.float32), np.zeros((256, 768), np.float32).T, out[:, :256])   # any K
    assert not wg.reads(x, np.ascontiguousarray(w.T), out)             # b row-major [k, n]: k is not contiguous
    assert not wg.reads(x[:, ::2], w[:, ::2].T, out)                      # x strided along k


def test_not_offered_where_a_block_cannot_have_its_shared_memory(monkeypatch):
    """gemm_choice asks ``reads``: on a GPU whose blocks opt into less than SHARED_BYTES (sm_75: 64 KB) the kernel is
    no candidate, instead of a launch that the device refuses."""
    x, w, out = np.zeros((33, 256), np.float32), np.zeros((4096, 256), np.float32), np.zeros((33, 4096), np.float32)
    monkeypatch.setattr(kd.backend, "shared_optin", lambda: 64 * 1024)
    assert not wg.reads(x, w.T, out)
    monkeypatch.setattr(kd.backend, "shared_optin", lambda: wg.SHARED_BYTES)
    assert wg.reads(x, w.T, out)


@pytest.mark.gpu
@pytest.mark.parametrize("M,K,N", [(33, 256, 4096), (33, 256, 1536), (16, 256, 4096), (65, 768, 256)])
def test_matches_cublas_at_the_verify_shapes(M, K, N):
    """The LM head and the dense gate/up at the DDTree-32 verify's 33 rows and the chain's 16, the dense down (K
    = 768) at 65: cuBLAS's product to rounding, and the same bits on a second run (a fixed order of the slices)."""
    rng = np.random.default_rng(M + N)
    x = kd.backend.asarray(rng.standard_normal((M, K)).astype(np.float32))
    w = kd.backend.asarray(rng.standard_normal((N, K)).astype(np.float32))
    base = kd.backend.asarray(rng.standard_normal((M, N)).astype(np.float32))
    want = _cublas.gemm(x, w.T, base.copy(), accumulate=True)
    got = kd.backend.to_host(wg.wide_linear(x, w, base.copy(), True))
    np.testing.assert_allclose(got, kd.backend.to_host(want), rtol=1e-5, atol=1e-4)
    again = kd.backend.to_host(wg.wide_linear(x, w, base.copy(), True))
    assert np.array_equal(got, again)


@pytest.mark.parametrize("fn", [sg.skinny_linear, wg.wide_linear], ids=["skinny", "wide"])
@pytest.mark.parametrize("args, kwargs, message", [
    (((3, 4), (2, 5)), {}, r"w: expected shape \(\*, 4\)"),
    (((3, 4), (2, 4)), {"x_dtype": np.float64}, "x: expected dtype float32"),
    (((4,), (2, 4)), {}, "x: expected 2 dimensions"),
    (((3, 4), (2, 4)), {"out": (3, 3)}, r"out: expected shape \(3, 2\)"),
    (((3, 4), (2, 4)), {"accumulate": True}, "out: accumulate=True adds onto out"),
])
def test_bad_arguments_name_themselves(fn, args, kwargs, message, numpy_backend):
    """Both few-row GEMM launchers (skinny_gemm, wide_gemm) check their operands the same way (_checks)."""
    x = np.ones(args[0], kwargs.get("x_dtype", np.float32))
    out = np.ones(kwargs["out"], np.float32) if "out" in kwargs else None
    with pytest.raises(ValueError, match=message):
        fn(x, np.ones(args[1], np.float32), out, kwargs.get("accumulate", False))
