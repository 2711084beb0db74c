"""MLA attention as 3xTF32 GEMMs (kernels/mla_gemm_attention.py): the operand split, the row chunks, the masks
(causal, tree, a device-side start) against the float64 references, and on a GPU chunked = whole and
variant=None = "gemm" where ``pays``. The shared reference cases of every variant are in test_attention.py."""
import types

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import mla_attention as mla, mla_gemm_attention as mg, tree as kt, tree_verify as tv

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host
TOL = dict(rtol=1e-4, atol=1e-4)


def test_split_is_exact_and_zeroes_rows_past_the_visible_span():
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((5, 7)) * 10.0 ** rng.integers(-20, 20, (5, 7))).astype(np.float32)
    k3 = H(mg._split3(kd.backend.asarray(x), 8, mg.KEYS, 1, kd.backend.full((1,), 2, np.int32), 1))   # 4 rows seen
    q3 = H(mg._split3(kd.backend.asarray(x), 5, mg.QUERIES))
    hi, lo = q3[:, :7], q3[:, 7:14]
    assert not (hi.view(np.uint32) & np.uint32(0x1FFF)).any()          # hi: TF32 (13 low mantissa bits clear)
    np.testing.assert_array_equal(hi + lo, x)                          # hi + lo = x exactly
    np.testing.assert_array_equal(q3[:, 14:], hi)                       # queries [hi | lo | hi]
    np.testing.assert_array_equal(k3[:4], np.concatenate([lo, hi, hi], axis=1)[:4])   # keys [lo | hi | hi]
    assert not k3[4:].any()                                             # past start (1 + 2) + 1 new row: zeros
    np.testing.assert_array_equal(k3, mg.split3_ref(x, 8, mg.KEYS, n_valid=4))   # the NumPy reference, bit for bit
    np.testing.assert_array_equal(q3, mg.split3_ref(x, 5, mg.QUERIES))
    ref = mg.split3_ref(x[:, :3], 6, mg.KEYS, n_valid=4)                # [6, 9] = [lo | hi | hi]
    for copies in (2, 3):
        vt = H(mg._split_vt(kd.backend.asarray(x), 3, 6, 1, kd.backend.full((1,), 2, np.int32), 1, copies))
        want = np.concatenate([ref[:, 3 * j:3 * j + 3].T for j in range(copies)], axis=1)   # [3, 6 W]
        np.testing.assert_array_equal(vt, want)                         # V^T: [lo | hi (| hi)] of the values


def test_three_products_keep_fp32_accuracy_where_one_tf32_product_does_not():
    """The split is what makes TF32 tensor cores fp32-grade: 3xTF32 scores within 1e-5 relative of float64,
    a plain TF32 product (operands truncated) off by more than 1e-4."""
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((16, 64)).astype(np.float32), rng.standard_normal((64, 24)).astype(np.float32)
    want = a.astype(np.float64) @ b.astype(np.float64)
    a3 = mg._split3(kd.backend.asarray(a), 16, mg.QUERIES)
    b3 = mg._split3(kd.backend.asarray(np.ascontiguousarray(b.T)), 24, mg.KEYS)
    three = H(mg._gemm_tf32(a3, b3.T, kd.backend.empty((16, 24), np.float32)))
    one = H(mg._gemm_tf32(kd.backend.asarray(a), kd.backend.asarray(b), kd.backend.empty((16, 24), np.float32)))
    scale = np.abs(want).max()
    assert np.abs(three - want).max() < 1e-5 * scale
    assert np.abs(one - want).max() > 1e-4 * scale


@pytest.fixture(params=[2, 3], ids=["two copies of P", "three copies of P"])
def copies(request, monkeypatch):
    """Both layouts of P's rows (``p_copies``), whatever the test's key count."""
    monkeypatch.setattr(mg, "P3_MAX_KEYS", 0 if request.param == 2 else 1 << 30)
    return request.param


def test_plan_examples():
    assert mg.padded_keys(4353) == 4384 and mg.padded_keys(32) == 32 and mg.padded_keys(0) == 32
    assert mg.p_copies(800) == 3 and mg.p_copies(4384) == 2
    assert mg.chunk_rows(16448, 32800, None) == 4092
    assert mg.chunk_rows(16448, 800, None) == 16448
    assert mg.chunk_rows(16448, 4352, None) == 16448
    assert mg.chunk_rows(10, 32, 3) == 4


def test_pays_only_for_big_host_start_launches_on_a_gpu(monkeypatch):
    big = (257 * 64, 512 + 257)                                         # 256 nodes x 64 heads over 512 rows
    assert not mg.pays(*big, False) or kd.backend.name == "cuda"
    monkeypatch.setattr(mg, "backend", types.SimpleNamespace(name="cuda"))
    assert mg.pays(*big, False)
    assert not mg.pays(*big, True)                                      # a device start: S spans the whole cache
    assert mg.pays(17 * 64, 4113, False)                               # 1088 rows: gemm 1.5x faster than v5
    assert not mg.pays(17 * 16, 4113, False)                           # few rows: v5's streaming wins
    assert not mg.pays(64 * 64, 1024, False, causal=True)              # a short causal chunk: v5
    assert not mg.pays(257 * 64, 300, False)                           # few keys
    assert not mg.pays(512 * 64, 512, False, causal=True)              # a causal square of few keys: v5's triangle
    assert mg.pays(2048 * 64, 2048, False, causal=True)


def test_docstring_example():
    cache = np.array([[1, 0], [0, 1]], np.float32)
    q = np.array([[[0, 0]], [[np.log(3), 0]]], np.float32)
    got = H(mla.mla_attention(q, cache, 0, 1.0, 1, variant="gemm"))
    np.testing.assert_allclose(got[:, 0, 0], [1.0, 0.75], rtol=1e-5)


@pytest.mark.parametrize("splits", [None, 2, 7])
def test_causal_chunks_read_only_their_keys(splits, copies):
    """Row chunks over a causal chunk (each chunk's S stops after its last token's keys); rows past the chunk's
    tokens are NaN, so a key read past the mask would poison the output."""
    rng = np.random.default_rng(splits or 0)
    T, N, D, lkv, start = 5, 3, 12, 8, 37
    q = rng.standard_normal((T, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + T + 6, D)).astype(np.float32)
    cache[start + T:] = np.nan
    want = mla.mla_attention_ref(q, cache, start, 0.4, lkv)
    got = H(mla.mla_attention(q, cache, start, 0.4, lkv, out=poisoned((T, N, lkv)), splits=splits, variant="gemm"))
    np.testing.assert_allclose(got, want, **TOL)
    dev = kd.backend.full((1,), start, np.int32)                        # S over all 48 rows, the NaN ones zeroed
    np.testing.assert_allclose(H(mla.mla_attention(q, cache, dev, 0.4, lkv, splits=splits, variant="gemm")), want,
                               **TOL)


@pytest.mark.parametrize("splits", [None, 3])
def test_tree_mask_sees_only_ancestors(splits, copies):
    """The ancestor-only mask, row chunks straddling tokens: the tree rows are scaled up so that a row seen off
    its node's path moves the output far past the tolerance. Rows past the tree are NaN."""
    rng = np.random.default_rng(4)
    parents = np.array([-1, 0, 0, 1, 3, 1, 0, 6], np.int64)
    paths, depths = kt.ancestor_paths(parents)
    n1, N, D, lkv, start = 8, 4, 10, 6, 9
    q = rng.standard_normal((n1, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + n1 + 3, D)).astype(np.float32)
    cache[start:start + n1] *= 3.0
    cache[start + n1:] = np.nan
    want = tv.tree_attention_ref(q, cache, start, parents, 0.5, lkv)
    got = H(tv.tree_attention(q, cache, start, paths, depths, 0.5, lkv, splits=splits, variant="gemm"))
    np.testing.assert_allclose(got, want, **TOL)
    dev = kd.backend.full((1,), start, np.int32)
    np.testing.assert_allclose(H(tv.tree_attention(q, cache, dev, paths, depths, 0.5, lkv, splits=splits,
                                                   variant="gemm")), want, **TOL)


def test_a_path_deeper_than_a_warp(copies):
    """The softmax reads a token's path one entry a lane: a chain of 40 nodes takes two passes of the warp."""
    rng = np.random.default_rng(6)
    parents = np.arange(-1, 39)                                         # node j's parent is j - 1: depth 39
    paths, depths = kt.ancestor_paths(parents)
    n1, N, D, lkv, start = 40, 1, 6, 4, 3
    q = rng.standard_normal((n1, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + n1, D)).astype(np.float32)
    want = tv.tree_attention_ref(q, cache, start, parents, 0.5, lkv)
    np.testing.assert_allclose(H(tv.tree_attention(q, cache, start, paths, depths, 0.5, lkv, variant="gemm")), want,
                               **TOL)


def test_variant_none_picks_gemm_where_it_pays(monkeypatch):
    """A small launch never (``pays`` is false); one ``pays`` names (forced here), tree or causal, runs "gemm"."""
    called = []
    monkeypatch.setattr(mg, "gemm_attention", lambda *a, **k: called.append(1))
    q, cache = np.ones((2, 1, 4), np.float32), np.ones((3, 4), np.float32)
    paths, depths = kt.ancestor_paths(np.array([-1, 0]))
    tv.tree_attention(q, cache, 1, paths, depths, 1.0, 3)
    mla.mla_attention(q, cache, 1, 1.0, 3)
    assert called == []
    monkeypatch.setattr(mg, "pays", lambda *a, **k: True)
    tv.tree_attention(q, cache, 1, paths, depths, 1.0, 3)
    mla.mla_attention(q, cache, 1, 1.0, 3)
    mla.mla_attention(q, cache, 1, 1.0, 3, splits=2)                     # forced splits: the caller's variant
    assert called == [1, 1]


def test_no_query_rows_is_a_no_op():
    q, cache = np.zeros((0, 2, 4), np.float32), np.ones((3, 4), np.float32)
    out = tv.tree_attention(q, cache, 1, np.zeros((0, 1), np.int32), np.zeros(0, np.int32), 1.0, 3, variant="gemm")
    assert out.shape == (0, 2, 3)


# ------------------------------------------------------------------------------------------------ GPU
@pytest.mark.gpu
@pytest.mark.parametrize("start", [512, 2048])
def test_gpu_chunked_equals_whole_and_auto_runs_gemm_where_it_pays(start):
    """At Kimi's width: a 129-node x 64-head verify over 512 or 2048 committed rows (8256 query rows: ``pays``;
    three copies of P, then two) - variant=None is bit for bit "gemm", row chunks change nothing (the same GEMMs row
    by row), and both hold 1e-4 of float64."""
    rng = np.random.default_rng(5)
    n, N = 128, 64
    parents = np.concatenate([[-1], [rng.integers(max(0, j - 8), j) for j in range(1, n + 1)]])
    paths, depths = kt.ancestor_paths(parents)
    q = rng.standard_normal((n + 1, N, 576)).astype(np.float32)
    cache = rng.standard_normal((start + n + 1, 576)).astype(np.float32)
    assert mg.pays((n + 1) * N, start + n + 1, False)
    assert mg.p_copies(mg.padded_keys(start + n + 1)) == (3 if start == 512 else 2)
    whole = H(tv.tree_attention(q, cache, start, paths, depths, 0.13, 512, variant="gemm"))
    auto = H(tv.tree_attention(q, cache, start, paths, depths, 0.13, 512, out=poisoned((n + 1, N, 512))))
    chunked = H(tv.tree_attention(q, cache, start, paths, depths, 0.13, 512, splits=5, variant="gemm"))
    np.testing.assert_array_equal(auto, whole)
    np.testing.assert_array_equal(chunked, whole)
    np.testing.assert_allclose(whole, tv.tree_attention_ref(q, cache, start, parents, 0.13, 512), **TOL)
