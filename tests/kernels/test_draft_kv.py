"""The drafter's cache write (kernels/draft_kv.py): per-head k_norm + RoPE of k, v as it is, into the cache rows."""
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


def test_device_start_is_read_by_the_kernel_and_rows_past_the_cache_are_dropped():
    kv, w, pos, inv = _inputs(3, 2, 4, seed=7)
    kc, vc = poisoned((5, 2, 4)), poisoned((5, 2, 4))
    draft_kv.write_draft_kv(kv, w, 1e-6, pos, inv, 1.0, kc, vc, kd.backend.full((1,), 3, np.int32))
    k, v = draft_kv.draft_kv_ref(kv, w, 1e-6, pos, inv)
    np.testing.assert_allclose(H(kc)[3:], k[:2], rtol=2e-6, atol=2e-6)
    np.testing.assert_array_equal(H(vc)[3:], v[:2])
    assert np.isnan(H(kc)[:3]).all()


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
