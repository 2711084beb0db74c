"""Top-K with each row split over several blocks: the split-row path of ``logprobs.topk_logprobs`` (the spec),
for few, long rows.

Draft vocabularies leave too few rows to fill the GPU with one block each (a request's 15 rows use 15 of 132
SMs), so for V >= 2 x SPLIT_CHUNK each row is spread over S = ceil(V / SPLIT_CHUNK) blocks, and the logits are
read once, in two launches (``_launch_split``).
Mapping:
  scan (``_split_scan_kernel``: SPLIT_THREADS = 512 threads per chunk of SPLIT_CHUNK = 16384 columns, staged in
  64 KB of dynamic shared memory): pass 1, the block's bound t = the smallest thread top in the bin of the k-th
  largest top (t <= the block's k-th largest element), and the staged elements >= t (a superset of the block's
  top k) listed in shared memory (a 32-bit hit mask per thread, one shared atomic per warp: ``_append``), then
  written out coalesced into the row's candidates; more than limit = k + k/4 + 64 of them (large k) -> a
  histogram of those elements refines t first. Block reductions and scans are warp shuffles (primitives), seven
  barriers a block.
  select (``_split_select_kernel``, block per row): lse from the blocks' partials; candidates below lo = the
  largest block t are dropped (every t is <= the row's k-th largest); a histogram over [lo, max] gives the bin b*
  of the k-th largest candidate, and the candidates in bins >= b* are rank-sorted. A block that overflowed, or
  more than CAP candidates at b*, -> the one-block algorithm (``topk_block._topk_row``) for that row.
Invariant: every element of the row's top k is >= its block's t (at most k - 1 elements of the row, so of the
block, lie ahead of it), so the union of the candidate lists holds the top k.
Shapes: x [R, V] float32 -> lp [R, k] float32, ids [R, k] int32; scratch kept per (R, S, limit): part [R, S, 4]
float32 (block max, sum of exp, candidates listed, t), cand_v / cand_i [R, S x limit + 4 x MAX_THREADS] (value,
column), count [R] int32 (reset by the select).
Example: V = 163840, k = 256: S = 10 blocks per row; each lists its elements >= its t (at least its own top 256,
at most limit = 384, else it refines t); the select drops those below the largest t and sorts the ones in bins >= b*.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, int32, uint32, uint64

from .. import backend
from ._intrinsics import SIM, fmin
from .primitives import block_min, warp_bcast, warp_prefix_sum
from .topk_block import _row_scratch, _topk_row
from .topk_common import (_CAP_64, CAP, MAX_THREADS, NBINS, NEG, _bin_of, _block_merge, _composite, _crossing,
                          _fold_range, _order_key, _sort_write)

TOP_BINS = 1024            # bins of the split scan's thread-top histogram (2 x 512 tops)
SEL_BINS = 1024            # bins of the split select's candidate histogram (32-bit counters)
SPLIT_CHUNK = 16384        # columns per block when a row is split over several blocks (staged: 64 KB, dynamic)
SPLIT_THREADS = 32 if SIM else 512   # threads of the per-chunk blocks: whole warps, and on the simulator one warp
SPLIT_WARPS = SPLIT_THREADS // 32    # (its stand-ins for the warp collectives need block = warp, see primitives)


# ------------------------------------------------------------------------------------------------ scan: block per chunk
@cuda.jit(device=True)
def _append(stage, n_cols, t, pos, info, ibuf):
    """List the staged elements >= t: their positions go to pos[info[3] ...] (shared; counted past its NBINS
    entries, not stored). A thread takes its columns 32 at a time (tid + i threads, i < 32: one group is a whole
    16384-column chunk at 512 threads) and marks its hits in a 32-bit mask; a warp prefix sum of the masks'
    popcounts gives each thread its slots, the warp's last lane reserves the warp's total with one shared atomic,
    and each thread stores its hits by walking the mask's set bits: the warp takes as many rounds as its busiest
    lane has hits (1-4 at k = 256), not 32 compare-and-store steps. Loop bounds are tested on the warp's first
    column, so the warp stays converged for the collectives. Measured on [240, 163840], k = 256 (ncu): an atomic
    per thread and step of eight executed 25 M instructions, 25 % of the scan kernel's. (The block writes the list
    out coalesced afterwards: one 4-byte global store per candidate from a lone thread cost ~50 us there.)"""
    nt = uint64(SPLIT_THREADS)
    end = uint64(n_cols)
    lane = cuda.laneid
    j = uint64(cuda.threadIdx.x)
    first = j - uint64(lane)                               # the warp's first column
    while first < end:
        bits = uint32(0)
        if first + uint64(31) * nt + uint64(31) < end:    # the warp's whole group lies in the chunk
            for i in range(32):
                bits = uint32(bits | (uint32(stage[j + uint64(i) * nt] >= t) << uint32(i)))
        else:
            for i in range(32):
                v = j + uint64(i) * nt
                if v < end:
                    if stage[v] >= t:
                        bits = uint32(bits | (uint32(1) << uint32(i)))
        before, total = warp_prefix_sum(cuda.popc(bits), ibuf)
        if total > 0:
            base = int32(0)
            if lane == 31:
                base = cuda.atomic.add(info, 3, total)
            slot = uint32(warp_bcast(base, 31, ibuf) + before)
            while bits != uint32(0):
                i = uint64(cuda.ffs(bits) - 1)
                if slot < uint32(NBINS):
                    pos[slot] = uint32(j + i * nt)
                slot = uint32(slot + uint32(1))           # numba widens uint32 + uint32 to 64 bits
                bits = uint32(bits & (bits - uint32(1)))
        j += uint64(32) * nt
        first += uint64(32) * nt


@cuda.jit
def _split_scan_kernel(x, k, S, C, limit, part, cand_v, cand_i, count):
    """Block (row, s) of SPLIT_THREADS threads takes columns [s C, s C + C) of one row, read once from global
    memory into shared memory:
    1. each thread folds its columns (_fold_range) -> part[row, s, 0:2] = (block max, sum of exp(x - max));
    2. bound t: a histogram of the thread tops (m, m2) over [lo, hi] gives the bin of the block's k-th largest
       top (as in _topk_row), and t = the smallest top in that bin: t <= the block's k-th largest element;
    3. the staged elements >= t - a superset of the block's top k - are listed in shared memory (_append); if
       more than limit = k + k/4 + 64 reach t (large k: fewer tops than k), a histogram of those elements over
       [their smallest finite one, hi] gives a t <= the block's own k-th largest, and the list is redone;
    4. one global atomic reserves the list's range in the row's candidates (count[row]) and the block writes
       (value, column) there coalesced: cand_v / cand_i [row, base : base + n]. A block adds at most limit, so a
       row's S x limit slots never overflow; a block with more adds nothing and the select sees n > limit.
    part[row, s, 2:4] = (n, t; -inf when the block holds fewer than k elements). Every element of the row's top k
    is >= the t of its block, and no t exceeds the row's k-th largest. Seven barriers in all: block reductions
    and scans are warp collectives (primitives) plus one exchange of the warps' partials. The stage is dynamic
    shared memory (C floats, launched with shared = 4 C bytes): 64 KB is above the 48 KB of static arrays."""
    row = uint32(cuda.blockIdx.x) // uint32(S)          # 32-bit: a 64-bit division took 7 % of the instructions
    s = uint32(cuda.blockIdx.x) - row * uint32(S)
    tid = cuda.threadIdx.x
    stage = cuda.shared.array(0, float32)                  # dynamic: C floats (above the 48 KB of static arrays)
    hist = cuda.shared.array(NBINS, uint32)                # histograms, then the candidate list
    wf = cuda.shared.array((3, SPLIT_WARPS), float32)     # the warps' partials
    wi = cuda.shared.array(SPLIT_WARPS, int32)
    fbuf = cuda.shared.array(32, float32)                  # scratch of the simulator's warp collectives
    ibuf = cuda.shared.array(32, int32)
    info = cuda.shared.array(4, int32)
    start = s * C
    n_cols = min(x.shape[1], start + C) - start

    m, m2, ssum = _fold_range(x, row, start, start + n_cols, stage, SPLIT_THREADS)
    for i in range(TOP_BINS // SPLIT_THREADS):
        hist[tid + i * SPLIT_THREADS] = uint32(0)
    if tid == 0:
        info[0] = -1
        info[1] = 0
        info[2] = 0
        info[3] = 0
    hi, bsum, lo = _block_merge(m, ssum, m2 if m2 > float32(NEG) else float32(math.inf), wf, fbuf,
                                 SPLIT_WARPS)                                        # barrier 1
    if tid == 0:
        part[row, s, 0] = hi
        part[row, s, 1] = bsum
    if bsum != bsum:                              # NaN / +inf: the select kernel reports the row
        return

    # 2. the bound t (TOP_BINS bins: about one per thread top)
    scale = float32(TOP_BINS) / (hi - lo) if hi > lo and lo < float32(math.inf) else float32(0.0)
    if m > float32(NEG):
        cuda.atomic.add(hist, _bin_of(m, lo, scale, TOP_BINS), uint32(1))
    if m2 > float32(NEG):
        cuda.atomic.add(hist, _bin_of(m2, lo, scale, TOP_BINS), uint32(1))
    cuda.syncthreads()                                                                  # 2
    _crossing(hist, TOP_BINS, k, 0, info, wi, ibuf, SPLIT_THREADS)                      # 3, 4
    b = info[0]
    if b >= 0:                                    # (block-uniform)
        v = float32(math.inf)
        if m > float32(NEG) and _bin_of(m, lo, scale, TOP_BINS) == b:
            v = m
        if m2 > float32(NEG) and _bin_of(m2, lo, scale, TOP_BINS) == b:
            v = fmin(v, m2)
        t = block_min(v, wf[2], SPLIT_WARPS, fbuf)                                        # 5
    else:
        t = float32(-math.inf)

    # 3. list the candidates (hist is free after the crossing)
    _append(stage, n_cols, t, hist, info, ibuf)
    cuda.syncthreads()                                                                  # 6
    n = info[3]
    if n > limit:
        cuda.syncthreads()                        # everyone has read info[3]
        lo2 = float32(math.inf)                   # the smallest finite element >= t, then a histogram over [lo2, hi]
        for j in range(tid, n_cols, SPLIT_THREADS):
            val = stage[j]
            if val >= t and val > float32(-math.inf):
                lo2 = fmin(lo2, val)
        for i in range(tid, NBINS, SPLIT_THREADS):
            hist[i] = uint32(0)
        if tid == 0:
            info[0] = -1
            info[3] = 0
        lo2 = block_min(lo2, wf[2], SPLIT_WARPS, fbuf)
        scale2 = float32(NBINS) / (hi - lo2) if hi > lo2 and lo2 < float32(math.inf) else float32(0.0)
        for j in range(tid, n_cols, SPLIT_THREADS):
            val = stage[j]
            if val >= t:
                cuda.atomic.add(hist, _bin_of(val, lo2, scale2, NBINS), uint32(1))
        cuda.syncthreads()
        _crossing(hist, NBINS, k, 0, info, wi, ibuf, SPLIT_THREADS)   # reached: more than k elements are counted
        b = info[0]
        v = float32(math.inf)                 # the smallest element of bin b (-inf too: then t = -inf, see below)
        for j in range(tid, n_cols, SPLIT_THREADS):
            val = stage[j]
            if val >= t and _bin_of(val, lo2, scale2, NBINS) == b:
                v = fmin(v, val)
        t = block_min(v, wf[2], SPLIT_WARPS, fbuf)
        _append(stage, n_cols, t, hist, info, ibuf)
        cuda.syncthreads()
        n = info[3]
        # a block whose k-th largest is -inf keeps t = -inf and lists everything: n > limit, the row overflows

    # 4. write the list out
    if tid == 0:
        part[row, s, 2] = float32(n)
        part[row, s, 3] = t
        info[1] = cuda.atomic.add(count, row, n) if n <= limit else 0
    cuda.syncthreads()                                                                  # 7
    if n <= limit:
        base = uint64(info[1])
        r = uint64(row)                           # unsigned indices: no negative-index wraparound code
        i = uint64(tid)
        while i < uint64(n):
            j = hist[i]
            cand_v[r, base + i] = stage[j]
            cand_i[r, base + i] = start + int32(j)
            i += uint64(SPLIT_THREADS)


# ------------------------------------------------------------------------------------------------ select: block per row
@cuda.jit(device=True)
def _cand_use(val, i, lo, scale, bstar, cand_i, bits, row, hist, cand, info):
    """bstar < 0: count val in the histogram hist (SEL_BINS); else collect slot i's composite into cand when val
    reaches bin bstar."""
    if val >= lo:
        b = _bin_of(val, lo, scale, SEL_BINS)
        if bstar < 0:
            cuda.atomic.add(hist, b, 1)
        elif b >= bstar:
            slot = cuda.atomic.add(info, 2, 1)
            if slot < CAP:
                v = cand_i[row, i]
                cand[slot] = _composite(_order_key(bits[row, v]), v)


@cuda.jit(device=True)
def _cand_pass(cand_v, cand_i, bits, row, n, lo, scale, bstar, hist, cand, info):
    """One pass over a row's n candidates, four independent loads per step (the buffer is padded by 4 x threads;
    slots past n read as NaN, which no comparison passes; see _cand_use)."""
    nt = uint32(cuda.blockDim.x)
    e = uint32(n)
    i = uint32(cuda.threadIdx.x)
    nan = float32(math.nan)
    while i < e:
        v0 = cand_v[row, i]
        v1 = cand_v[row, i + nt]
        v2 = cand_v[row, i + uint32(2) * nt]
        v3 = cand_v[row, i + uint32(3) * nt]
        _cand_use(v0, i, lo, scale, bstar, cand_i, bits, row, hist, cand, info)
        _cand_use(v1 if i + nt < e else nan, i + nt, lo, scale, bstar, cand_i, bits, row, hist, cand, info)
        _cand_use(v2 if i + uint32(2) * nt < e else nan, i + uint32(2) * nt, lo, scale, bstar, cand_i, bits, row,
                  hist, cand, info)
        _cand_use(v3 if i + uint32(3) * nt < e else nan, i + uint32(3) * nt, lo, scale, bstar, cand_i, bits, row,
                  hist, cand, info)
        i += uint32(4) * nt


@cuda.jit(**_CAP_64)
def _split_select_kernel(x, bits, k, limit, part, cand_v, cand_i, count, lp_out, ids_out):
    """Block per row: lse from the S partials; lo = the largest block bound t (<= the row's k-th largest, so
    candidates below it are dropped); the k-th largest candidate's bin b* in a histogram over [lo, hi]; the
    candidates in bins >= b* sorted and the top k written. NaN / +inf rows -> NaN / -1; a row where a block
    overflowed (more than limit candidates), or more than CAP candidates reach b*, runs the one-block algorithm
    (_topk_row). Resets count[row] for the next call. cand_v / cand_i are padded by 4 x threads past S x limit
    (the passes load four slots per step before testing them)."""
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    cand, scan, wf, wi, fbuf, ibuf, info, lo_key = _row_scratch()
    hist = cuda.shared.array(SEL_BINS, int32)
    S = part.shape[1]
    n = count[row]
    m = float32(NEG)
    ssum = float32(0.0)
    lo = float32(-math.inf)
    over = 0
    for i in range(tid, S, nt):
        pm = part[row, i, 0]
        mx = max(m, pm)
        ssum = ssum * float32(math.exp(m - mx)) + part[row, i, 1] * float32(math.exp(pm - mx))
        m = mx
        if part[row, i, 2] > float32(limit):
            over = 1
        lo = max(lo, part[row, i, 3])
    for b in range(tid, SEL_BINS, nt):
        hist[b] = 0
    if tid == 0:
        info[0] = 0
        info[1] = 0
        info[2] = 0
        info[3] = 0
    over = cuda.syncthreads_or(over)
    if tid == 0:
        count[row] = 0
    hi, total, neg_lo = _block_merge(m, ssum, -lo, wf, fbuf, nt // 32)    # the minimum of -t is minus the largest t
    lse = hi + float32(math.log(total))
    lo = -neg_lo
    if total != total:
        for r in range(tid, k, nt):
            lp_out[row, r] = float32(math.nan)
            ids_out[row, r] = -1
        return
    if not over:
        scale = float32(SEL_BINS) / (hi - lo) if hi > lo and lo > float32(-math.inf) else float32(0.0)
        _cand_pass(cand_v, cand_i, bits, row, n, lo, scale, -1, hist, cand, info)
        cuda.syncthreads()
        _crossing(hist, SEL_BINS, k, 0, info, wi, ibuf, nt)
        _cand_pass(cand_v, cand_i, bits, row, n, lo, scale, info[0], hist, cand, info)
        cuda.syncthreads()
        nc = info[2]
        if nc <= CAP:
            _sort_write(cand, nc, x, k, lse, row, tid, nt, lp_out, ids_out, scan)
            return
    cuda.syncthreads()                            # everyone has read wf and info before _topk_row reuses them
    _topk_row(x, bits, k, lp_out, ids_out, row, cand, scan, wf, wi, fbuf, ibuf, info, lo_key)


# ------------------------------------------------------------------------------------------------ launchers
_split_scratch: dict = {}    # (R, S, limit) -> preallocated buffers (kept: CUDA graphs replay their addresses)


def _launch_split(x, k: int, lp, ids, chunk: int = SPLIT_CHUNK) -> None:
    """Top-K with each row split over ceil(V / chunk) blocks (chunk <= SPLIT_CHUNK): one streaming launch and one
    select launch (see the split kernels)."""
    R, V = x.shape
    if not 0 < chunk <= SPLIT_CHUNK:
        raise ValueError(f"chunk: {chunk} is out of range; expected 1..{SPLIT_CHUNK}")
    S = -(-V // chunk)
    limit = k + k // 4 + 64                        # candidates per block at most (else the block refines)
    key = (R, S, limit)
    if key not in _split_scratch:
        width = S * limit + 4 * MAX_THREADS        # padded: the select kernel loads 4 x threads slots per step
        e = backend.empty
        count = e((R,), np.int32)
        count[...] = 0                             # the select kernel resets it after every use
        _split_scratch[key] = (e((R, S, 4), np.float32), e((R, width), np.float32), e((R, width), np.int32), count)
    part, cand_v, cand_i, count = _split_scratch[key]
    backend.launch(_split_scan_kernel, R * S, SPLIT_THREADS, x, k, S, chunk, limit, part, cand_v, cand_i, count,
                   shared=4 * chunk)
    backend.launch(_split_select_kernel, R, backend.block_size(MAX_THREADS, 32), x, x.view(np.uint32), k, limit,
                   part, cand_v, cand_i, count, lp, ids)
