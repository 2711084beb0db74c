"""The drafter's per-head norm + RoPE (kernels/draft_kv.py): the cache write (k_norm + RoPE of k, v as it is, into
the cache rows) and the block's query (q_norm + RoPE), each one launch, reading column views of the fused
[q; k; v] product."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import draft_kv, rmsnorm, rope

from ..helpers import poisoned

H = kd.backend.to_host


def _inputs(T, n_kv, D, seed=0):
    rng = np.random.default_rng(seed)
    kv = (rng.standard_normal((T, 2 * n_kv * D)) * 2).astype(np.float32)     # [T, 2 Nkv D]
    w = (1 + 0.3 * rng.standard_normal(D)).astype(np.float32)               # [D]
    pos = rng.integers(0, 500, T).astype(np.int32)                          # [T]
    return kv, w, pos, rope.rope_inv_freq(D, 10000.0)


def test_reference_is_the_drafters_old_composition():
    """k = RoPE(k_norm(k heads)), v = the v heads - what DFlashDrafter computed with separate stages."""
    kv, w, pos, inv = _inputs(4, 3, 6)
    k, v = draft_kv.draft_kv_ref(kv, w, 1e-6, pos, inv, 1.2)
    k_old = rmsnorm.rmsnorm_ref(kv[:, :18].reshape(12, 6), w, 1e-6).reshape(4, 3, 6)
    np.testing.assert_array_equal(k, rope.rope_ref(k_old, pos, inv, 1.2))
    np.testing.assert_array_equal(v, kv[:, 18:].reshape(4, 3, 6))
    # the docstring's example
    k1, v1 = draft_kv.draft_kv_ref([[3, 4, 5, 6]], np.ones(2, np.float32), 0.0, [np.pi / 2], [1.0])
    np.testing.assert_allclose(k1[0, 0], [-1.1313709, 0.8485281], rtol=1e-5)
    np.testing.assert_array_equal(v1[0, 0], [5, 6])


@pytest.mark.usefixtures("kernel_backend")
@pytest.mark.parametrize("T,n_kv,D,start", [(3, 2, 8, 2), (2, 1, 6, 0), (1, 3, 64, 4)])
def test_kernel_writes_the_rows_and_nothing_else(T, n_kv, D, start):
    kv, w, pos, inv = _inputs(T, n_kv, D, seed=T * D)
    kc, vc = poisoned((start + T + 2, n_kv, D)), poisoned((start + T + 2, n_kv, D))
    draft_kv.write_draft_kv(kv, w, 1e-6, pos, inv, 1.0, kc, vc, start)
    k, v = draft_kv.draft_kv_ref(kv, w, 1e-6, pos, inv)
    gk, gv = H(kc), H(vc)
    np.testing.assert_allclose(gk[start:start + T], k, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(gv[start:start + T], v)
    for g in (gk, gv):
        assert np.isnan(g[:start]).all() and np.isnan(g[start + T:]).all()


@pytest.mark.parametrize("T,n_q,n_kv,D,width", [(3, 2, 1, 8, 24), (2, 1, 2, 6, 40)])
def test_norm_rows_apply_a_folded_input_norm(T, n_q, n_kv, D, width):
    """draft_qkv / write_draft_kv / draft_query of y = x @ (W diag w)^T with norm_rows=(x, eps) == of rmsnorm(x, w)
    @ W^T: an input RMSNorm folded into the fused projection (rmsnorm.folded_norm), its row scale 1 / rms(x[t])
    applied by the kernel to q, k and v alike."""
    rng = np.random.default_rng(T * width)
    x = (rng.standard_normal((T, width)) * 3).astype(np.float32)                    # [T, H]
    w = (1 + 0.3 * rng.standard_normal(width)).astype(np.float32)                   # [H]
    W = rng.standard_normal(((n_q + 2 * n_kv) * D, width)).astype(np.float32)       # [(Nq + 2Nkv) D, H]
    _, hw, pos, inv = _inputs(T, n_kv, D, seed=1)
    plain, folded = rmsnorm.rmsnorm_ref(x, w, 1e-6) @ W.T, x @ rmsnorm.folded_norm(W, w).T
    kc0, vc0 = np.zeros((T + 1, n_kv, D), np.float32), np.zeros((T + 1, n_kv, D), np.float32)
    with kd.backend.use("numpy"):
        q0 = draft_kv.draft_qkv(plain, hw, hw, 1e-6, pos, inv, 1.0, kc0, vc0, 1)
    kc, vc = poisoned((T + 1, n_kv, D)), poisoned((T + 1, n_kv, D))
    q = draft_kv.draft_qkv(folded, hw, hw, 1e-6, pos, inv, 1.0, kc, vc, 1, norm_rows=(x, 1e-6))
    tol = dict(rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(H(q), q0, **tol)
    np.testing.assert_allclose(H(kc)[1:], kc0[1:], **tol)
    np.testing.assert_allclose(H(vc)[1:], vc0[1:], rtol=1e-5, atol=1e-5 * np.abs(vc0).max())
    assert np.isnan(H(kc)[0]).all() and np.isnan(H(vc)[0]).all()
    kc2, vc2 = poisoned((T + 1, n_kv, D)), poisoned((T + 1, n_kv, D))
    draft_kv.write_draft_kv(folded[:, n_q * D:], hw, 1e-6, pos, inv, 1.0, kc2, vc2, 1, norm_rows=(x, 1e-6))
    np.testing.assert_allclose(H(kc2)[1:], kc0[1:], **tol)
    np.testing.assert_allclose(H(vc2)[1:], vc0[1:], rtol=1e-5, atol=1e-5 * np.abs(vc0).max())
    qq = draft_kv.draft_query(folded[:, :n_q * D], hw, 1e-6, pos, inv, 1.0, norm_rows=(x, 1e-6))
    np.testing.assert_allclose(H(qq), q0, **tol)


def test_device_start_is_read_by_the_kernel_and_rows_past_the_cache_are_dropped():
    kv, w, pos, inv = _inputs(3, 2, 4, seed=7)
    kc, vc = poisoned((5, 2, 4)), poisoned((5, 2, 4))
    draft_kv.write_draft_kv(kv, w, 1e-6, pos, inv, 1.0, kc, vc, kd.backend.full((1,), 3, np.int32))
    k, v = draft_kv.draft_kv_ref(kv, w, 1e-6, pos, inv)
    np.testing.assert_allclose(H(kc)[3:], k[:2], rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(H(vc)[3:], v[:2])
    assert np.isnan(H(kc)[:3]).all()


@pytest.mark.parametrize("device_start", [False, True])
def test_no_positions_means_start_plus_t(device_start):
    """positions=None: token t at position start + t, what the drafter's rows always are - the kernels add start
    themselves (a captured round launches no start + arange); the same rows and query as the explicit positions."""
    T, n_kv, D, start = 3, 2, 8, 5
    kv, w, _, inv = _inputs(T, n_kv, D, seed=11)
    pos = np.arange(start, start + T, dtype=np.int32)
    s = kd.backend.full((1,), start, np.int32) if device_start else start
    kc, vc = poisoned((start + T, n_kv, D)), poisoned((start + T, n_kv, D))
    draft_kv.write_draft_kv(kv, w, 1e-6, None, inv, 1.3, kc, vc, s)
    k, v = draft_kv.draft_kv_ref(kv, w, 1e-6, pos, inv, 1.3)
    np.testing.assert_allclose(H(kc)[start:], k, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(H(vc)[start:], v)
    q = draft_kv.draft_query(kv[:, :n_kv * D], w, 1e-6, None, inv, 1.3, start=s)
    np.testing.assert_allclose(H(q), draft_kv.draft_query_ref(kv[:, :n_kv * D], w, 1e-6, pos, inv, 1.3), rtol=2e-6,
                               atol=2e-6)


@pytest.mark.parametrize("change,msg", [
    (dict(start=4), r"start: rows 4\.\.6"),
    (dict(kv=np.zeros((3, 12), np.float32)), r"kv: expected shape \(\*, 16\)"),
    (dict(v_cache=np.zeros((6, 2, 3), np.float32)), r"v_cache: expected shape \(6, 2, 4\)"),
    (dict(k_cache=np.zeros((6, 2, 5), np.float32), v_cache=np.zeros((6, 2, 5), np.float32)),
     "k_cache: head dim 5; expected an even number"),
    (dict(positions=np.zeros(2, np.int32)), r"positions: expected shape \(3\), got \(2,\)"),
])
def test_bad_input_names_the_argument(change, msg):
    kv, w, pos, inv = _inputs(3, 2, 4)
    args = dict(kv=kv, w=w, eps=1e-6, positions=pos, inv_freq=inv, amp=1.0, k_cache=np.zeros((6, 2, 4), np.float32),
                v_cache=np.zeros((6, 2, 4), np.float32), start=0)
    args.update(change)
    with pytest.raises(ValueError, match=msg):
        draft_kv.write_draft_kv(**{k: kd.backend.asarray(v) if isinstance(v, np.ndarray) else v
                                   for k, v in args.items()})


def test_query_reference_is_the_drafters_old_composition():
    """q = RoPE(q_norm(q heads)): what DFlashDrafter computed with an RMSNorm and a RoPE launch; k is the same."""
    y, w, pos, inv = _inputs(4, 3, 6, seed=3)                                # y [4, 36]: 6 heads of 6
    want = rope.rope_ref(rmsnorm.rmsnorm_ref(y.reshape(24, 6), w, 1e-6).reshape(4, 6, 6), pos, inv, 1.2)
    np.testing.assert_array_equal(draft_kv.draft_query_ref(y, w, 1e-6, pos, inv, 1.2), want)
    q1 = draft_kv.draft_query_ref([[3, 4]], np.ones(2, np.float32), 0.0, [np.pi / 2], [1.0])   # the docstring's
    np.testing.assert_allclose(q1[0, 0], [-1.1313709, 0.8485281], rtol=1e-5)


@pytest.mark.usefixtures("kernel_backend")
@pytest.mark.parametrize("T,n_q,D", [(3, 4, 8), (2, 2, 6), (1, 2, 64)])
def test_query_kernel_reads_a_column_view_of_the_fused_product(T, n_q, D):
    """y = the first Nq D columns of a [T, (Nq + 2 Nkv) D] product (a strided view, as the drafter passes it);
    the k/v write reads the remaining columns of the same buffer."""
    rng = np.random.default_rng(T * D)
    n_kv = 1
    fused = kd.backend.asarray((rng.standard_normal((T, (n_q + 2 * n_kv) * D)) * 2).astype(np.float32))
    _, w, pos, inv = _inputs(T, n_kv, D, seed=D)
    q = poisoned((T, n_q, D))
    assert draft_kv.draft_query(fused[:, :n_q * D], w, 1e-6, pos, inv, 1.1, out=q) is q
    host = H(fused)
    np.testing.assert_allclose(H(q), draft_kv.draft_query_ref(host[:, :n_q * D], w, 1e-6, pos, inv, 1.1),
                               rtol=2e-6, atol=2e-6)
    kc, vc = poisoned((T, n_kv, D)), poisoned((T, n_kv, D))
    draft_kv.write_draft_kv(fused[:, n_q * D:], w, 1e-6, pos, inv, 1.0, kc, vc, 0)
    k, v = draft_kv.draft_kv_ref(host[:, n_q * D:], w, 1e-6, pos, inv)
    np.testing.assert_allclose(H(kc), k, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(H(vc), v)
    np.testing.assert_array_equal(H(fused), host)                            # the product is only read


@pytest.mark.usefixtures("kernel_backend")
@pytest.mark.parametrize("device_start", [False, True])
@pytest.mark.parametrize("T,n_q,n_kv,D,start", [(3, 4, 2, 8, 2), (1, 3, 1, 6, 0)])
def test_qkv_is_the_query_and_the_cache_write_in_one_launch(device_start, T, n_q, n_kv, D, start):
    """draft_qkv on the fused product y [T, (Nq + 2 Nkv) D]: the query of its first Nq heads (q_w) and the cache
    rows of its k / v heads (k_w), both at start + t - what draft_query and write_draft_kv give separately."""
    rng = np.random.default_rng(5)
    y = (rng.standard_normal((T, (n_q + 2 * n_kv) * D)) * 2).astype(np.float32)
    q_w, k_w = (1 + 0.3 * rng.standard_normal((2, D))).astype(np.float32)
    inv = rope.rope_inv_freq(D, 10000.0)
    s = kd.backend.full((1,), start, np.int32) if device_start else start
    kc, vc = poisoned((start + T + 1, n_kv, D)), poisoned((start + T + 1, n_kv, D))
    q = draft_kv.draft_qkv(y, q_w, k_w, 1e-6, None, inv, 1.2, kc, vc, s)
    pos = np.arange(start, start + T)
    np.testing.assert_allclose(H(q), draft_kv.draft_query_ref(y[:, :n_q * D], q_w, 1e-6, pos, inv, 1.2), rtol=2e-6,
                               atol=2e-6)
    k, v = draft_kv.draft_kv_ref(y[:, n_q * D:], k_w, 1e-6, pos, inv, 1.2)
    np.testing.assert_allclose(H(kc)[start:start + T], k, rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(H(vc)[start:start + T], v)
    assert np.isnan(H(kc)[:start]).all() and np.isnan(H(kc)[start + T:]).all()
    with pytest.raises(ValueError, match=rf"y: expected \(Nq \+ {2 * n_kv}\) x {D} columns"):
        draft_kv.draft_qkv(y[:, :2 * n_kv * D], q_w, k_w, 1e-6, None, inv, 1.2, kc, vc, 0)   # no query head left


@pytest.mark.parametrize("change,msg", [
    (dict(y=np.zeros((3, 10), np.float32)), r"y: expected a multiple of the head dim 4 columns, got shape \(3, 10\)"),
    (dict(w=np.ones(5, np.float32)), "w: head dim 5; expected an even number"),
    (dict(positions=np.zeros(4, np.int32)), r"positions: expected shape \(3\), got \(4,\)"),
    (dict(out=np.zeros((3, 2, 5), np.float32)), r"out: expected shape \(3, 2, 4\)"),
    (dict(eps=-1.0), "eps: expected"),
])
def test_query_bad_input_names_the_argument(change, msg):
    _, w, pos, inv = _inputs(3, 1, 4)
    args = dict(y=np.zeros((3, 8), np.float32), w=w, eps=1e-6, positions=pos, inv_freq=inv, amp=1.0)
    args.update(change)
    with pytest.raises(ValueError, match=msg):
        draft_kv.draft_query(**{k: kd.backend.asarray(v) if isinstance(v, np.ndarray) else v
                                for k, v in args.items()})
