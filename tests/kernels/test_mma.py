"""The tensor-core primitive (kernels/mma.py): one warp's m16n8k8 product against NumPy, the fragment layout,
TF32 rounding, 3xTF32 accuracy, and the educational ``gemm.matmul_mma``. On the simulator the stand-in emulates
the instruction (TF32 inputs, fp32 results); the ``gpu`` tests run the real PTX."""
import numpy as np
import pytest
from numba import cuda, float32

import kdtree_numba as kd
from kdtree_numba.kernels import gemm, mma
from kdtree_numba.kernels.mma import SCRATCH_SHAPE

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host


@cuda.jit
def _product_kernel(a, b, c, d, three):
    """One warp: d = a @ b + c for a [16, K], b [K, 8] (K a multiple of 8), one MMA per k8 step, fragments loaded
    by the layout of mma.py's table (lane = 4 g + t)."""
    scratch = cuda.shared.array(SCRATCH_SHAPE, float32)
    lane = cuda.threadIdx.x % 32
    g = lane // 4
    t = lane % 4
    c0, c1, c2, c3 = c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]
    for k0 in range(0, a.shape[1], 8):
        a0, a1, a2, a3 = a[g, k0 + t], a[g + 8, k0 + t], a[g, k0 + t + 4], a[g + 8, k0 + t + 4]
        b0, b1 = b[k0 + t, g], b[k0 + t + 4, g]
        c0, c1, c2, c3 = mma.mma_fp32(a0, a1, a2, a3, b0, b1, c0, c1, c2, c3, three, scratch)
    d[g, 2 * t] = c0
    d[g, 2 * t + 1] = c1
    d[g + 8, 2 * t] = c2
    d[g + 8, 2 * t + 1] = c3


@cuda.jit
def _round_kernel(x, hi, lo, rounded):
    i = cuda.grid(1)
    if i < x.shape[0]:
        rounded[i] = mma.to_tf32(x[i])
        hi[i], lo[i] = mma.split_tf32(x[i])


@cuda.jit
def _fast_split_kernel(x, out):
    i = cuda.grid(1)
    if i < x.shape[0]:
        out[i, 0], out[i, 1] = mma.split_tf32_fast(x[i])


def product(a, b, c, three: bool):
    d = poisoned((16, 8))
    args = [kd.backend.asarray(x) for x in (a, b, c)]            # held until the result is read
    kd.backend.launch(_product_kernel, 1, 32, *args, d, three)
    return H(d)


def relative_error(got, a, b, c):
    """max |got - exact| / max (|c| + sum_k |a_ik b_kj|): the error relative to the size of the terms."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    exact = a64 @ b64 + c
    return np.abs(got - exact).max() / (np.abs(a64) @ np.abs(b64) + np.abs(c)).max()


@pytest.mark.parametrize("three", [False, True])
def test_fragment_layout_exact_on_small_integers(three):
    """Integers below 2^10 are exact in TF32 and their products and sums exact in fp32: any misplaced fragment
    element shows up as a wrong entry (A and B are distinct everywhere)."""
    a = (np.arange(16 * 16).reshape(16, 16) % 29 - 14).astype(np.float32)
    b = (np.arange(16 * 8).reshape(16, 8) * 7 % 31 - 15).astype(np.float32)
    c = np.arange(16 * 8).reshape(16, 8).astype(np.float32)
    np.testing.assert_array_equal(product(a, b, c, three), a @ b + c)


def test_identity_example():
    """The module docstring's example: A = eye(16)[:, :8], B = ones -> rows 0..7 of D are 1, rows 8..15 are 0."""
    d = product(np.eye(16, dtype=np.float32)[:, :8].copy(), np.ones((8, 8), np.float32),
                np.zeros((16, 8), np.float32), False)
    np.testing.assert_array_equal(d, np.vstack([np.ones((8, 8)), np.zeros((8, 8))]))


def test_tf32_rounding_and_split():
    one = 1.0
    x = np.array([one, one + 2 ** -11, one + 2 ** -12, -(one + 2 ** -11), one + 3 * 2 ** -12, 3.14159265, -2e-30,
                  0.0], np.float32)
    hi, lo, rounded = (kd.backend.full((x.size,), np.nan) for _ in range(3))
    kd.backend.launch(_round_kernel, 1, 32, kd.backend.asarray(x), hi, lo, rounded)
    r = H(rounded)
    np.testing.assert_array_equal(r[:5], [1.0, 1 + 2 ** -10, 1.0, -(1 + 2 ** -10), 1 + 2 ** -10])  # ties away
    assert (r.view(np.uint32) & 0x1FFF == 0).all()                     # 13 low mantissa bits cleared
    err = np.abs(H(hi).astype(np.float64) + H(lo) - x) / np.maximum(np.abs(x), 1e-38)
    assert err.max() <= 2.0 ** -21                                     # hi + lo = x up to ~u^2


def test_fast_split_truncates_and_is_exact():
    x = np.array([1 + 2.0 ** -12, -3.14159265, 1e-30, 7.0], np.float32)
    out = poisoned((4, 2))
    kd.backend.launch(_fast_split_kernel, 1, 4, kd.backend.asarray(x), out)
    hi, lo = H(out)[:, 0], H(out)[:, 1]
    np.testing.assert_array_equal(hi.view(np.uint32) & np.uint32(0x1FFF), 0)      # 13 low bits cleared
    np.testing.assert_array_equal(hi + lo, x)                                      # exact
    assert np.all(np.abs(lo) < np.abs(x) * 2.0 ** -10) and (hi[0], lo[0]) == (1.0, np.float32(2.0 ** -12))


def test_3xtf32_is_fp32_grade_and_tf32_is_not():
    """On the simulator the stand-in emulates the rounding (TF32 inputs, fp32 results): 3xTF32 ~ 1e-7 relative,
    one TF32 product ~ 1e-4..1e-3 (10 mantissa bits)."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 64)).astype(np.float32)
    b = rng.standard_normal((64, 8)).astype(np.float32)
    c = rng.standard_normal((16, 8)).astype(np.float32)
    assert relative_error(product(a, b, c, True), a, b, c) < 1e-6
    assert 1e-5 < relative_error(product(a, b, c, False), a, b, c) < 4e-3


@pytest.mark.parametrize("M,K,N", [(7, 69, 5), (33, 16, 17), (1, 2, 1)])
def test_matmul_mma_matches_reference(M, K, N):
    rng = np.random.default_rng(M * K + N)
    a = rng.standard_normal((M, K)).astype(np.float32)
    b = rng.standard_normal((K, N)).astype(np.float32)
    out = poisoned((M, N))
    gemm.matmul_mma(a, b, out=out)
    np.testing.assert_allclose(H(out), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(H(gemm.matmul_mma(np.array([[1, 2]], np.float32), np.array([[3], [4]], np.float32))),
                                  [[11]])


@pytest.mark.gpu
def test_gpu_real_mma_accuracy():
    """The real PTX (mma.sync ... tf32 in the compiled kernel): 3xTF32 within 1e-6 of float64 relative to the
    terms, plain TF32 at ~1e-3, for a 16 x 576 x 8 product (the attention's dot-product length)."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((16, 576)).astype(np.float32)
    b = rng.standard_normal((576, 8)).astype(np.float32)
    c = np.zeros((16, 8), np.float32)
    assert relative_error(product(a, b, c, True), a, b, c) < 1e-6
    assert 1e-5 < relative_error(product(a, b, c, False), a, b, c) < 4e-3
    asm = "".join(_product_kernel.inspect_asm().values())
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in asm and "cvt.rna.tf32.f32" in asm
    big_a = rng.standard_normal((300, 257)).astype(np.float32)
    big_b = rng.standard_normal((257, 190)).astype(np.float32)
    np.testing.assert_allclose(H(gemm.matmul_mma(big_a, big_b)), big_a.astype(np.float64) @ big_b, rtol=1e-4,
                               atol=1e-4)
