"""Warp and block primitives the kernels are built from: reductions, arg-max, scans, a sort, the streaming softmax.

Device functions in families named by what they need from the launch:

``warp_*`` - register shuffles among the 32 lanes of a warp: no shared memory, no barrier on the GPU.
    warp_sum / warp_max / warp_min(v)        -> the warp's sum / max / min, to every lane
    warp_prefix_sum(v) -> (exclusive prefix, warp total), warp_suffix_sum(v) -> inclusive suffix   (int32)
    warp_bcast(v, src) -> lane src's v;      warp_argmax(v, i) -> the warp's best (v, i) under ``argmax_beats``
    warp_xor(v, off) -> lane (lane ^ off)'s v: one butterfly step, for reductions written by hand
    warp_sync() -> the lanes meet; their shared and global writes before it are seen after it (a __syncwarp)
  Every lane of the warp makes the call (warp-uniform control flow) and the kernel runs whole warps. Each starts
  with a __syncwarp: ptxas cannot prove the lanes converged after a branch or a barrier and guards the shuffles
  with a divergence test; measured (ncu), every warp of the top-K scan took the slow, emulated path there until
  the explicit reconvergence.
``group_*`` - the same butterfly over aligned groups of ``width`` consecutive lanes (2, 4, 8, 16 or 32):
    group_max / group_sum(v, width, buf)     -> the group's max / sum, to every lane of the group
  On the simulator they go through ``buf`` (shared float32 [>= threads]) with two barriers, so every thread of the
  block calls, and blocks of any number of whole warps work there too.
``block_*`` - a warp collective, the warps' partials through a shared ``wpart`` [>= warps] and one barrier, then
  a warp collective over the partials: block_min, block_prefix_sum, block_suffix_sum.
  Whole warps, every thread of the block calls; two calls that share ``wpart`` need a barrier between them.
``smem_*`` - the classic shared-memory tree (or Hillis-Steele scan) over a shared ``red`` [>= threads], one
  barrier per level: smem_sum, smem_max, smem_argmax (blocks of a power of two), smem_prefix_sum (any size). They
  run at any block size on the simulator too, and combine in a fixed order, so a float sum is reproducible for a
  given block size. Every thread of the block calls; a caller that writes ``red`` again first needs a barrier
  (the result is read from it after the last one).
``bitonic_sort_desc(keys, n)`` sorts keys[0:n) of a shared array in place with the whole block (any n).
``online_softmax_row`` is one step of the streaming softmax of the attention kernels (one thread per row).
Every arg-max (per thread, warp or block) breaks ties by one rule, ``argmax_beats``: the larger value, then the
lower index - np.argmax's first maximum.

The simulator has no shuffles. There a warp collective goes through a shared scratch ``buf`` [32] (the value's
type) with two barriers, so a kernel using the ``warp_*`` / ``block_*`` families runs blocks of exactly one warp
(32 threads) on the simulator: the block is the warp, and the result is the same. Callers pass ``buf`` on the
GPU too, where it is not touched (one source for both: the simulator tests run the algorithm the GPU runs).
Example: lanes holding c = [1, 0, 2, 0, ... 0] -> warp_prefix_sum gives (0, 1, 1, 3, 3, ...) and total 3;
warp_suffix_sum gives (3, 2, 2, 0, ...); warp_argmax of values [5, 7, 7, 1, ...] at indices 0.. gives (7, 1).
"""
from __future__ import annotations

import math

from numba import cuda, float32, int32

from ._intrinsics import SIM

FULL = 0xFFFFFFFF          # every lane of the warp takes part


# ------------------------------------------------------------------------------------------------ arg-max rule
@cuda.jit(device=True)
def argmax_beats(v, i, best_v, best_i):
    """(v, i) beats (best_v, best_i) in an arg-max: larger value, or an equal value and a lower index. A NaN ``v``
    never beats anything, so arg-max loops that start from (-inf, n) skip NaN entries.
    NumPy: the winner of a set is (x[j], j) with j = np.argmax(x) (the first index of the maximum).
    Example: argmax_beats(2.0, 3, 2.0, 5) -> True; argmax_beats(2.0, 5, 2.0, 3) -> False."""
    return v > best_v or (v == best_v and i < best_i)


# ------------------------------------------------------------------------------------------------ warp collectives
if not SIM:
    @cuda.jit(device=True)
    def warp_max(v, buf):
        """The largest v of the warp, to every lane: np.max(v[warp]); a 5-step shfl_xor butterfly (``group_max``
        over the whole warp). buf: shared [32] of v's type (the simulator's scratch, untouched here). Example:
        lanes holding their id -> 31."""
        return group_max(v, 32, buf)

    @cuda.jit(device=True)
    def warp_min(v, buf):
        """The smallest v of the warp, to every lane: np.min(v[warp]) = -max(-v) (exact for floats). As warp_max."""
        return -warp_max(-v, buf)

    @cuda.jit(device=True)
    def warp_sum(v, buf):
        """The sum of v over the warp, to every lane: np.sum(v[warp]) in the butterfly's order (the simulator adds
        in lane order: float sums may differ in the last bit); ``group_sum`` over the whole warp. As warp_max.
        Example: all ones -> 32."""
        return group_sum(v, 32, buf)

    @cuda.jit(device=True)
    def warp_prefix_sum(v, buf):
        """(exclusive prefix sum, warp total) of int32 v: ((np.cumsum(c) - c)[lane], c.sum()); a Hillis-Steele
        scan over shfl_up (5 steps). buf: shared int32 [32] (simulator). Example: c = [1, 0, 2, 0, ...] -> lanes
        0..3 get 0, 1, 1, 3; total 3."""
        cuda.syncwarp(FULL)
        v = int32(v)
        lane = cuda.laneid
        x = v
        s = 1
        while s < 32:
            u = cuda.shfl_up_sync(FULL, x, s)
            if lane >= s:
                x = int32(x + u)
            s <<= 1
        return x - v, cuda.shfl_sync(FULL, x, 31)

    @cuda.jit(device=True)
    def warp_suffix_sum(v, buf):
        """Inclusive suffix sum of int32 v: np.cumsum(c[::-1])[::-1][lane] (this lane and all higher ones). As
        warp_prefix_sum. Example: c = [1, 0, 2, 0, ...] -> 3, 2, 2, 0, ..."""
        before, total = warp_prefix_sum(v, buf)
        return int32(total - before)

    @cuda.jit(device=True)
    def warp_bcast(v, src, buf):
        """Lane src's v, to every lane: v[src]. buf: shared [32] of v's type (simulator)."""
        cuda.syncwarp(FULL)
        return cuda.shfl_sync(FULL, v, src)

    @cuda.jit(device=True, inline=True)
    def warp_xor(v, off, buf):
        """Lane (lane ^ off)'s v: one shfl_xor, the step of a hand-written butterfly. Unlike the collectives above
        it starts with no __syncwarp (a caller making many in a row syncs once before them)."""
        return cuda.shfl_xor_sync(FULL, v, off)

    @cuda.jit(device=True)
    def warp_sync():
        """The warp's lanes meet; their shared and global writes before it are seen after it: one __syncwarp."""
        cuda.syncwarp(FULL)

    @cuda.jit(device=True)
    def warp_argmax(v, i, vbuf, ibuf):
        """The warp's best (v, i) under argmax_beats, to every lane: (x[j], j), j = np.argmax(x), when lane l holds
        its best (v, i) of x (equal values: the lowest i). A 5-step shfl_xor butterfly of the pairs; no NaN values
        (arg-max loops skip them). vbuf / ibuf: shared [32] of v's / i's type (simulator).
        Example: v = [5, 7, 7, 1, ...] at i = lane -> (7, 1) in every lane."""
        cuda.syncwarp(FULL)
        off = 16
        while off > 0:
            ov = cuda.shfl_xor_sync(FULL, v, off)
            oi = cuda.shfl_xor_sync(FULL, i, off)
            if argmax_beats(ov, oi, v, i):
                v = ov
                i = oi
            off //= 2
        return v, i
else:                      # the simulator's stand-ins: same results through shared buf, block = one warp
    @cuda.jit(device=True)
    def _gather(v, buf):
        """All 32 values of the warp (= block), as a list (two barriers)."""
        buf[cuda.threadIdx.x] = v
        cuda.syncthreads()
        vals = [buf[i] for i in range(32)]
        cuda.syncthreads()
        return vals

    @cuda.jit(device=True)
    def warp_max(v, buf):
        return max(_gather(v, buf))

    @cuda.jit(device=True)
    def warp_min(v, buf):
        return min(_gather(v, buf))

    @cuda.jit(device=True)
    def warp_sum(v, buf):
        vals = _gather(v, buf)
        s = vals[0]
        for u in vals[1:]:
            s += u
        return s

    @cuda.jit(device=True)
    def warp_prefix_sum(v, buf):
        vals = _gather(v, buf)
        return sum(vals[:cuda.threadIdx.x]), sum(vals)

    @cuda.jit(device=True)
    def warp_suffix_sum(v, buf):
        vals = _gather(v, buf)
        return sum(vals[cuda.threadIdx.x:])

    @cuda.jit(device=True)
    def warp_bcast(v, src, buf):
        return _gather(v, buf)[src]

    @cuda.jit(device=True)
    def warp_xor(v, off, buf):
        buf[cuda.threadIdx.x] = v
        cuda.syncthreads()
        got = buf[cuda.threadIdx.x ^ off]
        cuda.syncthreads()
        return got

    @cuda.jit(device=True)
    def warp_sync():
        cuda.syncthreads()                              # the block is the warp

    @cuda.jit(device=True)
    def warp_argmax(v, i, vbuf, ibuf):
        vals = _gather(v, vbuf)
        idx = _gather(i, ibuf)
        best_v = vals[0]
        best_i = idx[0]
        for lane in range(1, 32):
            if argmax_beats(vals[lane], idx[lane], best_v, best_i):
                best_v = vals[lane]
                best_i = idx[lane]
        return best_v, best_i


# ------------------------------------------------------------------------------------------------ group collectives
GROUP_BUF = 256 if SIM else 1      # floats of the simulator's group scratch (the most threads its callers run)

if not SIM:
    @cuda.jit(device=True)
    def group_max(v, width, buf):
        """The largest v of this lane's group (lanes width * k .. width * k + width - 1), to each of them; a
        log2(width)-step shfl_xor butterfly. Example: width 4, lanes holding their id -> lanes 4..7 get 7."""
        cuda.syncwarp(FULL)
        s = width // 2
        while s > 0:
            v = max(v, cuda.shfl_xor_sync(FULL, v, s))
            s >>= 1
        return v

    @cuda.jit(device=True)
    def group_sum(v, width, buf):
        """The sum of v over this lane's group, to each of them (butterfly order). As group_max."""
        cuda.syncwarp(FULL)
        s = width // 2
        while s > 0:
            v += cuda.shfl_xor_sync(FULL, v, s)
            s >>= 1
        return v
else:
    @cuda.jit(device=True)
    def _group_values(v, width, buf):
        """The group's values, as a list (two block barriers: every thread of the block calls)."""
        tid = cuda.threadIdx.x
        buf[tid] = v
        cuda.syncthreads()
        base = tid - tid % width
        vals = [buf[base + i] for i in range(width)]
        cuda.syncthreads()
        return vals

    @cuda.jit(device=True)
    def group_max(v, width, buf):
        return max(_group_values(v, width, buf))

    @cuda.jit(device=True)
    def group_sum(v, width, buf):
        vals = _group_values(v, width, buf)
        s = vals[0]
        for u in vals[1:]:
            s += u
        return s


# ------------------------------------------------------------------------------------------------ block collectives
@cuda.jit(device=True)
def block_prefix_sum(v, wpart, buf):
    """(exclusive prefix sum of int32 v over the block's threads in thread order, the block total), to every thread:
    NumPy (np.cumsum(c) - c)[tid], c.sum(). A warp prefix sum, the warps' totals through ``wpart`` (shared int32
    [>= warps]) and one barrier, then a warp prefix sum over those totals. Whole warps, every thread calls; two
    calls sharing wpart need a barrier between them. buf: shared int32 [32] (the simulator's, block = one warp).
    Example: 64 threads all holding 1 -> thread t gets (t, 64)."""
    before, total = warp_prefix_sum(v, buf)
    lane = cuda.laneid
    if lane == 0:
        wpart[cuda.threadIdx.x // 32] = total
    cuda.syncthreads()
    nwarps = (cuda.blockDim.x + 31) // 32
    wbefore, total = warp_prefix_sum(wpart[lane] if lane < nwarps else int32(0), buf)
    return int32(before + warp_bcast(wbefore, cuda.threadIdx.x // 32, buf)), total


@cuda.jit(device=True)
def block_suffix_sum(v, wpart, nwarps, buf):
    """Inclusive suffix sum of int32 v over the block, to every thread: np.cumsum(c[::-1])[::-1][tid] (this thread
    and all higher ones). A warp suffix sum, the warps' totals through ``wpart`` (shared int32 [>= nwarps]) and one
    barrier, plus the sum of the higher warps' totals. nwarps = the block's warps (a literal where the block size
    is fixed). Rules as block_prefix_sum. Example: 64 threads all holding 1 -> thread t gets 64 - t."""
    suffix = warp_suffix_sum(v, buf)              # this thread's value and those of the warp's higher lanes
    w = cuda.threadIdx.x // 32
    lane = cuda.laneid
    if lane == 0:
        wpart[w] = suffix                         # lane 0's suffix is the warp's total
    cuda.syncthreads()
    return int32(suffix + warp_sum(wpart[lane] if lane > w and lane < nwarps else int32(0), buf))


@cuda.jit(device=True)
def block_min(v, wpart, nwarps, buf):
    """The smallest v over the block, to every thread: np.min(v[block]). A warp minimum, the warps' minima through
    ``wpart`` (shared [>= nwarps], v's type; nwarps = the block's warps, a literal where the block size is fixed)
    and one barrier. Rules as block_prefix_sum; buf: shared [32] of v's type. (A shared float atomic min is a
    compare-and-swap loop; the lanes it split stayed apart through the next barrier, and ncu showed every warp of
    the top-K scan taking ptxas's slow, emulated path for the shuffles after it.)
    Example: 64 threads holding 64 - t -> 1 everywhere."""
    m = warp_min(v, buf)
    lane = cuda.laneid
    if lane == 0:
        wpart[cuda.threadIdx.x // 32] = m
    cuda.syncthreads()
    return warp_min(wpart[lane] if lane < nwarps else wpart[0], buf)


# ------------------------------------------------------------------------------------------------ shared-memory trees
@cuda.jit(device=True)
def smem_sum(v, red):
    """The sum of v over the block, to every thread: np.sum(v[block]) added pairwise as a tree - level by level,
    red[t] += red[t + s] for s = threads/2, threads/4, ..., 1 (that float rounding order). Thread t owns red[t];
    red: shared [>= threads] (the result's type). Blocks of a power of two; log2(threads) + 1 barriers, every thread
    calls. Example: 8 threads holding t -> 28 everywhere."""
    tid = cuda.threadIdx.x
    red[tid] = v
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            red[tid] += red[tid + stride]
        cuda.syncthreads()
        stride //= 2
    return red[0]


@cuda.jit(device=True)
def smem_max(v, red):
    """The largest v over the block, to every thread: np.max(v[block]) as a tree (red[t] = max(red[t], red[t + s]),
    smem_sum's levels). Same rules as smem_sum. Example: 8 threads holding (t * 5) % 8 -> 7 everywhere."""
    tid = cuda.threadIdx.x
    red[tid] = v
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            red[tid] = max(red[tid], red[tid + stride])
        cuda.syncthreads()
        stride //= 2
    return red[0]


@cuda.jit(device=True)
def smem_argmax(v, i, red_v, red_i):
    """The block's best (v, i) under argmax_beats (larger value, equal values: lower index), to every thread:
    j = np.argmax(x); (x[j], j) when thread t holds its own best (v, i) of x. A tree over (red_v, red_i) (shared
    [>= threads], v's and i's types), smem_sum's levels and rules. Threads without a candidate pass (-inf, n); a
    result index of n means no thread had one. Example: 4 threads holding (3, 0) (5, 1) (5, 2) (-inf, 4) -> (5, 1)."""
    tid = cuda.threadIdx.x
    red_v[tid] = v
    red_i[tid] = i
    cuda.syncthreads()
    stride = cuda.blockDim.x // 2
    while stride > 0:
        if tid < stride:
            ov = red_v[tid + stride]
            oi = red_i[tid + stride]
            if argmax_beats(ov, oi, red_v[tid], red_i[tid]):
                red_v[tid] = ov
                red_i[tid] = oi
        cuda.syncthreads()
        stride //= 2
    return red_v[0], red_i[0]


@cuda.jit(device=True)
def smem_prefix_sum(v, red):
    """(exclusive prefix sum of v over the block's threads in order, block total), to every thread:
    (np.cumsum(c) - c)[tid], c.sum(). A Hillis-Steele scan in shared red [>= threads] (the result's type): at step s
    = 1, 2, 4, ... thread t adds red[t - s]; any block size, 2 ceil(log2(threads)) + 1 barriers, every thread calls.
    Example: 5 threads holding [1, 0, 2, 0, 3] -> (0, 1, 1, 3, 3), total 6."""
    tid = cuda.threadIdx.x
    n = cuda.blockDim.x
    red[tid] = v
    cuda.syncthreads()
    step = 1
    while step < n:
        add = red[tid - step] if tid >= step else 0
        cuda.syncthreads()
        red[tid] += add
        cuda.syncthreads()
        step *= 2
    return (red[tid - 1] if tid > 0 else 0), red[n - 1]


# ------------------------------------------------------------------------------------------------ sort
@cuda.jit(device=True)
def bitonic_sort_desc(keys, n):
    """Sort keys[0:n) in place, descending: keys[:n] = np.sort(keys[:n])[::-1] (no NaN keys). A bitonic network in
    its one-direction form - merge stage `size` first compares i with its mirror i ^ (size - 1) in the block of
    `size`, then i with i ^ s for s = size/4 .. 1, the larger key to the lower index. Any n: pairs reaching past n
    are skipped, which is the power-of-two network with -inf pads after the end (they never move), so keys[n:] is
    untouched. Threads stride over i; one barrier after each of the log2(n_pad) (log2(n_pad) + 1) / 2 steps. keys:
    shared, complete before the call (a barrier after writing them); every thread calls with the same n.
    Example: n = 5, [3, 9, 1, 9, 4] -> [9, 9, 4, 3, 1]."""
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    size = 2
    while size // 2 < n:
        stride = size - 1                         # the mirror step, then the half-cleaners
        while stride > 0:
            for i in range(tid, n, nthreads):
                j = i ^ stride
                if j > i and j < n:
                    a = keys[i]
                    b = keys[j]
                    if a < b:
                        keys[i] = b
                        keys[j] = a
            cuda.syncthreads()
            stride = size // 4 if stride == size - 1 else stride // 2
        size *= 2


# ------------------------------------------------------------------------------------------------ streaming softmax
@cuda.jit(device=True)
def online_softmax_row(sc, h, n, m_run, l_run, alpha):
    """One step of the streaming softmax both attention kernels use, for row h of a tile of n scores (one thread
    per row, plain float32 exp): M = max(m, max_j sc[h, j]); alpha = exp(m - M); sc[h, j] = exp(sc[h, j] - M);
    l = l * alpha + sum_j sc[h, j]; m = M. The caller then rescales its accumulators by alpha[h] and adds the tile.
    Example: m = -inf, l = 0, sc[h] = [0, ln 3] -> m = ln 3, l = 4/3, sc[h] = [1/3, 1], alpha = 0."""
    mx = m_run[h]
    for j in range(n):
        mx = max(mx, sc[h, j])
    a = float32(math.exp(m_run[h] - mx))
    lsum = l_run[h] * a
    for j in range(n):
        e = float32(math.exp(sc[h, j] - mx))
        sc[h, j] = e
        lsum += e
    m_run[h] = mx
    l_run[h] = lsum
    alpha[h] = a
