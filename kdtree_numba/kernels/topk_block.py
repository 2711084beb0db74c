"""Top-K of a row of logits by one block: the one-block-per-row path of ``logprobs.topk_logprobs`` (the spec).

Mapping: one block per row (``_topk_kernel`` -> ``_topk_row``), ``block_threads(V)`` threads on a GPU (up to
MAX_THREADS = 512, at least 16 columns each; 32 on the simulator); the packed key, fold, merge, threshold and
sort are kernels/topk_common.py's.
  Pass 1 (eight loads issued per step, then folded): each thread folds its strided elements into a running (max,
  sum of exp) and two tops m, m2. Block reductions give lse and lo = the smallest m2; a NaN or +inf row gets NaN
  log-probs and -1 ids.
  Threshold: a 2048-bin (NBINS) shared histogram of the 2 x threads tops over [lo, max] finds the bin b* holding
  their k-th largest; every element of the row's top k lies in a bin >= b*. (Fewer than k values: b* = 0.)
  Pass 2 collects the elements in bins >= b* (typically k + a few percent: ~300 for k = 256, V = 163840) and sorts
  them (rank sort up to RANK_SORT = 1024, bitonic above).
  Overflow, when more than CAP = 4096 elements reach b* (long runs of equal values): one more pass keeps each
  thread's 4 largest composites (equal values ordered by index); after a bitonic sort of them, tau = the k-th,
  and if no thread's 4th lies above tau no thread dropped one of the top k (proof at the code).
  Last resort: radix refinement of the threshold key (a 2048-bin histogram of the top 11 key bits, a block scan
  for the bin holding the K-th value, refined by the next 11 and 10 bits while the candidates at or above it
  overflow the buffer), then collect and sort; when all 32 bits are fixed and ties at the threshold still
  overflow, the lowest-index ties are taken by an ordered scan (contiguous groups of TIE_GROUP per thread).
The split path (kernels/topk_split.py) runs ``_topk_row`` for a row whose candidates overflow its buffers.
Shapes: x [R, V] float32, bits = x.view(uint32), k <= min(V, 1024) -> lp_out [R, k] float32, ids_out [R, k]
int32; grid R blocks; shared memory ~37 KB (cand [CAP] uint64: 32 KB, scan [RANK_SORT] int32: 4 KB, the rest small).
Example: x [[0, 2, 2, -1]], k 3: every thread holds at most one element, so no thread has a second top (lo = +inf,
the histogram stays empty and b* = 0); pass 2 collects all four and the rank sort writes ids [1, 2, 0].
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from .. import backend
from .primitives import bitonic_sort_desc, smem_prefix_sum
from .topk_common import (_CAP_64, CAP, MAX_THREADS, MAX_WARPS, NBINS, NEG, RANK_SORT, _bin_of, _block_merge,
                          _composite, _crossing, _fold_range, _order_key, _sort_write, _write_topk)

TIE_GROUP = 16             # contiguous elements per thread in the ordered scan of threshold ties


# ------------------------------------------------------------------------------------------------ kernels
@cuda.jit(device=True)
def _topk_row(x, bits, k, lp_out, ids_out, row, cand, scan, wf, wi, fbuf, ibuf, info, lo_key):
    """The whole top-K of one row by one block (module docstring). Shared arrays: cand [CAP] uint64 (histogram /
    candidates), scan [RANK_SORT] int32, wf [3, MAX_WARPS] float32 / wi [MAX_WARPS] int32 (the warps' partials),
    fbuf / ibuf [32] (the simulator's warp collectives), info [4] int32 (0: threshold
    bin, 1: count above it, 2: candidates, 3: overflow flag), lo_key [1] uint32 (radix fallback: candidates are
    keys >= lo_key)."""
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    V = x.shape[1]

    # pass 1: running (max, sum of exp) and two tops per thread (see _fold_range)
    m, m2, ssum = _fold_range(x, row, 0, V, None, cuda.blockDim.x)
    if tid == 0:
        info[0] = 0
        info[1] = 0
        info[2] = 0
        info[3] = 0
    hi, total, lo = _block_merge(m, ssum, m2 if m2 > float32(NEG) else float32(math.inf), wf, fbuf, nthreads // 32)
    lse = hi + float32(math.log(total))
    if total != total:                            # a NaN or +inf in the row (see _fold_range)
        for r in range(tid, k, nthreads):
            lp_out[row, r] = float32(math.nan)
            ids_out[row, r] = -1
        return

    # threshold: the k-th largest of the 2 x threads values (m, m2) - values of distinct elements - bounds the
    # row's k-th largest from below. Located to a bin of a histogram over [lo, hi] (lo = the smallest m2):
    # every element of the top k lies in a bin >= b*, because the bin map is monotone.
    scale = float32(NBINS) / (hi - lo) if hi > lo and lo < float32(math.inf) else float32(0.0)
    for b in range(tid, NBINS, nthreads):
        cand[b] = uint64(0)
    cuda.syncthreads()
    if scale > float32(0.0):
        if m > float32(NEG):
            cuda.atomic.add(cand, _bin_of(m, lo, scale, NBINS), uint64(1))
        if m2 > float32(NEG):
            cuda.atomic.add(cand, _bin_of(m2, lo, scale, NBINS), uint64(1))
    cuda.syncthreads()
    _crossing(cand, NBINS, k, 0, info, wi, ibuf, nthreads)     # not reached (too few values): b* = 0, take all
    bstar = info[0]

    # pass 2: collect the elements in bins >= b* (composites: one unsigned compare orders value desc, index asc)
    v = tid
    while v < V:
        val = x[row, v]
        if _bin_of(val, lo, scale, NBINS) >= bstar and info[2] <= CAP:     # once overflowed, stop contending
            slot = cuda.atomic.add(info, 2, 1)
            if slot < CAP:
                cand[slot] = _composite(_order_key(bits[row, v]), v)
        v += nthreads
    cuda.syncthreads()
    n = info[2]
    if n <= CAP:
        _sort_write(cand, n, x, k, lse, row, tid, nthreads, lp_out, ids_out, scan)
        return
    cuda.syncthreads()

    # overflow (more than CAP elements reach the bin: long runs of equal values): each thread's 4 largest
    # composites - equal values ordered by index - are bitonic-sorted; tau = the k-th. If no thread's 4th lies
    # above tau, no thread dropped an element above tau (an element e of the top k missing from the local tops
    # was dropped below its thread's 4th c3 > e, and at most k - 1 local tops exceed e, so tau < e < c3).
    if k <= 4 * nthreads:
        c0 = uint64(0)
        c1 = uint64(0)
        c2 = uint64(0)
        c3 = uint64(0)
        for v in range(tid, V, nthreads):
            comp = _composite(_order_key(bits[row, v]), v)
            if comp > c3:
                c3 = comp
                if c3 > c2:
                    c2, c3 = c3, c2
                    if c2 > c1:
                        c1, c2 = c2, c1
                        if c1 > c0:
                            c0, c1 = c1, c0
        cand[4 * tid] = c0
        cand[4 * tid + 1] = c1
        cand[4 * tid + 2] = c2
        cand[4 * tid + 3] = c3
        if tid == 0:
            info[3] = 0
        cuda.syncthreads()
        bitonic_sort_desc(cand, 4 * nthreads)
        tau = cand[k - 1]
        if c3 > tau:
            info[3] = 1
        cuda.syncthreads()
        if info[3] == 0:
            _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out)
            return
        cuda.syncthreads()

    # last resort: radix refinement of the threshold key over levels of 11, 11, 10 bits (histogram in `cand`)
    prefix = uint32(0)          # fixed high bits of the threshold key
    above = 0                   # elements with key above the current prefix range
    shift = 32
    need_ties = 0
    for level in range(3):
        nb = 11 if level < 2 else 10
        shift -= nb
        for b in range(tid, NBINS, nthreads):
            cand[b] = uint64(0)
        cuda.syncthreads()
        for v in range(tid, V, nthreads):
            key = _order_key(bits[row, v])
            if level == 0 or (key >> uint32(shift + nb)) == prefix:
                cuda.atomic.add(cand, int32((key >> uint32(shift)) & uint32((1 << nb) - 1)), uint64(1))
        cuda.syncthreads()
        _crossing(cand, NBINS, k, above, info, wi, ibuf, nthreads)
        bstar = info[0]
        above = info[1]
        prefix = (prefix << uint32(nb)) | uint32(bstar)
        in_bin = int32(cand[bstar])
        cuda.syncthreads()
        if above + in_bin <= CAP:
            break
        if level == 2:
            need_ties = k - above          # all 32 bits fixed, ties overflow the buffer
    if tid == 0:
        lo_key[0] = prefix << uint32(shift)
        info[2] = 0
    cuda.syncthreads()

    # collect candidates key >= lo_key (or > it, plus the lowest-index ties, when ties overflow)
    threshold = lo_key[0]
    for v in range(tid, V, nthreads):
        key = _order_key(bits[row, v])
        if key > threshold or (key == threshold and need_ties == 0):
            slot = cuda.atomic.add(info, 2, 1)
            cand[slot] = _composite(key, v)
    cuda.syncthreads()
    if need_ties > 0:
        # ordered scan in spans of nthreads x TIE_GROUP elements: thread t counts the ties in its contiguous
        # group, a block prefix sum ranks the groups, and each thread writes its ties in index order
        base = 0
        for start in range(0, V, nthreads * TIE_GROUP):
            g0 = start + tid * TIE_GROUP
            g1 = min(g0 + TIE_GROUP, V)
            cnt = 0
            for v in range(g0, g1):
                if _order_key(bits[row, v]) == threshold:
                    cnt += 1
            before, total = smem_prefix_sum(cnt, scan)   # the span's ties before this thread's group, in all
            rank = base + before
            for v in range(g0, g1):
                if rank >= need_ties:
                    break
                if _order_key(bits[row, v]) == threshold:
                    cand[above + rank] = _composite(threshold, v)
                    rank += 1
            base += total
            cuda.syncthreads()
            if base >= need_ties:
                break
        if tid == 0:
            info[2] = k
        cuda.syncthreads()

    _sort_write(cand, info[2], x, k, lse, row, tid, nthreads, lp_out, ids_out, scan)


@cuda.jit(device=True)
def _row_scratch():
    """The shared arrays of the one-block algorithm (_topk_row), declared once for both kernels that run it:
    (cand, scan, wf, wi, fbuf, ibuf, info, lo_key)."""
    cand = cuda.shared.array(CAP, uint64)
    scan = cuda.shared.array(RANK_SORT, int32)        # block scans, and the ranks of the rank sort
    wf = cuda.shared.array((3, MAX_WARPS), float32)   # the warps' partials
    wi = cuda.shared.array(MAX_WARPS, int32)
    fbuf = cuda.shared.array(32, float32)              # scratch of the simulator's warp collectives
    ibuf = cuda.shared.array(32, int32)
    info = cuda.shared.array(4, int32)
    lo_key = cuda.shared.array(1, uint32)
    return cand, scan, wf, wi, fbuf, ibuf, info, lo_key


@cuda.jit(**_CAP_64)
def _topk_kernel(x, bits, k, lp_out, ids_out):
    cand, scan, wf, wi, fbuf, ibuf, info, lo_key = _row_scratch()
    _topk_row(x, bits, k, lp_out, ids_out, cuda.blockIdx.x, cand, scan, wf, wi, fbuf, ibuf, info, lo_key)


# ------------------------------------------------------------------------------------------------ launchers
def block_threads(V: int) -> int:
    """Threads of the one-block path for rows of V columns: a power of two in [32, MAX_THREADS] that gives every
    thread at least 16 columns (two fold steps) where V allows. A thread's second top (m2) comes from its second
    step of eight (``_fold_range``): with one step it has none, the histogram stays empty (lo = +inf), b* = 0 and
    all V columns become candidates for the bitonic sort - 512 threads on 15 x 4096 logits took 100 us that way,
    against ~64 candidates and a rank sort with 256 threads. Example: V = 4096 -> 256; V = 163840 -> 512."""
    t = 32
    while t < MAX_THREADS and 2 * t * 16 <= V:
        t *= 2
    return t


def _launch_block(x, k: int, lp, ids) -> None:
    """Top-K with one block per row of ``x [R, V]`` (arguments validated by ``logprobs.topk_logprobs``)."""
    threads = backend.block_size(block_threads(x.shape[1]), 32)
    backend.launch(_topk_kernel, x.shape[0], threads, x, x.view(np.uint32), k, lp, ids)
