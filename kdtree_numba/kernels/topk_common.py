"""Top-K pieces both top-K paths share (kernels/topk_block.py, kernels/topk_split.py): the packed key, the fold,
the block merge, the histogram threshold and the candidate sort. The spec is ``logprobs.topk_logprobs``.

Packed key: every (value, index) becomes one uint64 ``order_key << 32 | ~index`` (``_composite``; ``_order_key``
flips the float's bits so that unsigned order = float order, -0.0 counting as +0.0): one unsigned compare orders
by (value desc, index asc), no two elements tie, and no real element's key is 0 (0 pads the sorts).
Fold (``_fold_range``): a thread's strided columns -> a running (max, sum of exp(x - max)) and two tops m, m2, the
maxima of its even and of its odd steps - two distinct elements (exp as ex2.approx on the GPU). A NaN or +inf
anywhere makes the sum NaN, which marks the row. ``_block_merge`` combines the threads' pairs into the block's
(max, sum) - lse = max + log(sum) - and takes the minimum of a third value (lo).
Threshold: the 2 x threads tops are distinct elements, so their k-th largest is a lower bound for the k-th
largest of the elements they were taken from. A histogram of them over [lo, max] (``_bin_of``: monotone, clamped) and a
scan from the top (``_crossing``) give the bin b* holding it: every element of the top k lies in a bin >= b*.
Sort (``_sort_write``): the k largest of n <= CAP candidate keys, written in order - a rank sort (each candidate
counts those above it; threads share a candidate's count when there are more threads than candidates) up to
RANK_SORT candidates, a bitonic network (``primitives.bitonic_sort_desc``) above.
Mapping: device functions. Per thread: _order_key, _composite, _exp, _fold8 / _load8 / _stage8, _fold_range,
_bin_of. The whole block (barriers, warp collectives): _crossing, _block_merge, _sort_write;
_write_topk strides the block's threads over the k outputs.
Shapes: x [R, V] float32 and bits [R, V] uint32 (the same memory, x.view(uint32)), lp_out [R, k] float32,
ids_out [R, k] int32; candidate keys cand [>= CAP] uint64 in shared memory.
Example: _order_key(bits of 1.0 = 0x3F800000) = 0xBF800000 > _order_key(bits of -1.0 = 0xBF800000) = 0x407FFFFF;
of two elements equal to 1.0 at indices 3 and 5, _composite gives 3 the larger key (low words 2^32 - 4 > 2^32 - 6).
"""
from __future__ import annotations

import math
import warnings

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from ._intrinsics import LOG2E, SIM, ex2, fmax, fmin
from .primitives import bitonic_sort_desc, block_suffix_sum, warp_max, warp_min, warp_sum

if SIM:
    # On the simulator the device functions run as NumPy float32 scalar arithmetic. The online log-sum-exp starts
    # each running max at NEG = -FLT_MAX, so the first rescale computes ex2((NEG - m) * log2 e): the product
    # overflows to -inf, the intended value (ex2(-inf) = 0 rescales the still-empty sum), exactly as the FMUL
    # does on a GPU - but NumPy also prints "overflow encountered in scalar multiply". Only that message, only
    # from this module, is silenced; any other overflow still warns.
    warnings.filterwarnings("ignore", message="overflow encountered in scalar multiply", category=RuntimeWarning,
                            module=r"kdtree_numba\.kernels\.topk_common")

HIST_BITS = 11
NBINS = 1 << HIST_BITS
CAP = 4096                 # candidate buffer (shared): >= logprobs.MAX_K, >= NBINS
RANK_SORT = 1024           # up to this many candidates: rank sort (two barriers); above: bitonic
MAX_THREADS = 512          # threads of the one-block-per-row kernels
MAX_WARPS = MAX_THREADS // 32
NEG = float(-np.finfo(np.float32).max)   # the fold's start: below every finite value, above -inf
M32 = 0xFFFFFFFF
# the one-block kernels at 512 threads: 64 registers keep two blocks per multiprocessor (unbounded, ptxas takes
# ~90 for the inlined fallback paths, whose few spills cost nothing on the common path); the simulator has no
# register cap
_CAP_64 = {} if SIM else {"max_registers": 64}


# ------------------------------------------------------------------------------------------------ the packed key
@cuda.jit(device=True)
def _order_key(u):
    """float32 bit pattern (uint32) -> key whose unsigned order is the float order (-0.0 counts as +0.0)."""
    if u == uint32(0x80000000):
        u = uint32(0)
    if u & uint32(0x80000000):
        return ~u
    return u | uint32(0x80000000)


@cuda.jit(device=True)
def _composite(key, v):
    """(key, index) -> one uint64 whose descending order is (value desc, index asc); never 0 for a real value."""
    return (uint64(key) << uint64(32)) | (uint64(M32) - uint64(v))


# ------------------------------------------------------------------------------------------------ the fold
@cuda.jit(device=True)
def _exp(t):
    """exp(t) for t <= 0 as one ex2.approx of t log2 e (see _intrinsics): relative error < 2e-6, so the sums of
    exp(x - max) it feeds stay within fp32 tolerance of the reference; exp(-inf) = 0, exp(NaN) = NaN."""
    return ex2(t * float32(LOG2E))


@cuda.jit(device=True)
def _fold8(ma, mb, m, ssum, a0, a1, a2, a3, a4, a5, a6, a7):
    """One step of _fold_range over eight loaded values: the step's maximum becomes the top of this step's parity
    (ma, mb alternate), m = the larger top, ssum rescaled once to the new m, then eight exp as ex2."""
    ma, mb = mb, fmax(ma, fmax(fmax(fmax(a0, a1), fmax(a2, a3)), fmax(fmax(a4, a5), fmax(a6, a7))))
    m_old = m
    m = fmax(ma, mb)
    ssum = (ssum * _exp(m_old - m) + _exp(a0 - m) + _exp(a1 - m) + _exp(a2 - m) + _exp(a3 - m) + _exp(a4 - m)
            + _exp(a5 - m) + _exp(a6 - m) + _exp(a7 - m))
    return ma, mb, m, ssum


@cuda.jit(device=True)
def _load8(x, row, v, nt):
    """x[row, v + i nt], i < 8 (all eight issued before any is used)."""
    return (x[row, v], x[row, v + nt], x[row, v + uint64(2) * nt], x[row, v + uint64(3) * nt],
            x[row, v + uint64(4) * nt], x[row, v + uint64(5) * nt], x[row, v + uint64(6) * nt],
            x[row, v + uint64(7) * nt])


@cuda.jit(device=True)
def _stage8(stage, j, nt, a0, a1, a2, a3, a4, a5, a6, a7):
    """stage[j + i nt] = a_i, i < 8."""
    stage[j] = a0
    stage[j + nt] = a1
    stage[j + uint64(2) * nt] = a2
    stage[j + uint64(3) * nt] = a3
    stage[j + uint64(4) * nt] = a4
    stage[j + uint64(5) * nt] = a5
    stage[j + uint64(6) * nt] = a6
    stage[j + uint64(7) * nt] = a7


@cuda.jit(device=True)
def _fold_range(x, row, start, end, stage, nt):
    """This thread's columns start + tid + j * nt < end (nt = the block's threads; a compile-time constant makes
    every load address an immediate offset) folded into two tops - the largest value of its even steps and of its
    odd steps, two distinct elements - and ssum = sum of exp(x - m), m = the larger top (the softmax shift); with
    a ``stage`` (shared array) also stage[v - start] = x[row, v]. Returns (m, m2 = the other top, ssum).
    Steps of eight (_fold8): the step's maximum (seven FMNMX; keeping each thread's two largest elements instead
    took three FMNMX an element), one rescale of ssum to the new m, and eight exp as ex2. Loads come sixteen at a
    time, two steps' worth, before either step's stores or math: a store waits for its load and the next loads
    issue only after it, so eight at a time paid one round trip to memory per step. (No branch between loads
    either: the second would wait for the first.) Starts from tops = NEG, ssum = 0: NEG is no element's top (tops
    are compared > NEG), and -inf elements add exp(-inf - m) = 0 without a test. A NaN element makes ssum NaN, and
    so does +inf (exp(inf - inf)): the NaN marks the row. Unsigned indices spare the negative-index wraparound
    numba adds to every signed index."""
    nt = uint64(nt)
    e = uint64(end)
    s0 = uint64(start)
    ma = float32(NEG)                                      # the top of the coming step's parity
    mb = float32(NEG)
    m = float32(NEG)
    ssum = float32(0.0)
    j = uint64(cuda.threadIdx.x)
    while s0 + j + uint64(15) * nt < e:
        v = s0 + j
        a0, a1, a2, a3, a4, a5, a6, a7 = _load8(x, row, v, nt)
        b0, b1, b2, b3, b4, b5, b6, b7 = _load8(x, row, v + uint64(8) * nt, nt)
        if stage is not None:
            _stage8(stage, j, nt, a0, a1, a2, a3, a4, a5, a6, a7)
            _stage8(stage, j + uint64(8) * nt, nt, b0, b1, b2, b3, b4, b5, b6, b7)
        ma, mb, m, ssum = _fold8(ma, mb, m, ssum, a0, a1, a2, a3, a4, a5, a6, a7)
        ma, mb, m, ssum = _fold8(ma, mb, m, ssum, b0, b1, b2, b3, b4, b5, b6, b7)
        j += uint64(16) * nt
    while s0 + j + uint64(7) * nt < e:
        a0, a1, a2, a3, a4, a5, a6, a7 = _load8(x, row, s0 + j, nt)
        if stage is not None:
            _stage8(stage, j, nt, a0, a1, a2, a3, a4, a5, a6, a7)
        ma, mb, m, ssum = _fold8(ma, mb, m, ssum, a0, a1, a2, a3, a4, a5, a6, a7)
        j += uint64(8) * nt
    while s0 + j < e:
        a0 = x[row, s0 + j]
        if stage is not None:
            stage[j] = a0
        ma, mb = mb, fmax(ma, a0)
        m_old = m
        m = fmax(ma, mb)
        ssum = ssum * _exp(m_old - m) + _exp(a0 - m)
        j += nt
    return m, fmin(ma, mb), ssum


@cuda.jit(device=True)
def _block_merge(m, ssum, lo, wf, fbuf, nwarps):
    """Block merge of the threads' (max, sum of exp(x - max)) pairs and of their ``lo``: every thread gets the
    block's (max, sum of exp(x - max), min lo) (log-sum-exp = max + log(sum)). Warp collectives, then the warps'
    partials through shared wf [3, >= nwarps] and one barrier (the caller barriers before wf is written again).
    Maxima are >= NEG (never -inf), so no exp(-inf + inf) arises. (A loop over the warps' partials in every thread
    cost ~8 instructions a warp; 16 warps made it the largest piece of the block's tail.)"""
    wm = warp_max(m, fbuf)
    ws = warp_sum(ssum * _exp(m - wm), fbuf)
    wl = warp_min(lo, fbuf)
    lane = cuda.laneid
    if lane == 0:
        wf[0, cuda.threadIdx.x // 32] = wm
        wf[1, cuda.threadIdx.x // 32] = ws
        wf[2, cuda.threadIdx.x // 32] = wl
    cuda.syncthreads()
    pm = wf[0, lane] if lane < nwarps else float32(NEG)    # every warp merges the warps' partials, lane i warp i's
    ps = wf[1, lane] if lane < nwarps else float32(0.0)
    pl = wf[2, lane] if lane < nwarps else float32(math.inf)
    hi = warp_max(pm, fbuf)
    return hi, warp_sum(ps * _exp(pm - hi), fbuf), warp_min(pl, fbuf)


# ------------------------------------------------------------------------------------------------ the threshold
@cuda.jit(device=True)
def _bin_of(val, lo, scale, nbins):
    """Histogram bin of a value over [lo, hi] (scale = nbins / (hi - lo)): monotone non-decreasing in val, clamped
    to [0, nbins) (selects, no branch); NaN products (-inf times a zero scale) land in bin 0."""
    t = (val - lo) * scale
    t = t if t > float32(0.0) else float32(0.0)
    return uint32(min(t, float32(nbins - 1)))


@cuda.jit(device=True)
def _crossing(hist, nbins, need, above, info, wi, ibuf, nthreads):
    """Scanning hist[0 .. nbins) from the top with a running count starting at ``above``, the bin b* where it first
    reaches ``need``: info[0] = b*, info[1] = above + count(bins > b*); unchanged if never reached. Thread t sums
    its bins [t per, t per + per) (per = nbins / nthreads, nthreads whole warps); a block suffix sum of those
    counts (primitives.block_suffix_sum through shared wi [warps], one barrier) gives the count above its bins,
    and the crossing thread walks them. Ends with a barrier. (A block-wide Hillis-Steele scan took 2 log2(threads)
    barriers.)"""
    tid = uint32(cuda.threadIdx.x)
    per = uint32(nbins // nthreads)
    b0 = tid * per
    c = int32(0)
    j = uint32(0)
    while j < per:                                         # unsigned while loops: see _sort_write
        c = int32(c + int32(hist[b0 + j]))
        j = uint32(j + uint32(1))
    run = int32(above + block_suffix_sum(c, wi, nthreads // 32, ibuf) - c)    # the count in the bins above t's
    if run < need and run + c >= need:
        b = b0 + per
        while b > b0:
            b = uint32(b - uint32(1))
            h = int32(hist[b])
            if run + h >= need:
                info[0] = b
                info[1] = run
                break
            run = int32(run + h)
    cuda.syncthreads()


# ------------------------------------------------------------------------------------------------ the sort
@cuda.jit(device=True)
def _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out):
    for r in range(tid, k, nthreads):
        v = int32(M32 - (cand[r] & uint64(M32)))
        ids_out[row, r] = v
        lp_out[row, r] = x[row, v] - lse


@cuda.jit(device=True)
def _sort_write(cand, n, x, k, lse, row, tid, nthreads, lp_out, ids_out, rank):
    """Write the k largest of the n <= CAP candidate composites in cand, in order. Up to RANK_SORT: a rank sort -
    each candidate counts the candidates above it (broadcast reads); with more threads than candidates, every
    thread takes a share of some candidate's count (shared atomics into rank [>= RANK_SORT] int32). Above: a
    bitonic network (cand complete: the callers' barrier after collecting)."""
    if n <= RANK_SORT:
        for i in range(tid, n, nthreads):
            rank[i] = 0
        cuda.syncthreads()
        if n > 0:
            # thread t counts for candidate i = t mod n, which has g_n = ceil((nthreads - i) / n) threads (at least
            # one: when n > nthreads, thread t also takes i + nthreads, ...); its share of j is the g-th of g_n
            i = tid % n
            while i < n:
                g_n = max((nthreads - i + n - 1) // n, 1)
                g = tid // n if n <= nthreads else 0
                per = (n + g_n - 1) // g_n
                c = cand[i]
                j = uint32(g * per)
                e = uint32(min(n, g * per + per))
                r = int32(0)
                while uint32(j + uint32(3)) < e:           # unsigned, unrolled by four (a range loop cost ~18
                    r = int32(r + int32(cand[j] > c) + int32(cand[j + uint32(1)] > c)      # instructions a compare)
                              + int32(cand[j + uint32(2)] > c) + int32(cand[j + uint32(3)] > c))
                    j = uint32(j + uint32(4))
                while j < e:
                    r = int32(r + int32(cand[j] > c))
                    j = uint32(j + uint32(1))
                cuda.atomic.add(rank, i, r)
                if n <= nthreads:
                    break
                i += nthreads
        cuda.syncthreads()
        for i in range(tid, n, nthreads):
            r = rank[i]
            if r < k:
                c = cand[i]
                vi = int32(M32 - (c & uint64(M32)))
                ids_out[row, r] = vi
                lp_out[row, r] = x[row, vi] - lse
        return
    bitonic_sort_desc(cand, n)
    _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out)
