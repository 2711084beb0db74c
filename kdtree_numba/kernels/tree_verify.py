"""Tree-verify attention: absorbed MLA for the 1 + n tree tokens of a DDTree round, with an ancestor-only mask.

Tree token i (the root is 0) sits at rope position ``start + depth[i]`` and attends to
    every committed cache row 0 .. start - 1,  plus  the tree rows of its ancestors and itself,
i.e. score/softmax/value exactly as in ``mla_attention.py`` but over the key list
    [0, 1, .., start - 1,  start + path[i, 0], start + path[i, 1], .., start + path[i, depth[i]]]
where ``path[i, d]`` is i's ancestor at depth d (path[i, 0] = 0 the root, path[i, depth[i]] = i; on the host
``tree.ancestor_paths`` / ``Tree.paths``, on the device the tree build writes it). The tree block's latent rows
are written into the cache after the committed ones before this runs (the model does it with
``mla_latent.write_latent``), so the "mask" is never materialised: no (n+1) x (n+1) matrix and no dense float mask
over the context - each node reads at most L + 1 tree rows, the ones it may see. The test "tree row of node j,
at depth d, is visible to token i" is one lookup: ``depth[i] >= d and path[i, d] == j``.

This module owns the tree-mode kernels; ``mla_attention.py`` holds the machinery they share with causal MLA (its
``_v1_*`` / ``_v2_*`` device functions, launchers, split combine) and the variants' description.
  v1 ``_tree_attention_kernel``: grid (tree token, head group of 4, key split); a block streams its token's key
     list above through shared memory in tiles of 8 rows (``_v1_tile``: scores, online softmax, accumulators).
  v2 ``_tree_attention_v2_kernel``: a block takes 32 (token, head) query rows - tree tokens t_first .. t_last -
     and streams, in tiles of 16 keys on tensor cores, the committed rows (every token sees them: the bulk of the
     work, loaded once for all 32 rows) and then the tile's *path slots*: slot (u, d) for each token u of the tile
     and depth d = 0 .. L is u's ancestor at depth d, cache row ``start + path[u, d]``. A slot is skipped (its
     key row left zero and masked) when d > depth[u], or when an earlier token of the tile lists the same node
     (``depth[u'] >= d and path[u', d] == node``), so each tree row enters the tile once; inside the tile, row
     (i, h) sees the tree key of node j at depth d iff ``depth[i] >= d and path[i, d] == j`` (the mask is
     computed per (query row, key) from the paths, never stored). With N >= 32 heads a tile holds one token:
     its list is exactly its own path; with N = 16 two tokens share 2 (L + 1) slots.
  v3 ``_tree_attention_v3_kernel``: v2 with key tiles of 32 rows (the same source, ``_tiled_tree_kernel(32, ..)``;
     see mla_attention's v3). Every tree cell of bench_verify ran as fast or faster than v2 (H200: 4096 / 256 /
     64 5.34 -> 4.97 ms; the default pair's 65-node verify 0.036 -> 0.029) - except below 16 heads
     (``tree_variant``): the default pair's 8-head verify, measured again in the round, runs faster on v2.
  v4 ``_tree_attention_v4_kernel``: v3 with every warp on both m16 blocks (mla_attention's v4: a key or value
     fragment split once for both blocks' MMAs; ``_tiled_tree_kernel(.., wide=True)``). ``variant="v4"`` only:
     on the H200 (bench_verify ``--fast v4``, 2026-12-05) within -1 % .. +5 % of v3.
  v5 - v8 ``_tree_attention_v5_kernel`` ..: mla_attention's v5 - v8 over the tree's key list (ldmatrix score
     fragments; v6 / v7 with v4's P V, v7 also v4's scores; v8 v7 with the key tile by the copy engine). **v5 is
     the default on a GPU** (16+ heads): v3's tiles and shared memory, 0.3-7 % faster than v3 on every tree cell
     (H200, 2026-12-05, bench_verify: 512 / 16 / 16 0.044 -> 0.043 ms, 4096 / 256 / 64 3.91 -> 3.82, 32768 /
     256 / 64 30.4 -> 30.3). v8 leads on the largest cells (28.5 ms at 32768 / 256 / 64) and trails on the
     small ones (0.049 at 512 / 16 / 16); v6 and v7 sit between.
  gemm: kernels/mla_gemm_attention.py with the tree mask - the scores of every (token, head) row over every key
     as one cuBLAS 3xTF32 GEMM, the token's path read by its softmax kernel, P V as GEMMs; ``variant=None``
     runs it for verifies of >= 1024 (token, head) rows with a host start (``mla_gemm_attention.pays``).
Shapes: q [n+1, N, D] float32, cache [C, D] float32, paths [n+1, >= L+1] int32, depths [n+1] int32
-> out [n+1, N, Lkv] float32.
Example: start 2, parents [-1, 0, 0, 1]: node 3 (depth 2) sees rows 0, 1 (committed), 2 (root), 3 (node 1), 5
(itself); node 2 sees rows 0, 1, 2, 4. In v2 with N = 16 heads, tile 0 = tokens 0, 1 and its slots (width L+1 = 3)
are (0, 0) -> row 2, (1, 0) the root again (skipped), (1, 1) -> row 3; tile 1 = tokens 2, 3: (2, 0) -> row 2,
(2, 1) -> row 4, (3, 1) -> row 3, (3, 2) -> row 5; row 4 is masked for token 3, rows 3 and 5 for token 2.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32, int64

from .. import backend
from . import _checks, mla_gemm_attention
from ._intrinsics import copy_async_wait
from .primitives import GROUP_BUF
from ._intrinsics import view2d
from .mla_attention import (ACC, BK, HG, KPARTS, KPARTS4, KT, KT3, MAX_D, MAX_LKV, MAX_SUBS, MB, MT, PAIRS, Q_STRIDE2,
                            ROW, ROW_T, SCRATCH_SHAPE, SP_STRIDE3, STAGE_MIN_KEYS, TILE_ALIGN,
                            _named_kernel, _v1_begin, _v1_end, _v1_tile, _v2_accumulate, _v2_begin, _v2_end,
                            _v2_load_keys, _v2_row, _v2_scores, _v2_softmax, _v2_stage_q, _v2_warps, _v4_accumulate,
                            _v4_end, _v4_scores, _v5_scores, _v7_scores, bulk_begin, bulk_load_keys, check_qkv,
                            check_splits,
                            check_tiled_fits, check_variant, launch_v1, launch_v2, masked_attention_fast,
                            masked_attention_ref, past_the_list, split_range, stage_bytes)


def tree_attention_ref(q, cache, start: int, parents, scale: float, lkv: int):
    """The spec: every tree token attends to the committed rows and to its ancestors-or-self (explicit mask)."""
    parents = np.asarray(parents)
    n1 = parents.shape[0]
    tree = np.eye(n1, dtype=bool)                          # tree[i, j]: tree token i may see tree token j
    for i in range(1, n1):
        tree[i] |= tree[parents[i]]
    visible = np.concatenate([np.ones((n1, start), bool), tree], axis=1)          # [n+1, start+n+1]
    return masked_attention_ref(q, np.asarray(cache)[:start + n1], visible, scale, lkv)


# ------------------------------------------------------------------------------------------------ v1
@cuda.jit
def _tree_attention_kernel(q, cache, start0, start_dev, scale, split_len, direct, out, o_part, m_part, l_part,
                           paths, depths):
    t = cuda.blockIdx.x
    h0 = cuda.blockIdx.y * HG
    z = cuda.blockIdx.z
    tid = cuda.threadIdx.x
    hn = min(HG, q.shape[1] - h0)
    lkv = out.shape[2]

    qs = cuda.shared.array((HG, MAX_D), float32)
    ks = cuda.shared.array((BK, ROW), float32)
    sc = cuda.shared.array((HG, BK), float32)
    o = cuda.shared.array((HG, MAX_LKV), float32)
    red = cuda.shared.array((MAX_SUBS, PAIRS), float32)
    m_run = cuda.shared.array(HG, float32)
    l_run = cuda.shared.array(HG, float32)
    alpha = cuda.shared.array(HG, float32)
    rows = cuda.shared.array(BK, int32)
    start = start0 + start_dev[0]                        # the host part + the device part (graph replay)

    n_keys = start + depths[t] + 1                       # rows 0 .. start - 1, then t's root-to-t path
    k_lo = z * split_len
    k_hi = min(n_keys, k_lo + split_len)
    _v1_begin(q, t, h0, hn, scale, lkv, qs, o, m_run, l_run)
    for k0 in range(k_lo, k_hi, BK):
        nk = min(BK, k_hi - k0)
        if tid < nk:
            kk = k0 + tid
            rows[tid] = kk if kk < start else start + paths[t, kk - start]
        cuda.syncthreads()
        _v1_tile(cache, rows, nk, hn, lkv, qs, ks, sc, o, red, m_run, l_run, alpha)
    _v1_end(t, h0, hn, z, lkv, direct, o, m_run, l_run, out, o_part, m_part, l_part)


# ------------------------------------------------------------------------------------------------ v2
@cuda.jit(device=True)
def _tree_key(paths, depths, start, t_first, width, k, k_hi, j, rows, kdep, knode):
    """Key k of a v2 tile's list -> rows[j] (its cache row, -1: none), kdep[j] (-1: a committed row, every token
    sees it; else the tree depth d) and knode[j] (the tree node). Past ``start`` key k is the path slot
    (u, d) = (t_first + (k - start) // width, (k - start) % width)."""
    row = -1
    d = -1
    node = -1
    if k < k_hi:
        if k < start:
            row = k
        else:
            u = t_first + (k - start) // width
            d = (k - start) % width
            if d <= depths[u]:
                node = paths[u, d]
                row = start + node
                for u2 in range(t_first, u):               # listed already by an earlier token of the tile?
                    if depths[u2] >= d and paths[u2, d] == node:
                        row = -1
    rows[j] = row
    kdep[j] = d
    knode[j] = node


def _tiled_tree_kernel(kt, sp_stride, name, wide=False, vec=False, wide_scores=None, bulk=False):
    """The tiled tree kernel with key tiles of ``kt`` rows (v2: 16, v3 - v8: 32), partial scores at row stride
    ``sp_stride``, ``wide`` warps (v4), ``vec`` loads (v5), ``wide_scores`` (v7), ``bulk`` copies (v8) -
    compile-time constants, as ``mla_attention._tiled_kernel``'s."""
    wide_scores = wide and not vec if wide_scores is None else wide_scores   # v6: v5's scores, v4's P V
    kparts = KPARTS4 if wide_scores else KPARTS
    def kernel(q, cache, start0, start_dev, scale, n_heads, copy_w, split_len, direct, out, o_part, m_part, l_part,
               paths, depths, width, stage):
        """q [(n+1)*N, D] (rows token-major), out [(n+1)*N, Lkv], partials, ``copy_w`` and ``stage`` as
        ``mla_attention``'s tiled kernel; ``width`` path slots per token (max_depth + 1)."""
        sp = cuda.shared.array((kparts, MT, sp_stride), float32)   # partial scores; sp[0]: scores, then P
        m_run = cuda.shared.array(MT, float32)
        l_run = cuda.shared.array(MT, float32)
        alpha = cuda.shared.array(MT, float32)
        rows = cuda.shared.array(kt, int32)              # the key tile's cache rows (-1: none)
        kdep = cuda.shared.array(kt, int32)              # -1: committed row; else the tree depth of the key
        knode = cuda.shared.array(kt, int32)             # the tree node of the key
        scratch = cuda.shared.array(SCRATCH_SHAPE, float32)   # the simulator's MMA exchange (GPU: unused)
        buf = cuda.shared.array(GROUP_BUF, float32)      # the simulator's group scratch (GPU: unused)
        acc = cuda.local.array(ACC, float32)             # this thread's output accumulators (registers)
        mbar = cuda.shared.array(1, int64)               # v8: the bulk copies' mbarrier
        dyn = cuda.shared.array(0, float32, alignment=TILE_ALIGN)   # dynamic shared memory:
        ks = view2d(dyn, 0, kt, ROW_T)                   # the key tile [kt, ROW_T]
        qs = dyn[kt * ROW_T:]                            # the block's staged query rows [MT, Q_STRIDE2]
        tid = cuda.threadIdx.x
        n_rows = q.shape[0]
        D = q.shape[1]
        r0 = cuda.blockIdx.x * MT
        z = cuda.blockIdx.y
        start = start0 + start_dev[0]                    # the host part + the device part (graph replay)

        t_first = r0 // n_heads
        t_last = (min(r0 + MT, n_rows) - 1) // n_heads
        k_lo, k_hi, split_len = split_range(z, split_len, start + (t_last - t_first + 1) * width,
                                            kt)          # the list: committed rows, then the tile's path slots
        if k_lo >= k_hi and not direct:
            past_the_list(r0, n_rows, n_heads, n_heads, 0, z, m_part, l_part)
            return
        r, j0, kpt = _v2_row(kt)
        real = r0 + r < n_rows                           # this thread's query row exists (else all masked)
        i = min(r0 + r, n_rows - 1) // n_heads           # ... and is tree token i
        depth_i = depths[i]
        staged = stage and split_len >= STAGE_MIN_KEYS   # short splits read q from global memory
        if staged:
            _v2_stage_q(q, qs, r0, MT, Q_STRIDE2, n_rows, n_heads, n_heads, 0, D, copy_w)
        if tid < kt:                                     # the first tile's key table (_v2_begin's barrier)
            _tree_key(paths, depths, start, t_first, width, k_lo + tid, k_hi, tid, rows, kdep, knode)
        by_engine = bulk and copy_w == 4                 # v8: rows 16-byte aligned go by the copy engine
        if by_engine:
            bulk_begin(ks, mbar, kt)
        _v2_begin(acc, ks, m_run, l_run, D, kt)
        phase = int32(0)
        for k0 in range(k_lo, k_hi, kt):
            if by_engine:
                bulk_load_keys(cache, rows, ks, D, D, 0, mbar, phase, kt)
                phase ^= int32(1)
            else:
                _v2_load_keys(cache, rows, ks, D, copy_w, D, 0, 0, kt)
            copy_async_wait()                            # (v8: the staged query rows' copies)
            cuda.syncthreads()
            if wide_scores and vec:
                _v7_scores(q, qs, staged, ks, sp, r0, n_rows, n_heads, n_heads, 0, D, scratch, kt)
            elif wide_scores:
                _v4_scores(q, qs, staged, ks, sp, r0, n_rows, n_heads, n_heads, 0, D, scratch, kt)
            elif vec:
                _v5_scores(q, qs, staged, ks, sp, r0, n_rows, n_heads, n_heads, 0, D, scratch, kt)
            else:
                _v2_scores(q, qs, staged, ks, sp, r0, n_rows, n_heads, n_heads, 0, D, scratch, kt)
            cuda.syncthreads()
            vis = 0                                      # tree mask: a committed row is seen by every token, a
            for jj in range(kpt):                        # tree key by the tokens on whose path its node lies
                j = j0 + jj                              # (kpt: a constant on the GPU, so this unrolls)
                d = kdep[j]
                if real and rows[j] >= 0 and (d < 0 or (depth_i >= d and paths[i, d] == knode[j])):
                    vis |= 1 << jj
            _v2_softmax(sp, vis, scale, m_run, l_run, alpha, buf, kt, _v2_warps() if wide_scores else _v2_warps() // MB)
            cuda.syncthreads()
            if tid < kt:                                 # the next tile's key table: nothing reads rows, kdep or
                _tree_key(paths, depths, start, t_first, width, k0 + kt + tid, k_hi, tid, rows, kdep, knode)
            if wide:                                     # knode from here on (P V's barrier publishes them)
                _v4_accumulate(sp, ks, acc, alpha, out.shape[1], 0, scratch, kt)
            else:
                _v2_accumulate(sp, ks, acc, alpha, out.shape[1], 0, scratch, kt)
            cuda.syncthreads()
        if wide:
            _v4_end(acc, m_run, l_run, r0, n_rows, n_heads, n_heads, 0, z, direct, out, o_part, m_part, l_part)
        else:
            _v2_end(acc, m_run, l_run, r0, n_rows, n_heads, n_heads, 0, z, direct, out, o_part, m_part, l_part)
    return _named_kernel(kernel, name)


_tree_attention_v2_kernel = _tiled_tree_kernel(KT, KT, "_tree_attention_v2_kernel")
_tree_attention_v3_kernel = _tiled_tree_kernel(KT3, SP_STRIDE3, "_tree_attention_v3_kernel")
_tree_attention_v4_kernel = _tiled_tree_kernel(KT3, SP_STRIDE3, "_tree_attention_v4_kernel", wide=True)
_tree_attention_v5_kernel = _tiled_tree_kernel(KT3, SP_STRIDE3, "_tree_attention_v5_kernel", vec=True)
_tree_attention_v6_kernel = _tiled_tree_kernel(KT3, SP_STRIDE3, "_tree_attention_v6_kernel", wide=True, vec=True)
_tree_attention_v7_kernel = _tiled_tree_kernel(KT3, SP_STRIDE3, "_tree_attention_v7_kernel", wide=True, vec=True,
                                               wide_scores=True)
_tree_attention_v8_kernel = _tiled_tree_kernel(KT3, SP_STRIDE3, "_tree_attention_v8_kernel", wide=True, vec=True,
                                               wide_scores=True, bulk=True)
TREE_KERNELS = {"v2": _tree_attention_v2_kernel, "v3": _tree_attention_v3_kernel, "v4": _tree_attention_v4_kernel,
                "v5": _tree_attention_v5_kernel, "v6": _tree_attention_v6_kernel, "v7": _tree_attention_v7_kernel,
                "v8": _tree_attention_v8_kernel}


# ------------------------------------------------------------------------------------------------ launcher
V3_MIN_HEADS = 16   # variant=None: tree verifies of fewer heads run v2, not the 32-key default (``tree_variant``)


def tree_variant(default: str, heads: int, v2_staged: bool) -> str:
    """The variant ``variant=None`` runs for a tree of ``heads`` heads: ``default`` (mla_attention's
    ``default_variant()``), except v3 / v5 -> v2 below V3_MIN_HEADS heads where v2 can stage its query rows
    (``v2_staged``). Measured on the H200 (docs/PERFORMANCE.md, 2026-12-04, eighteenth session): the default
    pair's verify (8 heads: a 32-row tile holds 4 tokens and their 4 (L + 1) path slots) took 29.3 us with v2
    against 36.7 with v3 at 33 nodes, 27.9 against 30.1 at 16 (graph replays, a 512-row cache), and graph-replayed
    generation ran 0.2-6 % faster (DDTree-32 / -64 and the chain, two interleaved pairs, identical tokens); every
    bench_verify cell (16-64 heads) ran as fast or faster on v3 (and v5, the default since 2026-12-05, on every
    cell faster than v3). Example: tree_variant("v5", 8, True) -> "v2"; tree_variant("v5", 16, True) -> "v5"."""
    return "v2" if default in ("v3", "v5") and heads < V3_MIN_HEADS and v2_staged else default


def tree_attention(q, cache, start, paths, depths, scale: float, lkv: int, max_depth: int | None = None,
                   out=None, splits: int | None = None, variant: str | None = None):
    """Attention of the tree tokens ``q [n+1, N, D]`` over ``cache [C, D]``: committed rows ``0 .. start - 1`` and
    each token's ancestors-or-self among the tree rows ``start .. start + n``.

    ``start``: an int, or a device int32 [1] array read by the kernel (a round captured in a CUDA graph; nothing
    is read on the host, the grid covers ``start <= C - (n+1)``). ``paths [n+1, >= L+1]`` / ``depths [n+1]``: each
    node's root-to-node path (``tree.ancestor_paths``, or the device tree build's); ``max_depth``: L
    (default: the paths' width - 1). ``splits`` forces the key splits (tests); ``variant`` as in
    ``mla_attention`` ("v1" - "v8", "gemm" | None: ``tree_variant(default_variant(), N, ..)``, or "gemm" where
    ``mla_gemm_attention.pays``)."""
    auto = variant is None
    variant = check_variant(variant)
    q, cache, lkv, out = check_qkv(q, cache, lkv, out)
    splits = check_splits(splits)
    n1, N, D = q.shape
    if auto:                                   # v3 -> v2 below V3_MIN_HEADS heads (tree_variant)
        variant = tree_variant(variant, N, stage_bytes("v2") > 0)
    paths = _checks.array(paths, "paths", dtype=np.int32, ndim=2, shape=(n1, None))
    depths = _checks.array(depths, "depths", dtype=np.int32, shape=(n1,))
    start0, _ = _checks.device_int(start, "start")          # a device int32 [1]: read by the kernel, unchecked
    device_start = hasattr(start, "shape")
    scale = _checks.real(scale, "scale", lo=0.0, lo_open=True)
    if start0 + n1 > cache.shape[0]:
        raise ValueError(f"start: {start0} + {n1} tree rows exceed the cache's {cache.shape[0]} rows")
    max_depth = paths.shape[1] - 1 if max_depth is None else _checks.integer(max_depth, "max_depth", lo=0,
                                                                             hi=paths.shape[1] - 1)
    if backend.name == "numpy":
        start = _checks.host_int(start)
        visible = np.zeros((n1, start + n1), bool)                                 # [n+1, start+n+1]
        visible[:, :start] = True
        for d in range(paths.shape[1]):                                            # each node's path rows
            rows = np.flatnonzero(np.asarray(depths) >= d)
            visible[rows, start + np.asarray(paths)[rows, d]] = True
        out[...] = masked_attention_fast(q, cache[:start + n1], visible, scale, lkv)
        return out
    most_start = cache.shape[0] - n1 if device_start else start0
    if variant == "gemm" or (auto and splits is None and mla_gemm_attention.pays(n1 * N, start0 + n1, device_start)):
        return mla_gemm_attention.gemm_attention(q, cache, start, scale, lkv, out, splits, paths, depths)
    if variant == "v1":
        return launch_v1(_tree_attention_kernel, q, cache, start, scale, lkv, out, most_start + max_depth + 1,
                         splits, paths, depths)
    check_tiled_fits(variant)
    r0 = np.arange(0, n1 * N, MT)                                                  # each tile's first row
    tokens = int(((np.minimum(r0 + MT, n1 * N) - 1) // N - r0 // N).max()) + 1    # most tokens in a tile
    kernel = TREE_KERNELS[variant]
    return launch_v2(kernel, variant, q, cache, start, scale, lkv, out,
                     most_start + tokens * (max_depth + 1), splits, paths, depths, max_depth + 1)
