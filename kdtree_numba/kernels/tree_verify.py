"""Tree-verify attention: absorbed MLA for the 1 + n tree tokens of a DDTree round, with an ancestor-only mask.

Tree token i (the root is 0) sits at rope position ``start + depth[i]`` and attends to
    every committed cache row 0 .. start - 1,  plus  the tree rows of its ancestors and itself,
i.e. score/softmax/value exactly as in ``mla_attention.py`` but over the key list
    [0, 1, .., start - 1,  start + path[i, 0], start + path[i, 1], .., start + path[i, depth[i]]]
where ``path[i, d]`` is i's ancestor at depth d (path[i, 0] = 0 the root, path[i, depth[i]] = i; on the host
``tree.ancestor_paths`` / ``Tree.paths``, on the device the tree build writes it). The tree block's latent rows
are written into the cache after the committed ones before this runs (the model does it with
``LatentCache.write``), so the "mask" is never materialised: no (n+1) x (n+1) matrix and no dense float mask
over the context - each node reads at most L + 1 tree rows, the ones it may see.

Mapping: the same kernel as causal MLA (``mla_attention._attention_kernel`` in tree mode): grid (tree token, head
group, key split), a block streams its token's key list through shared memory with an online softmax. Sharing the
kernel means prefill, decode and verify run one attention code path, tested three ways.
Shapes: q [n+1, N, D] float32, cache [C, D] float32, paths [n+1, L+1] int32, depths [n+1] int32
-> out [n+1, N, Lkv] float32.
Example: start 2, parents [-1, 0, 0, 1]: node 3 (depth 2) sees rows 0, 1 (committed), 2 (root), 3 (node 1), 5
(itself); node 2 sees rows 0, 1, 2, 4.
"""
from __future__ import annotations

import numpy as np

from .. import backend
from . import _checks
from .mla_attention import launch_attention, masked_attention_fast, masked_attention_ref


def tree_attention_ref(q, cache, start: int, parents, scale: float, lkv: int):
    """The spec: every tree token attends to the committed rows and to its ancestors-or-self (explicit mask)."""
    parents = np.asarray(parents)
    n1 = parents.shape[0]
    tree = np.eye(n1, dtype=bool)                          # tree[i, j]: tree token i may see tree token j
    for i in range(1, n1):
        tree[i] |= tree[parents[i]]
    visible = np.concatenate([np.ones((n1, start), bool), tree], axis=1)          # [n+1, start+n+1]
    return masked_attention_ref(q, np.asarray(cache)[:start + n1], visible, scale, lkv)


def tree_attention(q, cache, start: int, paths, depths, scale: float, lkv: int, max_depth: int | None = None,
                   out=None, splits: int | None = None):
    """Attention of the tree tokens ``q [n+1, N, D]`` over ``cache [C, D]``: committed rows ``0 .. start - 1`` and
    each token's ancestors-or-self among the tree rows ``start .. start + n``."""
    q = _checks.array(q, "q", dtype=np.float32, ndim=3)
    n1, N, D = q.shape
    cache = _checks.array(cache, "cache", dtype=np.float32, ndim=2, shape=(None, D))
    paths = _checks.array(paths, "paths", dtype=np.int32, ndim=2, shape=(n1, None))
    depths = _checks.array(depths, "depths", dtype=np.int32, shape=(n1,))
    start = _checks.integer(start, "start", lo=0)
    lkv = _checks.integer(lkv, "lkv", lo=1, hi=D)
    scale = _checks.real(scale, "scale", lo=0.0, lo_open=True)
    if start + n1 > cache.shape[0]:
        raise ValueError(f"start: {start} + {n1} tree rows exceed the cache's {cache.shape[0]} rows")
    if max_depth is None:
        max_depth = paths.shape[1] - 1
    out = _checks.out_array(out, "out", (n1, N, lkv), np.float32)
    if backend.name == "numpy":
        visible = np.zeros((n1, start + n1), bool)                                 # [n+1, start+n+1]
        visible[:, :start] = True
        for d in range(paths.shape[1]):                                            # each node's path rows
            rows = np.flatnonzero(np.asarray(depths) >= d)
            visible[rows, start + np.asarray(paths)[rows, d]] = True
        out[...] = masked_attention_fast(q, cache[:start + n1], visible, scale, lkv)
        return out
    return launch_attention(q, cache, start, scale, lkv, out, paths=paths, depths=depths,
                            max_keys=start + max_depth + 1, splits=splits)
