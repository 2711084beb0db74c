"""MoE routing, DeepSeek-V3 "noaux_tc", and the per-expert grouping of tokens that MoE execution uses.

Routing, per token (fp32):
    s      = sigmoid(router_logits)                  weights come from s (unbiased)
    choice = s + e_score_correction_bias             used ONLY to choose experts
    group score = sum of the top-2 ``choice`` values of each of n_group groups; keep the topk_group best groups;
    experts of dropped groups get -inf; choose top_k experts by ``choice``
    w = s[chosen];  if norm_topk_prob: w /= (sum(w) + 1e-20);  w *= routed_scaling_factor
Equal values: the lower expert (group) index wins, in the reference and the kernel alike. Experts come out in
descending ``choice`` order.

Mapping (routing): one block per token; threads stride over the experts to fill shared ``s``/``choice``; one thread
per group sums its top-2; thread 0 keeps the best groups; then ``top_k`` rounds of a block-wide arg-max reduction
(primitives.smem_argmax: value, lower index on ties), each removing its winner.
Shapes: router_logits [T, E] float32, bias [E] float32 -> idx [T, k] int32, weights [T, k] float32.
Example: logits [[0, 2, -1, 1]], bias 0, 1 group, top-2, norm, scale 1 -> idx [[1, 3]], weights [[0.5227, 0.4773]]

Grouping: ``group_by_expert(idx, E)`` sorts the T*k assignments (a = t*k + j) by expert, stably: ``counts[e]``,
``offsets`` (exclusive prefix, [E+1]), ``order`` (assignment ids, expert-major) and ``slot`` (its inverse: where
assignment a sits in ``order``). Execution gathers x[order // k] (``gather_rows``), runs each expert's GEMMs on its
contiguous slice and ``combine`` adds the weighted rows back per token in a fixed order (no atomics: deterministic).
Faster variant ``_route_warp_kernel`` (used on a real GPU): one *warp* per token, four tokens per block. Lane l
owns experts l, l + 32, ...; each of the k rounds is a lane-local scan plus a 5-step ``shfl_xor`` arg-max
(primitives.warp_argmax), with no block barrier, and only the owning lane ever touches an expert's slot (the
taken mark needs no sync). The block version took 269 us for Kimi's 4096 x 384 top-8 on the H200 (8 rounds x 8
barriers per token); see docs/PERFORMANCE.md for the warp version. The simulator has no warp shuffles, so it
runs the block version; the GPU tests check the warp version against the same reference.

Gathering: ``gather_rows(x, order, k)`` = x[order // k] [T*k, H], expert-major: one launch, grid (assignment, column
chunk of the block's threads), each thread copies one float. (Until 2026-12-06 the model ran CuPy's ``order // k``
and ``take``: two launches a MoE layer.)

Mapping (grouping): one launch, one block per expert (``_group_kernel``): e's offset = the number of assignments
of lower experts (a block reduction, primitives.smem_sum; until 2026-12-05 a count launch came first and the
offset summed its counts), then the ordered write by a block-wide prefix scan (primitives.smem_prefix_sum) over
chunks of blockDim assignments - blockDim is the least power of two >= T*k up to 256, so a tree verify's 66
assignments (33 rows, top-2) are one chunk, not two.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, int64

from .. import backend
from . import _checks, moe_grouped_gemm
from .primitives import argmax_beats, smem_argmax, smem_prefix_sum, smem_sum, warp_argmax, warp_bcast

MAX_EXPERTS = 1024
MAX_GROUPS = 64
MAX_THREADS = 256


# ------------------------------------------------------------------------------------------------ references
def route_ref(router_logits, bias, top_k: int, n_group: int, topk_group: int, norm_topk_prob: bool,
              routed_scaling_factor: float):
    """noaux_tc routing in plain NumPy: returns (idx [T, k] int32, weights [T, k] float32)."""
    logits = np.asarray(router_logits, np.float32)
    T, E = logits.shape
    with np.errstate(over="ignore"):
        s = (np.float32(1.0) / (np.float32(1.0) + np.exp(-logits))).astype(np.float32)   # [T, E]
    choice = s + np.asarray(bias, np.float32)[None, :]                                    # [T, E]
    gsize = E // n_group
    if topk_group < n_group:
        grouped = np.sort(choice.reshape(T, n_group, gsize), axis=-1)                      # [T, G, E/G] ascending
        gscore = grouped[..., -1] + grouped[..., -2]                                       # [T, G]
        keep = np.argsort(-gscore, axis=-1, kind="stable")[:, :topk_group]                 # [T, topk_group]
        mask = np.zeros((T, n_group), bool)
        np.put_along_axis(mask, keep, True, axis=-1)
        choice = np.where(np.repeat(mask, gsize, axis=-1), choice, np.float32(-np.inf))
    idx = np.argsort(-choice, axis=-1, kind="stable")[:, :top_k].astype(np.int32)         # [T, k]
    w = np.take_along_axis(s, idx, axis=-1)                                                # [T, k]
    if norm_topk_prob:
        w = w / (w.sum(axis=-1, keepdims=True, dtype=np.float32) + np.float32(1e-20))
    return idx, (w * np.float32(routed_scaling_factor)).astype(np.float32)


def group_by_expert_ref(idx, n_experts: int):
    """Stable counting sort of the assignments by expert: (counts [E], offsets [E+1], order [T*k], slot [T*k])."""
    flat = np.asarray(idx).reshape(-1)
    counts = np.bincount(flat, minlength=n_experts).astype(np.int32)
    offsets = np.zeros(n_experts + 1, np.int32)
    offsets[1:] = np.cumsum(counts)
    order = np.argsort(flat, kind="stable").astype(np.int32)
    slot = np.empty_like(order)
    slot[order] = np.arange(order.size, dtype=np.int32)
    return counts, offsets, order, slot


def combine_ref(expert_out, weights, slot, out=None):
    """out[t] (+)= sum_j weights[t, j] * expert_out[slot[t*k + j]], j in order 0..k-1 (adds onto ``out``)."""
    T, k = weights.shape
    rows = np.asarray(expert_out)[np.asarray(slot).reshape(T, k)]      # [T, k, H]
    acc = np.zeros((T, rows.shape[-1]), np.float32) if out is None else out
    for j in range(k):
        acc += weights[:, j:j + 1] * rows[:, j]
    return acc


# ------------------------------------------------------------------------------------------------ kernels
@cuda.jit
def _route_kernel(logits, bias, top_k, n_group, topk_group, norm, scale, idx_out, w_out):
    t = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    E = logits.shape[1]
    s = cuda.shared.array(MAX_EXPERTS, float32)
    choice = cuda.shared.array(MAX_EXPERTS, float32)
    gscore = cuda.shared.array(MAX_GROUPS, float32)
    keep = cuda.shared.array(MAX_GROUPS, int32)
    red_v = cuda.shared.array(MAX_THREADS, float32)
    red_i = cuda.shared.array(MAX_THREADS, int32)
    neg_inf = float32(-math.inf)

    for e in range(tid, E, nthreads):
        sig = float32(1.0) / (float32(1.0) + float32(math.exp(-logits[t, e])))
        s[e] = sig
        choice[e] = sig + bias[e]
    cuda.syncthreads()

    if topk_group < n_group:
        gsize = E // n_group
        for g in range(tid, n_group, nthreads):          # one thread per group: sum of its top-2 choices
            m1 = neg_inf
            m2 = neg_inf
            for e in range(g * gsize, (g + 1) * gsize):
                v = choice[e]
                if v > m1:
                    m2 = m1
                    m1 = v
                elif v > m2:
                    m2 = v
            gscore[g] = m1 + m2
            keep[g] = 0
        cuda.syncthreads()
        if tid == 0:                                      # keep the topk_group best groups (lower index on ties)
            for _ in range(topk_group):
                best_g = -1
                best_v = neg_inf
                for g in range(n_group):
                    if keep[g] == 0 and (best_g < 0 or argmax_beats(gscore[g], g, best_v, best_g)):
                        best_v = gscore[g]
                        best_g = g
                keep[best_g] = 1
        cuda.syncthreads()
        for e in range(tid, E, nthreads):
            if keep[e // gsize] == 0:
                choice[e] = neg_inf
        cuda.syncthreads()

    wsum = float32(0.0)
    for k in range(top_k):                               # k rounds of a block-wide arg-max
        best_v = neg_inf
        best_i = int32(E)
        for e in range(tid, E, nthreads):
            v = choice[e]
            if v == v and argmax_beats(v, e, best_v, best_i):   # v == v skips a taken (NaN) slot
                best_v = v
                best_i = e
        win = smem_argmax(best_v, best_i, red_v, red_i)[1]
        if tid == 0:
            e = win
            if e >= E:                                    # only NaN scores left: NaN weights propagate
                e = 0
            idx_out[t, k] = e
            w_out[t, k] = s[e]
            wsum += s[e]
            choice[e] = float32(math.nan)                # taken
        cuda.syncthreads()                                # (and red_v / red_i free for the next round)

    if tid == 0:
        if norm:
            denom = wsum + float32(1e-20)
            for k in range(top_k):
                w_out[t, k] = w_out[t, k] / denom * scale
        else:
            for k in range(top_k):
                w_out[t, k] = w_out[t, k] * scale


WARPS = 4            # tokens per block in the warp variant


@cuda.jit
def _route_warp_kernel(logits, bias, top_k, n_group, topk_group, norm, scale, idx_out, w_out):
    lane = cuda.threadIdx.x % 32
    wid = cuda.threadIdx.x // 32
    t = cuda.blockIdx.x * WARPS + wid
    T = logits.shape[0]
    E = logits.shape[1]
    s = cuda.shared.array((WARPS, MAX_EXPERTS), float32)
    choice = cuda.shared.array((WARPS, MAX_EXPERTS), float32)
    gscore = cuda.shared.array((WARPS, MAX_GROUPS), float32)
    keep = cuda.shared.array((WARPS, MAX_GROUPS), int32)
    if t >= T:                                           # the whole warp leaves together
        return
    full = 0xFFFFFFFF
    neg_inf = float32(-math.inf)
    for e in range(lane, E, 32):
        sig = float32(1.0) / (float32(1.0) + float32(math.exp(-logits[t, e])))
        s[wid, e] = sig
        choice[wid, e] = sig + bias[e]
    if topk_group < n_group:
        cuda.syncwarp(full)
        gsize = E // n_group
        for g in range(lane, n_group, 32):
            m1 = neg_inf
            m2 = neg_inf
            for e in range(g * gsize, (g + 1) * gsize):
                v = choice[wid, e]
                if v > m1:
                    m2 = m1
                    m1 = v
                elif v > m2:
                    m2 = v
            gscore[wid, g] = m1 + m2
            keep[wid, g] = 0
        cuda.syncwarp(full)
        if lane == 0:
            for _ in range(topk_group):
                best_g = -1
                best_v = neg_inf
                for g in range(n_group):
                    if keep[wid, g] == 0 and (best_g < 0 or argmax_beats(gscore[wid, g], g, best_v, best_g)):
                        best_v = gscore[wid, g]
                        best_g = g
                keep[wid, best_g] = 1
        cuda.syncwarp(full)
        for e in range(lane, E, 32):
            if keep[wid, e // gsize] == 0:
                choice[wid, e] = neg_inf
        cuda.syncwarp(full)
    wsum = float32(0.0)
    for k in range(top_k):
        best_v = neg_inf
        best_i = int32(E)
        for e in range(lane, E, 32):                     # lane-local: only this lane's experts
            v = choice[wid, e]
            if v == v and argmax_beats(v, e, best_v, best_i):
                best_v = v
                best_i = e
        # the warp's winner, in every lane (no simulator scratch: this kernel runs on a GPU only)
        best_i = warp_argmax(best_v, best_i, None, None)[1]
        e = best_i if best_i < E else 0
        if lane == e % 32:
            choice[wid, e] = float32(math.nan)           # taken (its owner lane is the only reader)
            idx_out[t, k] = e
            w_out[t, k] = s[wid, e]
        wsum += warp_bcast(s[wid, e] if lane == e % 32 else float32(0.0), e % 32, None)
    cuda.syncwarp(full)
    if lane < top_k:
        w = w_out[t, lane]
        w_out[t, lane] = (w / (wsum + float32(1e-20)) if norm else w) * scale


@cuda.jit
def _group_kernel(flat, counts, offsets, order, slot, tile_rows, tiles):
    """Block e of E: e's offset = the number of assignments of a lower expert (one pass over ``flat`` and a block
    reduction, primitives.smem_sum: no count launch and no scan of counts), then e's assignments, in index order,
    to order[offset ..] and their positions to ``slot`` (a block-wide prefix scan, primitives.smem_prefix_sum, over
    chunks of blockDim assignments: one chunk while T*k <= blockDim), and counts[e] / offsets[e] (offsets[E] too,
    by the last block) from where the scan ended. With ``tile_rows`` > 0 also the grouped GEMM's tile table:
    tiles[e] = sum over e' < e of ceil(count[e'] / tile_rows), from a shared histogram of the lower experts filled
    in the same pass, reduced in the same smem_sum (the two sums packed into one int64: count + tiles << 32).
    Example: flat [2, 0, 2, 1], E 3: block 2 counts 2 assignments below it (offset 2) and writes order[2:4] =
    [0, 2], slot[0] = 2, slot[2] = 3, counts[2] = 2; with tile_rows 1, tiles[2] = 2 and tiles[3] = 4."""
    e = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    scan = cuda.shared.array(MAX_THREADS, int32)
    red = cuda.shared.array(MAX_THREADS, int64)
    hist = cuda.shared.array(MAX_EXPERTS, int32)        # assignments of each lower expert (tile_rows > 0)
    tiled = tile_rows > 0                               # the same for the whole block (barriers below)
    if tiled:
        for i in range(tid, e, nthreads):
            hist[i] = 0
        cuda.syncthreads()
    n = flat.shape[0]
    c = 0
    for a in range(tid, n, nthreads):
        f = flat[a]
        if f < e:
            c += 1
            if tiled:
                cuda.atomic.add(hist, f, 1)
    t = 0
    if tiled:
        cuda.syncthreads()                                # the histogram is complete
        for i in range(tid, e, nthreads):
            t += (hist[i] + tile_rows - 1) // tile_rows
    both = smem_sum(int64(c) + (int64(t) << 32), red)
    first = int32(both & 0xFFFFFFFF)
    t_first = int32(both >> 32)
    base = first
    for start in range(0, n, nthreads):
        a = start + tid
        flag = 1 if a < n and flat[a] == e else 0
        before, total = smem_prefix_sum(flag, scan)      # e's assignments in the chunk: before a, in all
        if flag:
            pos = base + before
            order[pos] = a
            slot[a] = pos
        base += total
        cuda.syncthreads()                                # everyone has read scan before the next chunk
    if tid == 0:
        counts[e] = base - first
        offsets[e] = first
        if tiled:
            tiles[e] = t_first
        if e == cuda.gridDim.x - 1:
            offsets[e + 1] = base
            if tiled:
                tiles[e + 1] = t_first + (base - first + tile_rows - 1) // tile_rows


@cuda.jit
def _gather_kernel(x, order, k, out):
    """Block (r, c): out[r, c B + t] = x[order[r] // k, c B + t] for thread t of B (columns past H: none)."""
    r = cuda.blockIdx.x
    col = cuda.blockIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    if col < out.shape[1]:
        out[r, col] = x[order[r] // k, col]


@cuda.jit
def _combine_kernel(expert_out, weights, slot, accumulate, out):
    k = weights.shape[1]
    H = out.shape[1]
    idx = cuda.grid(1)
    if idx >= out.shape[0] * H:
        return
    t = idx // H
    h = idx % H
    acc = out[t, h] if accumulate else float32(0.0)
    for j in range(k):
        acc += weights[t, j] * expert_out[slot[t * k + j], h]
    out[t, h] = acc


# ------------------------------------------------------------------------------------------------ launchers
def _pow2_at_most(n: int, cap: int) -> int:
    p = 1
    while p * 2 <= min(n, cap):
        p *= 2
    return p


def _pow2_at_least(n: int, cap: int) -> int:
    """The least power of two >= n, at most ``cap`` (a power of two). Example: _pow2_at_least(66, 256) = 128."""
    p = 1
    while p < min(n, cap):
        p *= 2
    return p


def route(router_logits, bias, top_k: int, n_group: int = 1, topk_group: int = 1, norm_topk_prob: bool = True,
          routed_scaling_factor: float = 1.0):
    """noaux_tc routing; returns (idx [T, k] int32, weights [T, k] float32) on the current backend."""
    logits = _checks.array(router_logits, "router_logits", dtype=np.float32, ndim=2, strided=True)
    T, E = logits.shape
    bias = _checks.array(bias, "bias", dtype=np.float32, shape=(E,))
    n_group = _checks.integer(n_group, "n_group", lo=1, hi=min(E, MAX_GROUPS))
    if E % n_group:
        raise ValueError(f"n_group: {n_group} does not divide the {E} experts")
    if topk_group < n_group and E // n_group < 2:
        raise ValueError(f"n_group: group-limited routing needs >= 2 experts per group, got {E // n_group}")
    topk_group = _checks.integer(topk_group, "topk_group", lo=1, hi=n_group)
    top_k = _checks.integer(top_k, "top_k", lo=1, hi=topk_group * (E // n_group))
    scale = _checks.real(routed_scaling_factor, "routed_scaling_factor")
    if E > MAX_EXPERTS:
        raise ValueError(f"router_logits: at most {MAX_EXPERTS} experts supported, got {E}")
    if backend.name == "numpy":
        idx, w = route_ref(logits, bias, top_k, n_group, topk_group, norm_topk_prob, scale)
        return idx, w
    idx = backend.empty((T, top_k), np.int32)
    w = backend.empty((T, top_k), np.float32)
    if T and backend.name == "cuda" and top_k <= 32:
        backend.launch(_route_warp_kernel, -(-T // WARPS), 32 * WARPS, logits, bias, top_k, n_group, topk_group,
                       bool(norm_topk_prob), np.float32(scale), idx, w)
    elif T:
        threads = _pow2_at_most(E, backend.block_size(128, 8))
        backend.launch(_route_kernel, T, threads, logits, bias, top_k, n_group, topk_group, bool(norm_topk_prob),
                       np.float32(scale), idx, w)
    return idx, w


def group_by_expert(idx, n_experts: int):
    """Stable grouping of the assignments by expert: (counts [E], offsets [E+1], order [T*k], slot [T*k]), int32."""
    return _group(idx, n_experts, 0)[:4]


def group_by_expert_tiled(idx, n_experts: int, tile_rows: int):
    """``group_by_expert`` and, from the same launch, the grouped GEMM's tile table: (counts, offsets, order, slot,
    tiles [E+1]) with tiles = ``moe_grouped_gemm.tile_table_ref(offsets, tile_rows)`` (expert e's row tiles of
    ``tile_rows`` rows are tiles[e] .. tiles[e+1] - 1) - a MoE layer's tile-table launch saved. Example: idx
    [[2], [0], [2], [1]], E 3, tile_rows 1 -> offsets [0, 1, 2, 4], tiles [0, 1, 2, 4]."""
    return _group(idx, n_experts, _checks.integer(tile_rows, "tile_rows", lo=1))


def _group(idx, n_experts: int, tile_rows: int):
    idx = _checks.array(idx, "idx", dtype=np.int32, ndim=2)
    n_experts = _checks.integer(n_experts, "n_experts", lo=1, hi=MAX_EXPERTS)
    if backend.name == "numpy":
        if idx.size and (idx.min() < 0 or idx.max() >= n_experts):
            raise ValueError(f"idx: expert ids must lie in [0, {n_experts}), got [{idx.min()}, {idx.max()}]")
        got = group_by_expert_ref(idx, n_experts)
        return got + (moe_grouped_gemm.tile_table_ref(got[1], tile_rows) if tile_rows else None,)
    flat = idx.reshape(-1)
    order = backend.empty((flat.size,), np.int32)
    slot = backend.empty((flat.size,), np.int32)
    if flat.size == 0:
        return (backend.zeros((n_experts,), np.int32), backend.zeros((n_experts + 1,), np.int32), order, slot,
                backend.zeros((n_experts + 1,), np.int32) if tile_rows else None)
    tiles = backend.empty((n_experts + 1,) if tile_rows else (1,), np.int32)     # every entry written (tiled)
    counts = backend.empty((n_experts,), np.int32)
    offsets = backend.empty((n_experts + 1,), np.int32)
    threads = _pow2_at_least(flat.size, backend.block_size(MAX_THREADS, 8))          # one scan chunk if it fits
    backend.launch(_group_kernel, n_experts, threads, flat, counts, offsets, order, slot, tile_rows, tiles)
    return counts, offsets, order, slot, tiles if tile_rows else None


def gather_rows_ref(x, order, k: int):
    """x[order // k]: assignment a = t k + j reads token t's row."""
    return np.asarray(x)[np.asarray(order) // k]


def gather_rows(x, order, k: int, out=None):
    """The rows of the experts' input, expert-major: out[r] = x[order[r] // k] (``order`` from ``group_by_expert``,
    k the experts a token chose). x [T, H] float32 (rows may be strided), order [T*k] int32 (each entry < T*k),
    out [T*k, H] (allocated when None). Returns ``out``. Example: x rows [a, b], k 2, order [1, 3, 0, 2] -> rows
    [a, b, a, b] (token 0's second assignment first)."""
    x = _checks.array(x, "x", dtype=np.float32, ndim=2, strided=True)
    k = _checks.integer(k, "k", lo=1)
    T, Hd = x.shape
    order = _checks.array(order, "order", dtype=np.int32, shape=(T * k,))
    out = _checks.out_array(out, "out", (T * k, Hd), np.float32)
    if backend.name == "numpy":
        out[...] = gather_rows_ref(x, order, k)
    elif T and Hd:
        threads = backend.block_size(256, 32)
        backend.launch(_gather_kernel, (T * k, -(-Hd // threads)), threads, x, order, k, out)
    return out


def combine(expert_out, weights, slot, out=None):
    """out[t] = sum_j weights[t, j] * expert_out[slot[t*k + j]]; added onto ``out`` when it is given."""
    weights = _checks.array(weights, "weights", dtype=np.float32, ndim=2)
    T, k = weights.shape
    expert_out = _checks.array(expert_out, "expert_out", dtype=np.float32, ndim=2, shape=(T * k, None))
    slot = _checks.array(slot, "slot", dtype=np.int32, shape=(T * k,))
    H = expert_out.shape[1]
    accumulate = out is not None
    out = _checks.out_array(out, "out", (T, H), np.float32)
    if backend.name == "numpy":
        if not accumulate:
            out[...] = 0.0
        return combine_ref(expert_out, weights, slot, out)
    n = T * H
    if n:
        threads = backend.block_size(256, 32)
        backend.launch(_combine_kernel, (n + threads - 1) // threads, threads, expert_out, weights, slot,
                       accumulate, out)
    return out
