"""Absorbed MLA attention (causal) and tree-verify attention (ancestor-only) against explicit references."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels import mla_attention as mla, tree as kt, tree_verify as tv

from ..helpers import poisoned

pytestmark = pytest.mark.usefixtures("kernel_backend")
H = kd.backend.to_host


@pytest.mark.parametrize("T,N,D,lkv,start,splits", [(3, 5, 13, 9, 6, None), (1, 2, 20, 16, 11, 3),
                                                    (4, 4, 9, 5, 0, 2), (2, 1, 7, 7, 17, None)])
def test_causal_matches_reference(T, N, D, lkv, start, splits):
    rng = np.random.default_rng(T * 100 + D)
    q = rng.standard_normal((T, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + T + 3, D)).astype(np.float32)
    out = poisoned((T, N, lkv))
    mla.mla_attention(q, cache, start, 0.37, lkv, out=out, splits=splits)
    np.testing.assert_allclose(H(out), mla.mla_attention_ref(q, cache, start, 0.37, lkv), rtol=1e-5, atol=1e-5)


def test_docstring_example():
    q = np.array([[[0.0, 0.0]], [[np.log(3.0), 0.0]]], np.float32)
    cache = np.array([[1.0, 0.0], [0.0, 1.0]], np.float32)
    np.testing.assert_allclose(H(mla.mla_attention(q, cache, 0, 1.0, 1))[:, 0, 0], [1.0, 0.75], rtol=1e-6)


@pytest.mark.parametrize("parents,start,splits", [([-1, 0, 0, 1, 3, 1, 0], 5, None), ([-1], 3, None),
                                                  ([-1, 0, 1, 2, 3], 0, None), ([-1, 0, 0, 2, 2, 4], 9, 2)])
def test_tree_attention_sees_only_committed_rows_and_ancestors(parents, start, splits):
    rng = np.random.default_rng(len(parents) + start)
    n1, N, D, lkv = len(parents), 3, 11, 8
    q = rng.standard_normal((n1, N, D)).astype(np.float32)
    cache = rng.standard_normal((start + n1 + 2, D)).astype(np.float32)
    paths, depths = kt.ancestor_paths(np.array(parents))
    out = poisoned((n1, N, lkv))
    tv.tree_attention(q, cache, start, paths, depths, 0.5, lkv, out=out, splits=splits)
    want = tv.tree_attention_ref(q, cache, start, np.array(parents), 0.5, lkv)
    np.testing.assert_allclose(H(out), want, rtol=1e-5, atol=1e-5)
    # a chain is exactly causal attention
    if parents == [-1, 0, 1, 2, 3]:
        np.testing.assert_allclose(H(out), mla.mla_attention_ref(q, cache, start, 0.5, lkv), rtol=1e-5, atol=1e-5)


def test_ancestor_paths_example():
    paths, depths = kt.ancestor_paths(np.array([-1, 0, 0, 1]))
    np.testing.assert_array_equal(depths, [0, 1, 1, 2])
    np.testing.assert_array_equal(paths, [[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 1, 3]])


@pytest.mark.parametrize("call, msg", [
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((3, 4), np.float32), 2, 1.0, 3),
     "start: 2 \\+ 2 new rows exceed"),
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((9, 5), np.float32), 0, 1.0, 3),
     r"cache: expected shape \(\*, 4\)"),
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((9, 4), np.float32), 0, 0.0, 3),
     "scale: expected a number > 0"),
    (lambda: mla.mla_attention(np.zeros((2, 2, 4), np.float32), np.zeros((9, 4), np.float32), 0, 1.0, 5),
     "lkv: expected an integer <= 4"),
    (lambda: tv.tree_attention(np.zeros((2, 1, 4), np.float32), np.zeros((9, 4), np.float32), 0,
                               np.zeros((3, 2), np.int32), np.zeros(2, np.int32), 1.0, 3), r"paths: expected shape"),
])
def test_bad_input(call, msg):
    with pytest.raises(ValueError, match=msg):
        call()


@pytest.mark.parametrize("T,N,D,S,lkv", [(3, 5, 13, 11, 9), (66, 4, 40, 130, 32), (1, 2, 7, 1, 7)])
def test_numpy_backend_float32_path_matches_the_float64_reference(T, N, D, S, lkv):
    rng = np.random.default_rng(T + S)
    q = (3 * rng.standard_normal((T, N, D))).astype(np.float32)
    keys = rng.standard_normal((S, D)).astype(np.float32)
    visible = rng.random((T, S)) < 0.7
    visible[:, 0] = True                                   # every row sees something
    np.testing.assert_allclose(mla.masked_attention_fast(q, keys, visible, 0.3, lkv),
                               mla.masked_attention_ref(q, keys, visible, 0.3, lkv), rtol=1e-5, atol=1e-5)
