"""The MLA latent write (kernels/mla_latent.py): one launch = RMSNorm of the latent + RoPE of k_rot + the cache rows."""
import numpy as np
import pytest
from numba import cuda

import kdtree_numba as kd
from kdtree_numba.kernels import mla_latent, rmsnorm, rope

from ..helpers import poisoned

H = kd.backend.to_host


def _inputs(T, lkv, R, seed=0):
    rng = np.random.default_rng(seed)
    ckv = rng.standard_normal((T, lkv + R)).astype(np.float32) * 2           # [T, Lkv + R]
    w = (1 + 0.3 * rng.standard_normal(lkv)).astype(np.float32)             # [Lkv]
    pos = rng.integers(0, 500, T).astype(np.int32)                          # [T]
    return ckv, w, pos, rope.rope_inv_freq(R, 10000.0)


def test_reference_is_rmsnorm_then_rope():
    ckv, w, pos, inv = _inputs(4, 10, 6)
    rows = mla_latent.latent_rows_ref(ckv, w, 1e-6, pos, inv, 1.3)
    np.testing.assert_array_equal(rows[:, :10], rmsnorm.rmsnorm_ref(ckv[:, :10], w, 1e-6))
    np.testing.assert_array_equal(rows[:, 10:], rope.rope_ref(ckv[:, None, 10:], pos, inv, 1.3)[:, 0])
    # the docstring's example: mean square 12.5, [1, 0] turned by 90 degrees
    ex = mla_latent.latent_rows_ref([[3, 4, 1, 0]], np.ones(2, np.float32), 0.0, [0], [0.0])
    np.testing.assert_allclose(ex, [[0.8485281, 1.1313709, 1, 0]], rtol=1e-6)


@pytest.mark.usefixtures("kernel_backend")
@pytest.mark.parametrize("T,lkv,R,start", [(3, 20, 6, 2), (1, 1030, 4, 0), (5, 7, 2, 3)])
def test_kernel_writes_the_rows_and_nothing_else(T, lkv, R, start):
    """Rows start .. start + T - 1 equal the reference; the rest of the cache keeps its poison. The latent part
    equals the RMSNorm kernel's bit for bit (same threads, same sums), the rope part the RoPE kernel's."""
    ckv, w, pos, inv = _inputs(T, lkv, R, seed=T + lkv)
    cache = poisoned((start + T + 2, lkv + R))
    mla_latent.write_latent(ckv, w, 1e-6, pos, inv, 1.0, cache, start)
    got = H(cache)
    np.testing.assert_allclose(got[start:start + T], mla_latent.latent_rows_ref(ckv, w, 1e-6, pos, inv),
                               rtol=2e-6, atol=2e-6)
    assert np.isnan(got[:start]).all() and np.isnan(got[start + T:]).all()
    np.testing.assert_array_equal(got[start:start + T, :lkv],
                                  H(rmsnorm.rmsnorm(np.ascontiguousarray(ckv[:, :lkv]), w, 1e-6)))
    k_rot = np.ascontiguousarray(ckv[:, lkv:]).reshape(T, 1, R)
    np.testing.assert_array_equal(got[start:start + T, lkv:], H(rope.apply_rope(k_rot, pos, inv)).reshape(T, R))


def test_device_start_is_read_by_the_kernel_and_rows_past_the_cache_are_dropped():
    ckv, w, pos, inv = _inputs(3, 8, 4, seed=5)
    cache = poisoned((6, 12))
    mla_latent.write_latent(ckv, w, 1e-6, pos, inv, 1.0, cache, kd.backend.full((1,), 4, np.int32))
    got = H(cache)
    np.testing.assert_allclose(got[4:6], mla_latent.latent_rows_ref(ckv, w, 1e-6, pos, inv)[:2], rtol=2e-6,
                               atol=2e-6)
    assert np.isnan(got[:4]).all()


@pytest.mark.usefixtures("kernel_backend")
def test_rope_base_is_added_by_the_kernels():
    """base + positions: a tree verify passes its depths and its (device) start, and the latent write and the
    query's RoPE add them (no add launch) - the same rows and query as positions start + depth."""
    ckv, w, _, inv = _inputs(3, 8, 4, seed=9)
    depths = np.array([0, 1, 1], np.int32)
    base = kd.backend.full((1,), 40, np.int32)
    a, b = poisoned((3, 12)), poisoned((3, 12))
    mla_latent.write_latent(ckv, w, 1e-6, depths, inv, 1.0, a, 0, base=base)
    mla_latent.write_latent(ckv, w, 1e-6, 40 + depths, inv, 1.0, b, 0)
    np.testing.assert_array_equal(H(a), H(b))
    x = np.ascontiguousarray(ckv[:, 8:]).reshape(3, 1, 4)
    np.testing.assert_array_equal(H(rope.apply_rope(x, depths, inv, base=base)),
                                  H(rope.apply_rope(x, 40 + depths, inv)))


@pytest.mark.parametrize("call,msg", [
    (lambda c, w, p, i, cache: mla_latent.write_latent(c, w, 1e-6, p, i, 1.0, cache, 5), r"start: rows 5\.\.7"),
    (lambda c, w, p, i, cache: mla_latent.write_latent(np.ascontiguousarray(c[:, :-1]), w, 1e-6, p, i, 1.0, cache, 0),
     "w: 8 latent columns leave 3 rope columns"),
    (lambda c, w, p, i, cache: mla_latent.write_latent(c, w, 1e-6, p[:2], i, 1.0, cache, 0), "positions: expected"),
    (lambda c, w, p, i, cache: mla_latent.write_latent(c, w, 1e-6, p, i, 1.0, cache[:, :10], 0),
     r"cache: expected shape \(\*, 12\)"),
])
def test_bad_input_names_the_argument(call, msg):
    ckv, w, pos, inv = _inputs(3, 8, 4)
    with pytest.raises(ValueError, match=msg):
        call(ckv, w, pos, inv, kd.backend.zeros((6, 12), np.float32))


@pytest.mark.usefixtures("kernel_backend")
def test_rope_reads_and_writes_strided_slices():
    """apply_rope on q's rope columns straight into the absorbed query's rope columns (views, no copies)."""
    rng = np.random.default_rng(2)
    T, N, P, R, lkv = 3, 4, 5, 6, 7
    q = kd.backend.asarray(rng.standard_normal((T, N, P + R)).astype(np.float32))   # [T, N, P+R]
    q_abs = poisoned((T, N, lkv + R))                                                 # [T, N, Lkv+R]
    pos, inv = np.array([3, 0, 9], np.int32), rope.rope_inv_freq(R, 10000.0)
    rope.apply_rope(q[:, :, P:], pos, inv, out=q_abs[:, :, lkv:])
    got = H(q_abs)
    np.testing.assert_allclose(got[:, :, lkv:], rope.rope_ref(H(q)[:, :, P:], pos, inv), rtol=1e-6, atol=1e-6)
    assert np.isnan(got[:, :, :lkv]).all()



@cuda.jit
def _negate(out, x):                         # the output first: a staged copy of x written back last would win
    i = cuda.threadIdx.x
    out[0, i] = -x[0, i]


@pytest.mark.usefixtures("kernel_backend")
def test_launch_takes_strided_views_even_as_both_input_and_output():
    """Kernels index strided views as they are (on the GPU directly; the simulator stages them in contiguous copies
    and writes back what the kernel changed), also when two arguments view the same memory (in place)."""
    a = kd.backend.asarray(np.arange(12, dtype=np.float32).reshape(2, 6))
    kd.backend.launch(_negate, 1, 3, a[:, ::2], a[:, ::2])
    np.testing.assert_array_equal(H(a)[0], [0, 1, -2, 3, -4, 5])
    np.testing.assert_array_equal(H(a)[1], np.arange(6, 12))
