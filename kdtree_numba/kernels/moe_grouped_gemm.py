"""Grouped expert GEMM: every expert's rows times that expert's weight, in one launch, with no host read.

    out[offsets[e]:offsets[e+1]] = xs[offsets[e]:offsets[e+1]] @ W[e].T        for every expert e

``xs`` holds the MoE assignments already sorted expert-major (moe_routing.group_by_expert, then a gather), so the
rows of expert e are the contiguous slice offsets[e]:offsets[e+1]. ``offsets`` stays on the device: how many rows
each expert got is known only there, and reading it back to size one GEMM per expert would stall the stream once
per MoE layer. Instead (the fused-MoE design of serving engines) the grid is sized from shapes alone and every
block finds its own work on the device:

1. ``tile_table`` (one warp): expert e owns ceil(count[e] / TM) row tiles; an exclusive prefix sum gives
   ``tiles [E+1]``: expert e's row tiles are the global row tiles tiles[e] .. tiles[e+1]-1, tiles[E] in all.
2. ``grouped_linear``: the grid is an upper bound of row tiles x the column tiles of M. A row tile's block reads
   tiles[E]; past it, it exits at once. Otherwise a binary search over ``tiles`` names its expert e (the one with
   tiles[e] <= tile < tiles[e+1]; empty experts own no tile and are never found), its rows start at
   offsets[e] + (tile - tiles[e]) * TM and stop at offsets[e+1].
   Bound on the row tiles, from N and E only: sum_e ceil(c_e/TM) <= sum_e (floor(c_e/TM) + [c_e > 0])
   <= N // TM + min(E, N), and every tile holds a row, so also <= N.

Mapping (grouped GEMM): one block of THREADS threads per (row tile, column tile) of out, a TM x TN tile. The block
walks Kdim in steps of TK; each step every thread loads 2 elements of the xs tile [TM, TK] and 8 of the W[e] tile
[TN, TK] (element i*THREADS + t, row-major: consecutive threads read consecutive k, coalesced) into registers,
stores them into the shared tiles ``xa`` and ``wb`` (one padding column: the compute reads wb down a column without
bank conflicts), a barrier, then thread (tr = t // TN, tc = t % TN) accumulates out rows tr, tr + THREADS/TN, ...
of column tc from the two tiles; a second barrier before the next step. A thread's rows are the same for its whole
warp, so rows past the expert's end are skipped warp by warp: a decode step (one or two rows per expert) spends
its time streaming W, as it must, not multiplying padding. fp32 loads, fp32 accumulation.
The ten loads are ten named scalars, all issued before the first store, so they can be in flight together. (A
first version looped 16 loads per thread into a ``cuda.local.array``: 2-2.5x slower on the H200, 16-19 % of the
memory floor at Kimi's decode shapes; most likely the array stayed in local memory and each load waited for the one
before it.)
GPU tiles: TM = 16, TN = 64, TK = 32, 256 threads (8 KB of W per block and step). The simulator runs the same
kernels at TM = 4, TN = 16, TK = 16, 32 threads (one OS thread per CUDA thread there).
Faster variant ``_grouped_gemm_v2_kernel`` (the launcher's default above decode-sized rows): the next step's ten
loads are issued right after the barrier, before this step's multiply, so a block's loads overlap its own compute.
Measured on the H200 (benchmarks/bench_moe.py, Kimi's experts H 7168, I 2048, 384 experts top-8, one layer's
gate/up + SwiGLU + down):
v1 -> v2 1.08 -> 0.94 ms at T = 1, 30.7 -> 25.8 ms at T = 64, 51.2 -> 41.7 ms at T = 256; that is 37-48 % of the
memory floor (expert bytes touched / copy bandwidth) and 1.46x / 0.97x / 1.11x the per-expert cuBLAS path with its
host read that it replaced (0.82x at T = 16). Prefill-sized T is compute-bound and a SIMT tile of 4 outputs per
thread is far from cuBLAS there (0.23x at T = 4096): a register-blocked or tensor-core tile is the next step.
Variant 3, ``_grouped_gemv_kernel`` (same grid and block work, above the variant table): for decode-sized T a
warp streams one output column's W row at a time, 8 loads in flight per lane, no shared tiles or barriers. The
launcher's default takes it for a long K (Kdim > SKINNY_MAX_K) while rows <= experts / GEMV_ROWS_PER_EXPERT, v2
above (``default_variant``). Measured on the H200 (bench_moe,
same shapes, device events): T = 1: 0.759 ms against v2's 0.906 (graph-replayed 0.628, 44 % of the memory floor);
T = 4: 2.73 against 3.01; T = 16: 9.62 against 9.41 (v2 from here on); T = 64: 36.8 against 25.4.

Variant 4, ``_grouped_skinny_kernel``: the skinny GEMM's warp patches (kernels/skinny_gemm.py: 8 x 4 outputs a
warp, K across its lanes, a reduce-scatter, no barriers) over each expert's rows - a tree verify's ~16 rows per
expert, where v2 pays a barrier pair per K step (ptxas sm_90: 165 registers, no spills). The launcher's default
takes it wherever Kdim <= SKINNY_MAX_K and rows <= SKINNY_MAX_ROWS (a decode step too). Measured on the H200 (graph
replays, same arrays, microseconds, gate/up | down; 2026-12-04): the default pair's experts (E 8, top-2, H 256,
I 192) at T = 16 / 33 / 65 / 128 tokens: v2 14.3 | 12.3, 17.0 | 14.5, 19.2 | 16.2, 27.9 | 16.3 against v4
9.7 | 8.4, 10.0 | 9.7, 13.7 | 9.9, 18.2 | 13.5; a Kimi-like layer (E 384, top-8, H 1024, I 512) at T = 16 / 65:
v2 250 | 138, 624 | 341 against v4 360 | 214, 913 | 534 (long K: one warp's lanes stream a whole row, too few
blocks in flight) - v2 stays there. In the round (DDTree-64 on the default pair): verify 0.639 -> 0.591 ms,
round 0.944 -> 0.895 ms; the chain's round 0.777 -> 0.707 ms; tokens identical.
Shapes: xs [N, Kdim] float32, W [E, M, Kdim] float32 (HF [out, in] per expert: Target's experts_gu [E, 2I, H],
experts_down [E, H, I]), offsets [E+1] int32 (offsets[0] = 0, non-decreasing, offsets[E] = N) -> out [N, M] float32.
Example: E = 3, offsets [0, 2, 2, 3], W[0] = [[1, 0]], W[2] = [[0, 2]], xs = [[1, 2], [3, 4], [5, 6]]
-> out = [[1], [3], [12]] (rows 0-1 by expert 0, expert 1 empty, row 2 by expert 2); with TM = 16: tiles
[0, 1, 1, 2], two row tiles.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, int32

from .. import backend
from . import _checks, skinny_gemm
from ._intrinsics import SIM
from .primitives import warp_prefix_sum, warp_sum

if SIM:
    TM, TN, TK, THREADS = 4, 16, 16, 32
else:
    TM, TN, TK, THREADS = 16, 64, 32, 256
CUBLAS_ROWS = 2048                       # above: per-expert cuBLAS (measured crossover: grouped 1.11x at 2048 rows =
#                                          T 256 x top-8, 0.40x at 8192)
TKP = TK + 1                             # padded row of a shared tile (a literal: numba on the GPU refuses
#                                          a shape expression such as TK + 1 inside the kernel)
ROW_STEP = THREADS // TN                 # rows between one thread's outputs
ROWS_PER_THREAD = TM // ROW_STEP         # outputs per thread (one column, ROWS_PER_THREAD rows)
assert THREADS % TN == 0 and TM % ROW_STEP == 0
assert TM * TK == 2 * THREADS and TN * TK == 8 * THREADS   # each thread moves 2 xs and 8 W elements per step


# ------------------------------------------------------------------------------------------------ references
def tile_table_ref(offsets, tile_m: int = TM):
    """tiles [E+1] int32: exclusive prefix sum of ceil(count[e] / tile_m)."""
    counts = np.diff(np.asarray(offsets, np.int64))
    tiles = np.zeros(counts.size + 1, np.int32)
    tiles[1:] = np.cumsum(-(-counts // tile_m))
    return tiles


def grouped_linear_ref(xs, W, offsets):
    """out[offsets[e]:offsets[e+1]] = xs[offsets[e]:offsets[e+1]] @ W[e].T, one NumPy GEMM per expert with rows."""
    xs = np.asarray(xs, np.float32)
    W = np.asarray(W, np.float32)
    off = np.asarray(offsets)
    out = np.zeros((xs.shape[0], W.shape[1]), np.float32)                  # [N, M]
    for e in range(W.shape[0]):
        if off[e + 1] > off[e]:
            np.matmul(xs[off[e]:off[e + 1]], W[e].T, out=out[off[e]:off[e + 1]])
    return out


# ------------------------------------------------------------------------------------------------ kernels
@cuda.jit
def _tile_table_kernel(offsets, tile_m, tiles):
    """One warp: lane l takes expert base + l of each chunk of 32; a warp prefix sum places its tiles."""
    lane = cuda.threadIdx.x
    buf = cuda.shared.array(32, int32)                  # the simulator's stand-in for shuffles (primitives)
    E = offsets.shape[0] - 1
    run = int32(0)                                      # tiles of the experts before this chunk
    for base in range(0, E, 32):
        e = base + lane
        n = int32(0)
        if e < E:
            n = int32((offsets[e + 1] - offsets[e] + tile_m - 1) // tile_m)
        before, total = warp_prefix_sum(n, buf)
        if e < E:
            tiles[e] = run + before
        run += total
    if lane == 0:
        tiles[E] = run


@cuda.jit(device=True, inline=True)
def _find_expert(tiles, tile):
    """The expert e with tiles[e] <= tile < tiles[e+1] (tile < tiles[E]): binary search, log2(E) steps."""
    lo = 0
    hi = tiles.shape[0] - 1                             # invariant: tiles[lo] <= tile < tiles[hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if tiles[mid] <= tile:
            lo = mid
        else:
            hi = mid
    return lo


@cuda.jit(device=True, inline=True)
def _x_at(xs, row0, nrows, k0, i):
    """Element i (row-major) of the xs tile [TM, TK] at (row0, k0); 0 past the expert's rows or Kdim."""
    r = i // TK
    k = k0 + i % TK
    return xs[row0 + r, k] if r < nrows and k < xs.shape[1] else float32(0.0)


@cuda.jit(device=True, inline=True)
def _w_at(W, e, col0, k0, i):
    """Element i (row-major) of the W[e] tile [TN, TK] at (col0, k0); 0 past M or Kdim."""
    n = col0 + i // TK
    k = k0 + i % TK
    return W[e, n, k] if n < W.shape[1] and k < W.shape[2] else float32(0.0)


@cuda.jit(device=True, inline=True)
def _put(tile, i, v):
    tile[i // TK, i % TK] = v


@cuda.jit(device=True, inline=True)
def _accumulate(xa, wb, tr, tc, nrows, acc):
    """acc[i] += xa[r] . wb[tc] for rows r = tr + i*ROW_STEP that exist (tr is warp-uniform: whole warps skip)."""
    for i in range(ROWS_PER_THREAD):
        r = tr + i * ROW_STEP
        if r < nrows:
            s = acc[i]
            for kk in range(TK):
                s += xa[r, kk] * wb[tc, kk]
            acc[i] = s


@cuda.jit(device=True, inline=True)
def _block_work(xs, W, offsets, tiles):
    """(expert, first row, rows, first column) of this block; rows = 0 when it is past the last row tile."""
    tile = cuda.blockIdx.x                              # global row tile (over all experts)
    col0 = cuda.blockIdx.y * TN                         # first output column
    if tile >= tiles[W.shape[0]]:                       # the grid is an upper bound
        return 0, 0, 0, col0
    e = _find_expert(tiles, tile)
    row0 = offsets[e] + (tile - tiles[e]) * TM
    return e, row0, min(TM, min(offsets[e + 1], xs.shape[0]) - row0), col0


@cuda.jit
def _grouped_gemm_kernel(xs, W, offsets, tiles, out):
    e, row0, nrows, col0 = _block_work(xs, W, offsets, tiles)
    if nrows <= 0:
        return
    xa = cuda.shared.array((TM, TKP), float32)          # xs tile   [TM, TK]  (+1: no bank conflicts)
    wb = cuda.shared.array((TN, TKP), float32)          # W[e] tile [TN, TK]
    acc = cuda.local.array(ROWS_PER_THREAD, float32)    # this thread's outputs: rows tr + i*ROW_STEP, column tc
    t = cuda.threadIdx.x
    tr = t // TN
    tc = t % TN
    for i in range(ROWS_PER_THREAD):
        acc[i] = float32(0.0)
    for k0 in range(0, xs.shape[1], TK):
        # global -> registers: ten independent loads in flight, then registers -> shared
        x0 = _x_at(xs, row0, nrows, k0, t)
        x1 = _x_at(xs, row0, nrows, k0, t + THREADS)
        w0 = _w_at(W, e, col0, k0, t)
        w1 = _w_at(W, e, col0, k0, t + THREADS)
        w2 = _w_at(W, e, col0, k0, t + 2 * THREADS)
        w3 = _w_at(W, e, col0, k0, t + 3 * THREADS)
        w4 = _w_at(W, e, col0, k0, t + 4 * THREADS)
        w5 = _w_at(W, e, col0, k0, t + 5 * THREADS)
        w6 = _w_at(W, e, col0, k0, t + 6 * THREADS)
        w7 = _w_at(W, e, col0, k0, t + 7 * THREADS)
        _put(xa, t, x0)
        _put(xa, t + THREADS, x1)
        _put(wb, t, w0)
        _put(wb, t + THREADS, w1)
        _put(wb, t + 2 * THREADS, w2)
        _put(wb, t + 3 * THREADS, w3)
        _put(wb, t + 4 * THREADS, w4)
        _put(wb, t + 5 * THREADS, w5)
        _put(wb, t + 6 * THREADS, w6)
        _put(wb, t + 7 * THREADS, w7)
        cuda.syncthreads()
        _accumulate(xa, wb, tr, tc, nrows, acc)
        cuda.syncthreads()                              # the tiles are read before the next step overwrites them
    if col0 + tc < W.shape[1]:
        for i in range(ROWS_PER_THREAD):
            r = tr + i * ROW_STEP
            if r < nrows:
                out[row0 + r, col0 + tc] = acc[i]


@cuda.jit
def _grouped_gemm_v2_kernel(xs, W, offsets, tiles, out):
    """_grouped_gemm_kernel with the next step's tiles loaded into the registers while this step's are multiplied:
    the block keeps its loads in flight during its compute instead of alternating load, wait, compute."""
    e, row0, nrows, col0 = _block_work(xs, W, offsets, tiles)
    if nrows <= 0:
        return
    xa = cuda.shared.array((TM, TKP), float32)
    wb = cuda.shared.array((TN, TKP), float32)
    acc = cuda.local.array(ROWS_PER_THREAD, float32)
    t = cuda.threadIdx.x
    tr = t // TN
    tc = t % TN
    for i in range(ROWS_PER_THREAD):
        acc[i] = float32(0.0)
    K = xs.shape[1]
    x0 = _x_at(xs, row0, nrows, 0, t)
    x1 = _x_at(xs, row0, nrows, 0, t + THREADS)
    w0 = _w_at(W, e, col0, 0, t)
    w1 = _w_at(W, e, col0, 0, t + THREADS)
    w2 = _w_at(W, e, col0, 0, t + 2 * THREADS)
    w3 = _w_at(W, e, col0, 0, t + 3 * THREADS)
    w4 = _w_at(W, e, col0, 0, t + 4 * THREADS)
    w5 = _w_at(W, e, col0, 0, t + 5 * THREADS)
    w6 = _w_at(W, e, col0, 0, t + 6 * THREADS)
    w7 = _w_at(W, e, col0, 0, t + 7 * THREADS)
    for k0 in range(0, K, TK):
        _put(xa, t, x0)
        _put(xa, t + THREADS, x1)
        _put(wb, t, w0)
        _put(wb, t + THREADS, w1)
        _put(wb, t + 2 * THREADS, w2)
        _put(wb, t + 3 * THREADS, w3)
        _put(wb, t + 4 * THREADS, w4)
        _put(wb, t + 5 * THREADS, w5)
        _put(wb, t + 6 * THREADS, w6)
        _put(wb, t + 7 * THREADS, w7)
        cuda.syncthreads()
        kn = k0 + TK                                    # prefetch the next step (zeros past Kdim: unused)
        x0 = _x_at(xs, row0, nrows, kn, t)
        x1 = _x_at(xs, row0, nrows, kn, t + THREADS)
        w0 = _w_at(W, e, col0, kn, t)
        w1 = _w_at(W, e, col0, kn, t + THREADS)
        w2 = _w_at(W, e, col0, kn, t + 2 * THREADS)
        w3 = _w_at(W, e, col0, kn, t + 3 * THREADS)
        w4 = _w_at(W, e, col0, kn, t + 4 * THREADS)
        w5 = _w_at(W, e, col0, kn, t + 5 * THREADS)
        w6 = _w_at(W, e, col0, kn, t + 6 * THREADS)
        w7 = _w_at(W, e, col0, kn, t + 7 * THREADS)
        _accumulate(xa, wb, tr, tc, nrows, acc)
        cuda.syncthreads()
    if col0 + tc < W.shape[1]:
        for i in range(ROWS_PER_THREAD):
            r = tr + i * ROW_STEP
            if r < nrows:
                out[row0 + r, col0 + tc] = acc[i]


# ------------------------------------------------------------------------------------------------ launchers
def row_tile_bound(n_rows: int, n_experts: int, tile_m: int = TM) -> int:
    """Most row tiles ``n_rows`` rows can need over ``n_experts`` experts (module docstring), from shapes only."""
    return min(n_rows, n_rows // tile_m + min(n_experts, n_rows))


def tile_table(offsets, out=None, sim_kernel: bool = True):
    """tiles [E+1] int32 on the device: expert e's row tiles are tiles[e] .. tiles[e+1]-1 (TM rows each).
    ``sim_kernel=False``: the reference on the simulator (as grouped_linear)."""
    offsets = _checks.array(offsets, "offsets", dtype=np.int32, ndim=1)
    if offsets.shape[0] < 2:
        raise ValueError(f"offsets: expected shape (E+1,) with E >= 1, got {tuple(offsets.shape)}")
    tiles = _checks.out_array(out, "out", (offsets.shape[0],), np.int32)
    if backend.name == "numpy" or (backend.name == "sim" and not sim_kernel):
        tiles[...] = tile_table_ref(offsets)
        return tiles
    backend.launch(_tile_table_kernel, 1, 32, offsets, TM, tiles)
    return tiles


# ------------------------------------------------------------------------------------------------ v3: grouped GEMV
# Decode-shaped variant (an expert with one or a few rows: the GEMM is a GEMV streaming W[e]). Same grid and block
# work as v1/v2 (row tile x TN output columns), different mapping: warp w owns TN / warps output columns and takes
# them one at a time; its lanes stream that column's W row (lane l reads k = l, l + 32, ..: coalesced 128-byte
# loads), GEMV_UNROLL of them issued before the first multiply, one row of the tile at a time (a second row re-reads
# the W row from L1/L2); a butterfly warp sum and lane 0 stores. No shared tiles, no barriers.
# Registers decide it (ptxas, sm_90): the first version (4 columns x 4 rows in 16 named accumulators) took 104, ran
# 2 blocks per SM and streamed W at 27 % of the memory floor (1.31 ms against v2's 0.93 at T = 1); signed indices
# cost a negative-index select and a 64-bit address per load (96); unsigned offsets and one row at a time: 64, four
# blocks per SM, 0.76 ms.
GEMV_UNROLL = 8                          # W loads in flight per lane (k0 + 32 j, j < 8: _load8 names them)
GEMV_STEP = 32 * GEMV_UNROLL             # Kdim covered by one unrolled step of a warp
GEMV_ROWS_PER_EXPERT = 4                 # the default takes v3 (long K) while rows <= experts / this (a decode step)


_U32 = np.uint64(32)                     # unsigned offsets: numba emits no negative-index wraparound for them,
#                                          so the 8 loads share one address (+128 B each) instead of 8 selects


@cuda.jit(device=True, inline=True)
def _load8(v, k):
    """v[k], v[k + 32], .., v[k + 224] (k unsigned)."""
    k1 = k + _U32
    k2 = k1 + _U32
    k3 = k2 + _U32
    k4 = k3 + _U32
    k5 = k4 + _U32
    k6 = k5 + _U32
    k7 = k6 + _U32
    return v[k], v[k1], v[k2], v[k3], v[k4], v[k5], v[k6], v[k7]


@cuda.jit(device=True, inline=True)
def _dot8(x, k, w0, w1, w2, w3, w4, w5, w6, w7):
    """sum_j x[k + 32 j] * w_j over the step's 8 W values (x: one row of xs)."""
    a0, a1, a2, a3, a4, a5, a6, a7 = _load8(x, k)
    return a0 * w0 + a1 * w1 + a2 * w2 + a3 * w3 + a4 * w4 + a5 * w5 + a6 * w6 + a7 * w7


@cuda.jit
def _grouped_gemv_kernel(xs, W, offsets, tiles, out):
    e, row0, nrows, col0 = _block_work(xs, W, offsets, tiles)
    buf = cuda.shared.array(32, float32)                # the simulator's stand-in for shuffles (primitives)
    if nrows <= 0:
        return
    lane = cuda.threadIdx.x % 32
    per_warp = TN // (cuda.blockDim.x // 32)            # output columns of this warp
    c_lo = col0 + cuda.threadIdx.x // 32 * per_warp
    K = xs.shape[1]
    k_main = K - K % GEMV_STEP                          # unrolled part; the rest one load at a time
    for c in range(c_lo, min(c_lo + per_warp, W.shape[1])):
        wc = W[e, c]                                    # [K] this column's weights
        for r in range(row0, row0 + nrows):
            x = xs[r]                                   # [K]
            s = float32(0.0)
            for k in range(np.uint64(lane), np.uint64(k_main), np.uint64(GEMV_STEP)):
                w0, w1, w2, w3, w4, w5, w6, w7 = _load8(wc, k)
                s += _dot8(x, k, w0, w1, w2, w3, w4, w5, w6, w7)
            for k in range(np.uint64(k_main + lane), np.uint64(K), _U32):
                s += x[k] * wc[k]
            s = warp_sum(s, buf)
            if lane == 0:
                out[r, c] = s


# ------------------------------------------------------------------------------------------------ v4: skinny patches
# A tree verify's MoE: ~16 rows per expert (65 tokens x top-2 over 8 experts), a few hundred columns - the shape the
# skinny GEMM (kernels/skinny_gemm.py) does in one pass where a tiled kernel pays a barrier per K step. Same row
# tiles as v1-v3 (TM rows of one expert), different block: ceil(TM / RW) warps cover a tile's rows (two on the GPU:
# rows 0-7 and 8-15), the block's other warps further column groups; each warp computes one RW x CW patch with
# skinny_gemm.patch_sum over W[e] (K across its lanes, a reduce-scatter), no shared tiles, no barriers.
SK_ROW_WARPS = -(-TM // skinny_gemm.RW)          # warps over a tile's rows
SK_WARPS = 1 if SIM else 4                       # warps per block (the simulator's shuffles need one-warp blocks)
SK_COLS = skinny_gemm.CW * (SK_WARPS // SK_ROW_WARPS)   # output columns per block
assert SK_WARPS % SK_ROW_WARPS == 0


@cuda.jit
def _grouped_skinny_kernel(xs, W, offsets, tiles, out):
    buf = cuda.shared.array(32 if SIM else 1, float32)  # the simulator's stand-in for shuffles (primitives)
    tile = cuda.blockIdx.x
    if tile >= tiles[W.shape[0]]:                       # the grid is an upper bound
        return
    e = _find_expert(tiles, tile)
    warp = cuda.threadIdx.x // 32
    row0 = offsets[e] + (tile - tiles[e]) * TM + (warp % SK_ROW_WARPS) * skinny_gemm.RW
    row_end = min(offsets[e] + (tile - tiles[e] + 1) * TM, offsets[e + 1])
    col0 = cuda.blockIdx.y * SK_COLS + (warp // SK_ROW_WARPS) * skinny_gemm.CW
    M = W.shape[1]
    if row0 >= row_end or col0 >= M:                    # whole warps leave: the shuffles need all 32 lanes
        return
    v = skinny_gemm.patch_sum(xs, row0, row_end, W[e], col0, M, buf, 0, xs.shape[1])
    lane = cuda.threadIdx.x % 32
    r = row0 + lane // skinny_gemm.CW
    c = col0 + lane % skinny_gemm.CW
    if r < row_end and c < M:
        out[r, c] = v


_KERNELS = {1: _grouped_gemm_kernel, 2: _grouped_gemm_v2_kernel, 3: _grouped_gemv_kernel, 4: _grouped_skinny_kernel}


SKINNY_MAX_K = 256                       # the default takes v4 where Kdim <= this
SKINNY_MAX_ROWS = 256                    # and rows <= this (measured range: the docstring's table)


def default_variant(rows: int, experts: int, kdim: int) -> int:
    """The launcher's choice for ``rows`` assignments over ``experts`` with inner dimension ``kdim``: 4 (skinny
    patches) while kdim <= SKINNY_MAX_K and rows <= SKINNY_MAX_ROWS, decode steps included; else 3 (GEMV) while
    rows <= experts / GEMV_ROWS_PER_EXPERT; else 2. (Until 2026-12-05 the GEMV came first at any K: the default
    pair's plain decode step - 2 rows over 8 experts, K 256 / 192 - ran 9-11 % more tokens/s with the skinny
    patches, ab_replay on the H200, docs/PERFORMANCE.md; the GEMV's case is a long K, where streaming W is the
    work.) Expert parallelism passes the whole layer's rows, so every rank runs the kernel one rank would (the same
    sums, bit for bit). Examples: default_variant(8, 384, 7168) -> 3 (a Kimi decode step); default_variant(2, 8,
    256) -> 4 (the default pair's decode step); (130, 8, 256) -> 4 (its DDTree-64 verify, gate/up); (130, 8,
    1024) -> 2."""
    if kdim <= SKINNY_MAX_K and rows <= SKINNY_MAX_ROWS:
        return 4
    return 3 if rows * GEMV_ROWS_PER_EXPERT <= experts else 2


def grouped_linear(xs, W, offsets, out=None, tiles=None, sim_kernel: bool = True, variant: int | None = None,
                   per_expert_above: bool = True):
    """``out[offsets[e]:offsets[e+1]] = xs[offsets[e]:offsets[e+1]] @ W[e].T`` for every expert, in one launch
    (two with the tile table); ``offsets`` is never read on the host.

    tiles: ``tile_table(offsets)`` when the caller runs several GEMMs over the same grouping (the MoE's gate/up and
    down), else computed here. Backends: numpy runs the reference; cuda the kernels; sim the kernels too, unless
    ``sim_kernel=False``: then the reference, as every model GEMM on the simulator (gemm.linear) - the kernel takes
    seconds per tiny GEMM there. variant: 1 the plain kernel, 2 the prefetching one, 3 the grouped GEMV, 4 skinny
    patches (a tree verify's ~16 rows per expert); None (default): ``default_variant(rows, experts, Kdim)`` - 4
    for a short K and at most ``SKINNY_MAX_ROWS`` rows, else 3 while rows <= experts / ``GEMV_ROWS_PER_EXPERT`` (a
    decode step: most experts get one row or none), else 2.
    Above ``CUBLAS_ROWS`` rows (a prefill chunk; ``per_expert_above=False`` turns this off) the cuda launcher
    reads ``offsets`` once and runs one cuBLAS GEMM per expert instead: compute-bound there, where cuBLAS was
    2.5-4x faster than this SIMT tile (docstring above); a decode step or a tree verify stays under it."""
    xs = _checks.array(xs, "xs", dtype=np.float32, ndim=2)
    N, K = xs.shape
    W = _checks.array(W, "W", dtype=np.float32, ndim=3, shape=(None, None, K))
    E, M = W.shape[0], W.shape[1]
    offsets = _checks.array(offsets, "offsets", dtype=np.int32, shape=(E + 1,))
    out = _checks.out_array(out, "out", (N, M), np.float32)
    if variant is not None and variant not in _KERNELS:
        raise ValueError(f"variant: expected 1, 2, 3, 4 or None, got {variant!r}")
    if backend.name == "numpy" or (backend.name == "sim" and not sim_kernel):
        off = np.asarray(offsets)
        if off[0] != 0 or off[-1] != N or np.any(np.diff(off) < 0):
            raise ValueError(f"offsets: expected 0 = offsets[0] <= ... <= offsets[E] = {N} (xs rows), "
                             f"got {off[0]} .. {off[-1]}{' (decreasing)' if np.any(np.diff(off) < 0) else ''}")
        out[...] = grouped_linear_ref(xs, W, off)
        return out
    if N == 0 or M == 0:
        return out
    if K == 0:
        out[...] = 0.0
        return out
    if backend.name == "cuda" and N > CUBLAS_ROWS and per_expert_above:
        off = backend.to_host(offsets)                  # a prefill chunk: one host read, one cuBLAS GEMM per expert
        for e in np.flatnonzero(np.diff(off)):
            backend.xp.matmul(xs[off[e]:off[e + 1]], W[e].T, out=out[off[e]:off[e + 1]])
        return out
    if tiles is None:
        tiles = tile_table(offsets)
    else:
        tiles = _checks.array(tiles, "tiles", dtype=np.int32, shape=(E + 1,))
    if variant is None:
        variant = default_variant(N, E, K)
    if variant == 4:
        grid, threads = (row_tile_bound(N, E), -(-M // SK_COLS)), 32 * SK_WARPS
    else:
        grid, threads = (row_tile_bound(N, E), -(-M // TN)), THREADS
    backend.launch(_KERNELS[variant], grid, threads, xs, W, offsets, tiles, out)
    return out
