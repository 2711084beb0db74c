"""The DFlash drafter's block attention (GQA, non-causal) against its float64 reference."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import block_attention as ba

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host


V1_CASES = [(3, 6, 2, 7, 23, 21), (5, 4, 4, 5, 9, 5), (2, 3, 1, 9, 12, 1), (1, 8, 1, 33, 17, 17),
            (2, 4, 2, 6, 150, 139),      # 64 + 64 + 11 keys: three tiles
            (1, 2, 1, 128, 60, 55)]      # 27 + 27 + 1 at the Kimi head dim
V2_CASES = [(3, 6, 2, 7, 23, 21),        # D 7: values at tile column 8, 4-byte copies; 2 key tiles
            (2, 3, 1, 9, 12, 1),         # one key for two queries (start = n_keys - B = -1)
            (16, 4, 2, 8, 40, 37)]       # the drafter's block of 16 (x 2 heads = 32 rows: one tile per kv head)


@pytest.mark.parametrize("variant,B,Nq,Nkv,D,S,n_keys", [("v1",) + c for c in V1_CASES] +
                         [("v2",) + c for c in V2_CASES])
def test_matches_reference(variant, B, Nq, Nkv, D, S, n_keys):
    rng = np.random.default_rng(B * 100 + D)
    q = rng.standard_normal((B, Nq, D)).astype(np.float32)
    k = rng.standard_normal((S, Nkv, D)).astype(np.float32)
    v = rng.standard_normal((S, Nkv, D)).astype(np.float32)
    k[n_keys:] = np.nan                                    # rows past n_keys must never be read
    v[n_keys:] = np.nan
    out = poisoned((B, Nq, D))
    ba.block_attention(q, k, v, n_keys, 0.41, out=out, variant=variant)
    want = ba.block_attention_ref(q, k, v, n_keys, 0.41)
    assert np.isfinite(want).all()
    np.testing.assert_allclose(H(out), want, rtol=1e-4 if variant == "v2" else 1e-5, atol=1e-4 if variant == "v2"
                               else 1e-5)


@pytest.mark.parametrize("variant", ["v1", "v2"])
def test_device_keys_with_a_host_offset(variant):
    """n_keys = (device start, B): the kernel adds the two (the captured draft's start + B, no launch first); the
    same output as n_keys = start + B, rows past it never read."""
    rng = np.random.default_rng(3)
    B, Nq, Nkv, D, start = 16, 4, 2, 8, 21
    q = rng.standard_normal((B, Nq, D)).astype(np.float32)
    k = rng.standard_normal((48, Nkv, D)).astype(np.float32)
    v = rng.standard_normal((48, Nkv, D)).astype(np.float32)
    k[start + B:] = np.nan
    v[start + B:] = np.nan
    out = ba.block_attention(q, k, v, (kd.backend.full((1,), start, np.int32), B), 0.3, variant=variant)
    np.testing.assert_allclose(H(out), ba.block_attention_ref(q, k, v, start + B, 0.3), rtol=1e-4, atol=1e-4)
    with pytest.raises(TypeError, match=r"n_keys: expected an int, a device int32 \[1\] array or \(array, int\)"):
        ba.block_attention(q, k, v, (start, B), 0.3, variant=variant)


def test_non_causal_and_grouped():
    """Every query sees every key (the first query too), and heads of one kv group read the same rows."""
    rng = np.random.default_rng(7)
    q = rng.standard_normal((4, 4, 3)).astype(np.float32)
    k = rng.standard_normal((4, 2, 3)).astype(np.float32)
    v = rng.standard_normal((4, 2, 3)).astype(np.float32)
    out = H(ba.block_attention(q, k, v, 4, 1.0))
    s = np.einsum("d,sd->s", q[0, 1].astype(np.float64), k[:, 0].astype(np.float64))   # head 1 -> kv head 0
    p = np.exp(s - s.max())
    np.testing.assert_allclose(out[0, 1], (p / p.sum()) @ v[:, 0], rtol=1e-5)


def test_tile_rows_follow_the_head_dim():
    assert [ba.tile_rows(D) for D in (6, 32, 128, 256)] == [64, 64, 27, 13]
    assert ba.tile_rows(ba.MAX_D) * (ba.MAX_D + 1) <= ba.TILE_FLOATS


def test_docstring_example():
    q = np.array([[[5.0]], [[-2.0]]], np.float32)
    kv = np.array([[[0.0]], [[0.0]]], np.float32), np.array([[[1.0]], [[3.0]]], np.float32)
    np.testing.assert_allclose(H(ba.block_attention(q, kv[0], kv[1], 2, 1.0))[:, 0, 0], [2.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(H(ba.block_attention(q, kv[0], kv[1], 1, 1.0))[:, 0, 0], [1.0, 1.0], rtol=1e-6)


@pytest.mark.parametrize("call, msg", [
    (lambda: ba.block_attention(np.zeros((2, 3, 4), np.float32), np.zeros((5, 2, 4), np.float32),
                                np.zeros((5, 2, 4), np.float32), 3, 1.0), "k: 2 kv heads do not divide"),
    (lambda: ba.block_attention(np.zeros((2, 2, 4), np.float32), np.zeros((5, 2, 3), np.float32),
                                np.zeros((5, 2, 3), np.float32), 3, 1.0), "k: expected head dim 4"),
    (lambda: ba.block_attention(np.zeros((2, 2, 4), np.float32), np.zeros((5, 2, 4), np.float32),
                                np.zeros((5, 2, 4), np.float32), 6, 1.0), "n_keys: expected an integer <= 5"),
    (lambda: ba.block_attention(np.zeros((2, 2, 4), np.float32), np.zeros((5, 2, 4), np.float32),
                                np.zeros((4, 2, 4), np.float32), 3, 1.0), r"v: expected shape \(5, 2, 4\)"),
])
def test_bad_input(call, msg):
    """(v1 and v2 share the checks; v2's own limit is below.)"""
    with pytest.raises(ValueError, match=msg):
        call()


def test_zero_head_dim_is_refused():
    z = np.zeros((2, 2, 0), np.float32)
    for variant in ba.VARIANTS:
        with pytest.raises(ValueError, match="q: expected a head dim"):
            ba.block_attention(z, np.zeros((5, 2, 0), np.float32), np.zeros((5, 2, 0), np.float32), 3, 1.0,
                               variant=variant)


def test_v2_head_dim_limit_and_variant_name():
    q = np.zeros((2, 2, 300), np.float32)
    kv = np.zeros((5, 2, 300), np.float32)
    with pytest.raises(ValueError, match="q: head dim 300 exceeds v2's 288"):
        ba.block_attention(q, kv, kv, 3, 1.0, variant="v2")
    with pytest.raises(ValueError, match="variant: expected 'v1', 'v2' or None, got 'v3'"):
        ba.block_attention(q[:, :, :4], kv[:, :, :4], kv[:, :, :4], 3, 1.0, variant="v3")
    assert ba.default_variant() == ("v2" if kd.backend.name == "cuda" else "v1")
