"""RMSNorm, RoPE, SwiGLU, embedding and the tiled GEMM: kernel (sim/cuda) vs NumPy reference at irregular shapes."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import embedding, gemm, rmsnorm, rope, swiglu

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host


def test_rmsnorm_matches_reference(rng=np.random.default_rng(1)):
    x = rng.standard_normal((7, 69)).astype(np.float32)
    w = rng.standard_normal(69).astype(np.float32)
    out = poisoned((7, 69))
    rmsnorm.rmsnorm(x, w, 1e-6, out=out)
    np.testing.assert_allclose(H(out), rmsnorm.rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_rmsnorm_row_wider_than_the_shared_copy(rng=np.random.default_rng(11)):
    x = rng.standard_normal((1, rmsnorm.STAGE + 5)).astype(np.float32)     # last 5 columns re-read from memory
    w = rng.standard_normal(x.shape[1]).astype(np.float32)
    out = rmsnorm.rmsnorm(x, w, 1e-6, out=poisoned(x.shape))
    np.testing.assert_allclose(H(out), rmsnorm.rmsnorm_ref(x, w, 1e-6), rtol=1e-5, atol=1e-6)


def test_rmsnorm_docstring_example_and_scale_invariance():
    np.testing.assert_allclose(H(rmsnorm.rmsnorm(np.array([[3, 4]], np.float32), np.ones(2, np.float32), 0.0)),
                               [[0.8485281, 1.1313709]], rtol=1e-6)
    x = np.random.default_rng(2).standard_normal((3, 37)).astype(np.float32)
    w = np.ones(37, np.float32)
    a = H(rmsnorm.rmsnorm(x, w, 0.0))
    b = H(rmsnorm.rmsnorm(x * np.float32(16.0), w, 0.0))
    np.testing.assert_allclose(a, b, rtol=1e-5)


def test_rope_matches_reference_with_shared_positions():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 3, 10)).astype(np.float32)
    pos = np.array([5, 6, 6, 6, 7, 400], np.int32)          # tree nodes share positions
    inv, amp = rope.yarn_inv_freq(10, 10000.0, 4.0, 64), 1.07
    out = poisoned(x.shape)
    rope.apply_rope(x, pos, inv, amp, out=out)
    np.testing.assert_allclose(H(out), rope.rope_ref(x, pos, inv, amp), rtol=1e-5, atol=1e-5)
    y = np.repeat(x[:1], 3, axis=0)                          # identical rows at one shared position
    rot = H(rope.apply_rope(y, np.array([9, 9, 9], np.int32), inv, amp))
    np.testing.assert_array_equal(rot[0], rot[2])


def test_rope_in_place():
    rng = np.random.default_rng(4)
    x = rng.standard_normal((5, 2, 8)).astype(np.float32)
    pos = np.arange(5, dtype=np.int64) * 3
    inv = rope.rope_inv_freq(8, 10000.0)
    want = rope.rope_ref(x, pos, inv)
    buf = kd.backend.asarray(x.copy())
    rope.apply_rope(buf, pos, inv, out=buf)
    np.testing.assert_allclose(H(buf), want, rtol=1e-5, atol=1e-6)


def test_swiglu_matches_reference():
    gu = (np.random.default_rng(5).standard_normal((7, 2 * 23)) * 4).astype(np.float32)
    out = poisoned((7, 23))
    swiglu.swiglu(gu, out=out)
    np.testing.assert_allclose(H(out), swiglu.swiglu_ref(gu), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(H(swiglu.swiglu(np.array([[0, 1, 2, 3]], np.float32))), [[0, 2.1931758]], rtol=1e-6)


def test_swiglu_norm_rows_apply_a_folded_post_norm():
    """swiglu(x @ (W diag w)^T, norm_rows=(x, eps)) == swiglu(rmsnorm(x, w) @ W^T): a post-attention RMSNorm folded
    into the gate/up weights (rmsnorm.folded_norm), its row scale applied by the kernel; the docstring's example."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal((5, 24)) * 3).astype(np.float32)                       # [T, H]
    w = (1 + 0.3 * rng.standard_normal(24)).astype(np.float32)                      # [H]
    W = rng.standard_normal((2 * 19, 24)).astype(np.float32)                        # [2I, H]
    want = swiglu.swiglu_ref(rmsnorm.rmsnorm_ref(x, w, 1e-6) @ W.T)
    out = poisoned((5, 19))
    swiglu.swiglu(x @ rmsnorm.folded_norm(W, w).T, out=out, norm_rows=(x, 1e-6))
    np.testing.assert_allclose(H(out), want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
    got = swiglu.swiglu(np.array([[0, 1, 2, 3]], np.float32), norm_rows=(np.array([[2, 2]], np.float32), 0.0))
    np.testing.assert_allclose(H(got), [[0, 0.4668445]], rtol=1e-6)
    with pytest.raises(ValueError, match=r"^norm_rows\[0\]: expected shape \(5, \*\)"):
        swiglu.swiglu(x @ W.T, norm_rows=(x[:4], 1e-6))
    with pytest.raises(ValueError, match="^norm_rows: expected None or a pair"):
        swiglu.swiglu(x @ W.T, norm_rows=x)


def test_embedding_gathers_rows_and_rejects_bad_ids():
    table = np.random.default_rng(6).standard_normal((11, 13)).astype(np.float32)
    ids = np.array([3, 0, 10, 3], np.int32)
    out = poisoned((4, 13))
    embedding.embed(table, ids, out=out)
    np.testing.assert_array_equal(H(out), table[ids])
    with pytest.raises(ValueError, match=r"ids: token id 11 at index 1"):
        embedding.embed(table, np.array([0, 11], np.int32))
    with pytest.raises(ValueError, match="token id -1"):
        embedding.embed(table, np.array([-1], np.int64))


def test_tiled_gemm_matches_numpy():
    rng = np.random.default_rng(7)
    a = rng.standard_normal((7, 37)).astype(np.float32)
    b = rng.standard_normal((37, 19)).astype(np.float32)
    out = poisoned((7, 19))
    gemm.matmul_tiled(a, b, out=out)
    np.testing.assert_allclose(H(out), a.astype(np.float64) @ b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(H(gemm.linear(a, b.T.copy())), a @ b, rtol=1e-5, atol=1e-5)


def test_linear_accumulate_adds_onto_out():
    """linear(..., out=x, accumulate=True) is x += x_in @ w.T (the model's residual adds ride on it); K = 0 adds
    nothing; without an out array it is refused by name."""
    rng = np.random.default_rng(8)
    a = rng.standard_normal((5, 12)).astype(np.float32)
    w = rng.standard_normal((9, 12)).astype(np.float32)
    base = rng.standard_normal((5, 9)).astype(np.float32)
    out = kd.backend.asarray(base.copy())
    assert gemm.linear(a, w, out=out, accumulate=True) is out
    np.testing.assert_allclose(H(out), base + a @ w.T, rtol=1e-5, atol=1e-5)
    gemm.linear(np.zeros((5, 0), np.float32), np.zeros((9, 0), np.float32), out=out, accumulate=True)
    np.testing.assert_allclose(H(out), base + a @ w.T, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="out: accumulate=True adds onto out, expected an array, got None"):
        gemm.linear(a, w, accumulate=True)
    with pytest.raises(ValueError, match="out: expected a C-contiguous array"):
        gemm.linear(a, w, out=kd.backend.asarray(np.zeros((5, 18), np.float32))[:, :9], accumulate=True)


@pytest.mark.parametrize("call, arg", [
    (lambda: rmsnorm.rmsnorm(np.zeros((3, 4), np.float64), np.ones(4, np.float32), 1e-6), "x: expected dtype float32"),
    (lambda: rmsnorm.rmsnorm(np.zeros((3, 4), np.float32), np.ones(5, np.float32), 1e-6), r"w: expected shape \(4\)"),
    (lambda: rmsnorm.rmsnorm(np.zeros((3, 4, 2), np.float32), np.ones(4, np.float32), 1e-6), "x: expected 2 dim"),
    (lambda: rmsnorm.rmsnorm(np.zeros((3, 4), np.float32), np.ones(4, np.float32), -1.0), "eps: expected"),
    (lambda: rope.apply_rope(np.zeros((2, 1, 5), np.float32), np.zeros(2, np.int32), np.ones(2, np.float32)),
     "even rope dim"),
    (lambda: rope.apply_rope(np.zeros((2, 1, 4), np.float32), np.zeros(2, np.float32), np.ones(2, np.float32)),
     "positions: expected an integer dtype"),
    (lambda: swiglu.swiglu(np.zeros((2, 5), np.float32)), "gu: expected an even number"),
    (lambda: gemm.matmul_tiled(np.zeros((2, 3), np.float32), np.zeros((4, 2), np.float32)), r"b: expected shape \(3, \*\)"),
    (lambda: rmsnorm.rmsnorm(np.zeros((3, 4), np.float32), np.ones(4, np.float32), 1e-6,
                             out=kd.backend.empty((3, 5), np.float32)),
     r"out: expected shape \(3, 4\)"),
])
def test_bad_input_names_the_argument(call, arg):
    with pytest.raises(ValueError, match=arg):
        call()


def test_rope_permutation_neox_on_permuted_equals_gptj_on_raw():
    rng = np.random.default_rng(8)
    R, heads = 12, 3
    x = rng.standard_normal((4, heads, R)).astype(np.float32)
    pos = np.array([0, 1, 9, 33], np.int32)
    inv = rope.rope_inv_freq(R, 50000.0)
    order = rope.neox_order(R)
    neox = rope.rope_ref(np.ascontiguousarray(x[..., order]), pos, inv)
    gptj = rope.rope_gptj_ref(x, pos, inv)[..., order]
    np.testing.assert_allclose(neox, gptj, rtol=1e-6, atol=1e-6)
    # the weight-row form used at load: permuting W's rope rows permutes the projection's outputs
    W = rng.standard_normal((2 * R + 5, 7)).astype(np.float32)
    Wp = rope.permute_rope_rows(W, [5, 5 + R], R)
    v = rng.standard_normal(7).astype(np.float32)
    np.testing.assert_allclose((Wp @ v)[5:5 + R], (W @ v)[5:5 + R][order], rtol=1e-6)
    np.testing.assert_array_equal(rope.permute_rope_rows(Wp, [5, 5 + R], R, inverse=True), W)


def test_yarn_inv_freq_matches_known_values():
    inv = rope.yarn_inv_freq(64, 10000.0, 40.0, 4096, 32, 1)
    plain = rope.rope_inv_freq(64, 10000.0)
    assert inv[0] == pytest.approx(plain[0])               # extrapolated high frequencies
    assert inv[-1] == pytest.approx(plain[-1] / 40.0, rel=1e-6)   # interpolated low frequencies
    assert np.all(np.diff(inv) < 0)


def test_rmsnorm_reads_a_strided_view():
    """The q_a columns of the fused q_a / kv_a projection: rows of a wider array, normalised without a copy."""
    y = np.random.default_rng(6).standard_normal((3, 20)).astype(np.float32)
    w = np.linspace(0.5, 1.5, 12).astype(np.float32)
    got = rmsnorm.rmsnorm(kd.backend.asarray(y)[:, :12], w, 1e-6)
    np.testing.assert_allclose(kd.backend.to_host(got), rmsnorm.rmsnorm_ref(y[:, :12], w, 1e-6), rtol=1e-6,
                               atol=1e-6)


def test_swiglu_reads_a_strided_view():
    """The shared expert's gate/up columns of the fused router + shared-expert product: read in place."""
    y = np.random.default_rng(9).standard_normal((3, 5 + 2 * 300)).astype(np.float32)     # [T, E + 2 Is]
    got = swiglu.swiglu(kd.backend.asarray(y)[:, 5:])
    np.testing.assert_allclose(kd.backend.to_host(got), swiglu.swiglu_ref(y[:, 5:]), rtol=1e-6, atol=1e-6)
