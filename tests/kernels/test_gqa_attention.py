"""Grouped-query attention on the v2 tiles (kernels/gqa_attention.py): causal and not, G = 1 .. 4 query heads per
kv head, keys and values in their own arrays, against the float64 reference. Simulator cases are tiny (one or two
blocks per kv head); the GPU runs the same cases and Kimi-sized ones (``gpu`` marker)."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import gqa_attention as gqa

from ..helpers import poisoned

H = kd.backend.to_host
TOL = dict(rtol=1e-4, atol=1e-4)


def _case(T, Nq, Nkv, Dk, Dv, start, seed=0, extra=2):
    rng = np.random.default_rng(seed)
    q = (2 * rng.standard_normal((T, Nq, Dk))).astype(np.float32)
    k = rng.standard_normal((start + T + extra, Nkv, Dk)).astype(np.float32)
    v = rng.standard_normal((start + T + extra, Nkv, Dv)).astype(np.float32)
    return q, k, v


CASES = {
    "mha": (3, 2, 2, 16, 8, 5, True, None),      # MHA (G = 1, the decompressed prefill): 3 rows per head, 2 heads
    "gqa": (4, 4, 2, 8, 8, 10, False, None),     # G = 2, not causal (the DFlash block): 8 rows per kv head
    "odd": (3, 3, 1, 13, 5, 4, True, 2),         # Dk 13 (zero pad / values at column 16), Dv 5 (4-byte copies);
                                                 # 2 splits + combine
    "tiles": (12, 3, 1, 8, 16, 0, True, None),   # 36 rows: 2 blocks (v2's 32 rows; v3's and v4's 2 warps x 16
                                                 # on the simulator), a block's tokens straddle; no prefix
    "grid": (34, 2, 2, 8, 8, 0, True, 2),        # 2 query tiles x 2 splits x 2 kv heads: v4's heaviest-first
}                                                # block order must still cover every (tile, split, head) once


@pytest.mark.usefixtures("kernel_backend")
@pytest.mark.parametrize("variant,case", [(v, c) for v in ("v3", "v4") for c in CASES] +
                         [("v2", "gqa"), ("v2", "odd")])
def test_matches_reference(variant, case):
    T, Nq, Nkv, Dk, Dv, start, causal, splits = CASES[case]
    q, k, v = _case(T, Nq, Nkv, Dk, Dv, start, seed=T + Dk)
    out = poisoned((T, Nq, Dv))
    gqa.gqa_attention(q, k, v, start, 0.3, causal=causal, out=out, splits=splits, variant=variant)
    np.testing.assert_allclose(H(out), gqa.gqa_attention_ref(q, k, v, start, 0.3, causal), **TOL)
    if causal:                            # rows after start + 0, which token 0's block loads, never reach token 0
        k2, v2 = k.copy(), v.copy()
        k2[start + 1:], v2[start + 1:] = 1e3, 1e6
        got = H(gqa.gqa_attention(q, k2, v2, start, 0.3, causal=True, splits=splits, variant=variant))
        np.testing.assert_array_equal(got[0], H(out)[0])


@pytest.mark.usefixtures("kernel_backend")
@pytest.mark.parametrize("variant", gqa.VARIANTS)
def test_device_side_start_equals_host_int(variant):
    q, k, v = _case(2, 2, 1, 8, 8, 6, extra=9)
    dev = kd.backend.full((1,), 6, np.int32)
    for causal in (True, False):
        got = H(gqa.gqa_attention(q, k, v, dev, 0.5, causal=causal, variant=variant))
        np.testing.assert_allclose(got, gqa.gqa_attention_ref(q, k, v, 6, 0.5, causal), **TOL)


def test_docstring_example():
    q = np.array([[[0.5]], [[-2.0]]], np.float32)
    k = np.zeros((2, 1, 1), np.float32)
    v = np.array([[[1.0]], [[3.0]]], np.float32)
    np.testing.assert_allclose(H(gqa.gqa_attention(q, k, v, 0, 1.0))[:, 0, 0], [1.0, 2.0], rtol=1e-6)
    np.testing.assert_allclose(H(gqa.gqa_attention(q, k, v, 0, 1.0, causal=False))[:, 0, 0], [2.0, 2.0], rtol=1e-6)


def test_numpy_backend_matches_reference(numpy_backend):
    """The numpy backend's float32 path at a prefill-sized shape: within 1e-5 of float64."""
    q, k, v = _case(40, 8, 4, 24, 16, 30, seed=3)
    for causal in (True, False):
        np.testing.assert_allclose(gqa.gqa_attention(q, k, v, 30, 0.2, causal=causal),
                                   gqa.gqa_attention_ref(q, k, v, 30, 0.2, causal), rtol=1e-5, atol=1e-5)


def test_reference_is_plain_attention_per_head(numpy_backend):
    """G = 2 is MHA with each kv head repeated for its two query heads (an independent spelling of the spec)."""
    q, k, v = _case(3, 4, 2, 6, 5, 2, seed=4)
    want = np.empty((3, 4, 5))
    for h in range(4):
        for t in range(3):
            s = 0.7 * k[:2 + t + 1, h // 2] @ q[t, h]
            p = np.exp(s - s.max())
            want[t, h] = p @ v[:2 + t + 1, h // 2] / p.sum()
    np.testing.assert_allclose(gqa.gqa_attention_ref(q, k, v, 2, 0.7), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("args,match", [
    (dict(k=np.zeros((5, 3, 4), np.float32)), "k: expected a number of kv heads that divides q's 4 query heads"),
    (dict(k=np.zeros((5, 2, 3), np.float32)), r"k: expected shape \(\*, \*, 4\)"),
    (dict(v=np.zeros((6, 2, 4), np.float32)), "v: expected shape"),
    (dict(start=4), "start: 4 \\+ 2 query rows exceed the 5 rows of k"),
    (dict(scale=0.0), "scale"),
    (dict(variant="v5"), "variant: expected 'v2', 'v3', 'v4' or None, got 'v5'"),
    (dict(q=np.zeros((2, 4, 0), np.float32), k=np.zeros((5, 2, 0), np.float32)), "q: expected a key dim"),
    (dict(v=np.zeros((5, 2, 0), np.float32)), "v: expected a value dim"),
    (dict(splits=0), "splits"),
    (dict(q=np.zeros((2, 4, 264), np.float32), k=np.zeros((5, 2, 264), np.float32), variant="v3"),
     "variant: v3 takes key dims <= 256 and value dims <= 128, got 264 and 4"),
    (dict(q=np.zeros((2, 4, 200), np.float32), k=np.zeros((5, 2, 200), np.float32), variant="v4"),
     "variant: v4 takes key dims <= 192 and value dims <= 128, got 200 and 4"),
])
def test_bad_input_names_the_argument(args, match, numpy_backend):
    kw = dict(q=np.zeros((2, 4, 4), np.float32), k=np.zeros((5, 2, 4), np.float32),
              v=np.zeros((5, 2, 4), np.float32), start=1, scale=1.0) | args
    with pytest.raises(ValueError, match=match):
        gqa.gqa_attention(**kw)


@pytest.mark.gpu
@pytest.mark.parametrize("T,Nq,Nkv,Dk,Dv,start,causal", [
    (512, 16, 16, 192, 128, 256, True),   # Kimi's decompressed prefill chunk (16 of its 64 heads)
    (16, 8, 4, 32, 32, 300, False),       # the default drafter's block
    (16, 64, 8, 128, 128, 2000, False),   # a Kimi-sized DFlash block (G = 8)
])
@pytest.mark.parametrize("variant", gqa.VARIANTS)
def test_gpu_shapes(T, Nq, Nkv, Dk, Dv, start, causal, variant):
    q, k, v = _case(T, Nq, Nkv, Dk, Dv, start, seed=1)
    got = H(gqa.gqa_attention(q, k, v, start, Dk ** -0.5, causal=causal, variant=variant))
    np.testing.assert_allclose(got, gqa.gqa_attention_ref(q, k, v, start, Dk ** -0.5, causal), **TOL)


@pytest.mark.usefixtures("kernel_backend")
def test_v4_needs_its_shared_memory(monkeypatch):
    """v4's staged query rows need ~139 KB of shared memory per block on the GPU (66 KB with the simulator's 2
    warps): a device that gives less (sm_86 / sm_89: 99 KB, sm_75: 64 KB) runs v3 by default, and an explicit v4
    is refused by name."""
    assert gqa.default_variant(192, 128) == "v4"
    monkeypatch.setattr(kd.backend, "shared_optin", lambda: 65536)
    assert gqa.default_variant(192, 128) == "v3"
    q, k, v = _case(2, 2, 1, 8, 8, 3)
    with pytest.raises(ValueError, match=r"variant: v4 needs \d+ bytes of shared memory per block, this GPU "
                                         r"gives 65536; use 'v3'"):
        gqa.gqa_attention(q, k, v, 3, 0.5, variant="v4")


def test_default_variant_follows_the_head():
    assert [gqa.default_variant(*d) for d in ((192, 128), (32, 32), (200, 128), (256, 129), (576, 512))] == \
        ["v4", "v4", "v3", "v2", "v2"]
