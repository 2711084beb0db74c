"""Draft log-probabilities with top-K, and the token choice at target logits (argmax or seeded sampling).

**topk_logprobs** - per row of draft logits (a depth of one request):
    lse = max + log(sum(exp(x - max)))        (fp32, like torch.log_softmax on fp32)
    ids[r] = the r-th largest logit's token (equal logits: lower token id first),  lp[r] = x[ids[r]] - lse
Draft logits are never divided by the temperature.
Mapping: one block per row; every (value, index) is packed as ``order_key << 32 | ~index`` (the float's bits
flipped so that unsigned order = float order), so one unsigned compare orders by (value desc, index asc) and no
two elements tie.
  Pass 1 (four independent loads per step): each thread folds its strided elements into a running (max, sum of
  exp) and keeps its two largest values m, m2. Block reductions give lse and lo = the smallest m2.
  Threshold: the 2 x threads values (m, m2) belong to distinct elements, so their k-th largest bounds the row's
  k-th largest from below. A 2048-bin shared histogram of them over [lo, max] finds the bin b* holding it; the
  bin map is monotone, so every element of the row's top k lies in a bin >= b*. (Fewer than k values: b* = 0.)
  Pass 2 collects the elements in bins >= b* (typically k + a few percent: ~300 for k = 256, V = 163840) and sorts
  them: a rank sort (each candidate counts those above it; no barriers) up to RANK_SORT, a bitonic network above.
  Overflow, when more than CAP = 4096 elements reach b* (long runs of equal values): one more pass keeps each
  thread's 4 largest composites (equal values ordered by index); after a bitonic sort of them, tau = the k-th,
  and if no thread's 4th lies above tau no thread dropped one of the top k (proof at the code).
  Last resort: radix refinement of the threshold key (a 2048-bin histogram of the top 11 key bits, a block scan
  for the bin holding the K-th value, refined by the next 11 and 10 bits while the candidates at or above it
  overflow the buffer), then collect and sort; when all 32 bits are fixed and ties at the threshold still
  overflow, the lowest-index ties are taken by an ordered scan (contiguous groups of TIE_GROUP per thread).
Split rows (V >= 2 x SPLIT_CHUNK, i.e. draft vocabularies): too few rows to fill the GPU with one block each (a
request's 15 rows use 15 of 132 SMs), so each row is spread over ceil(V / SPLIT_CHUNK) blocks in four launches:
stats (pass 1 per chunk: thread tops, per-block max and sum of exp), threshold (per row: lse, histogram, b*),
collect (pass 2 per chunk into a per-row buffer) and select (per row: sort, or on overflow the one-block
algorithm). The proof is unchanged: the thread tops of all chunks are values of distinct elements.
History (163840 columns, k = 256, H200; 15 rows / 240 rows): a histogram of every value: - / 690 us (shared
atomics on the few hot bins of a peaked row serialise); 4 local tops per thread + a 4096-entry bitonic sort + a
counting pass: 229 / 505 us; thresholded, one block per row: 105 / 280 us; split: 56 / 237 us.
Shapes: logits [R, V] float32 (rows = requests x depths), K <= 1024 -> lp [R, K] float32, ids [R, K] int32.
Example: logits [[0, 2, 2, -1]], K 3 -> ids [[1, 2, 0]], lp = [2, 2, 0] - log(1 + 2 e^2 + e^-1)

**choose_tokens** - a token at every row of target logits (one row per tree node or decode step):
T = 0: argmax (lowest id on ties). T > 0: a sample from softmax(x / T) by the Gumbel-max trick,
    token = argmax_v (x[v] / T + g[v]),   g[v] = -log(-log(u)),   u = hash(seed, stream, row, v) in (0, 1)
from Philox4x32-10, a counter-based generator (no RNG state: a run is reproducible from its seed, every
(token, row, stream) counter gets an independent draw, and the reference computes the same u). A row holding NaN gives token -1, which the decode loop turns into an error.
Mapping: one block per row, strided loop + shared (value, index) arg-max reduction.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32, uint32, uint64

from .. import backend
from . import _checks

MAX_K = 1024
HIST_BITS = 11
NBINS = 1 << HIST_BITS
CAP = 4096                 # candidate buffer (shared): >= MAX_K, >= NBINS
RANK_SORT = 1024           # up to this many candidates: rank sort (no barriers); above: bitonic
TIE_GROUP = 16             # contiguous elements per thread in the ordered scan of threshold ties
SPLIT_CHUNK = 16384        # columns per block when a row is split over several blocks
SPLIT_THREADS = 256        # threads of the per-chunk blocks
MAX_THREADS = 1024
M32 = 0xFFFFFFFF


# ------------------------------------------------------------------------------------------------ references
def order_keys(x: np.ndarray) -> np.ndarray:
    """uint32 keys whose unsigned order is the float32 order (NaN aside)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    u = np.where(u == 0x80000000, np.uint32(0), u)                  # -0.0 orders as +0.0
    return np.where(u & 0x80000000, ~u, u | 0x80000000).astype(np.uint32)


def topk_logprobs_ref(logits, k: int):
    """Plain NumPy: (lp [R, K] float32, ids [R, K] int32), ids sorted by (logit desc, id asc)."""
    x = np.asarray(logits, np.float32)
    m = x.max(axis=-1, keepdims=True)
    lse = m + np.log(np.sum(np.exp(x - m), axis=-1, keepdims=True, dtype=np.float32))     # [R, 1]
    ids = np.argsort(-x, axis=-1, kind="stable")[..., :k].astype(np.int32)               # [R, K]
    lp = (np.take_along_axis(x, ids, axis=-1) - lse).astype(np.float32)
    return lp, ids


PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


def philox_ref(c0, c1, c2, c3, k0: int, k1: int):
    """Philox4x32-10 (Salmon et al. 2011, as in cuRAND): first output word of counter (c0..c3) under key (k0, k1).
    Counters may be uint64 arrays holding 32-bit values; every product fits in 64 bits."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    m0, m1, mask = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1]), np.uint64(M32)
    for _ in range(10):
        p0, p1 = m0 * c0, m1 * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + np.uint64(PHILOX_W[0])) & mask, (k1 + np.uint64(PHILOX_W[1])) & mask
    return c0


def uniforms_ref(seed: int, stream: int, row: int, n: int) -> np.ndarray:
    """The sampler's u in (0, 1) for tokens 0..n-1 of one row (float64); identical to the kernel's:
    u = (philox(counter = (token, row, stream, 0), key = seed) + 0.5) / 2^32."""
    v = np.arange(n, dtype=np.uint64)
    z = np.zeros(n, np.uint64)
    h = philox_ref(v, z + np.uint64(row & M32), z + np.uint64(stream & M32), z, seed & M32, (seed >> 32) & M32)
    return (h.astype(np.float64) + 0.5) / 4294967296.0


def choose_tokens_ref(logits, temperature: float, seed: int = 0, stream: int = 0):
    """T == 0: argmax (first max); T > 0: Gumbel-max sample with the counter-based uniforms. NaN rows -> -1."""
    x = np.asarray(logits, np.float32)
    out = np.empty(x.shape[0], np.int32)
    for r in range(x.shape[0]):
        if np.isnan(x[r]).any():
            out[r] = -1
        elif temperature == 0:
            out[r] = int(np.argmax(x[r]))
        else:
            g = -np.log(-np.log(uniforms_ref(seed, stream, r, x.shape[1])))
            out[r] = int(np.argmax(x[r].astype(np.float64) / temperature + g))
    return out


def check_rows(x: np.ndarray, arg: str) -> None:
    """ValueError naming the first row with a NaN or without any finite value."""
    bad = np.isnan(x).any(axis=1)
    if bad.any():
        raise ValueError(f"{arg}: row {int(np.flatnonzero(bad)[0])} contains NaN")
    empty = ~(x > -np.inf).any(axis=1)
    if empty.any():
        raise ValueError(f"{arg}: row {int(np.flatnonzero(empty)[0])} has no finite value (all -inf)")


# ------------------------------------------------------------------------------------------------ device helpers
@cuda.jit(device=True)
def _order_key(u):
    """float32 bit pattern (uint32) -> key whose unsigned order is the float order (-0.0 counts as +0.0)."""
    if u == uint32(0x80000000):
        u = uint32(0)
    if u & uint32(0x80000000):
        return ~u
    return u | uint32(0x80000000)


@cuda.jit(device=True)
def _philox_u(v, row, stream, k0, k1):
    """u in (0, 1) from Philox4x32-10 of counter (v, row, stream, 0) and key (k0, k1) (see philox_ref)."""
    c0 = uint64(v)
    c1 = uint64(row)
    c2 = uint64(stream)
    c3 = uint64(0)
    mask = uint64(M32)
    for _ in range(10):
        p0 = uint64(PHILOX_M[0]) * c0
        p1 = uint64(PHILOX_M[1]) * c2
        n0 = (p1 >> uint64(32)) ^ c1 ^ k0
        n2 = (p0 >> uint64(32)) ^ c3 ^ k1
        c1 = p1 & mask
        c3 = p0 & mask
        c0 = n0
        c2 = n2
        k0 = (k0 + uint64(PHILOX_W[0])) & mask
        k1 = (k1 + uint64(PHILOX_W[1])) & mask
    return (float64(c0) + 0.5) / 4294967296.0


@cuda.jit(device=True)
def _block_suffix_scan(buf, tid, nthreads):
    """In place: buf[t] <- sum of buf[t .. nthreads-1] (Hillis-Steele, log2(nthreads) barriers)."""
    step = 1
    while step < nthreads:
        add = buf[tid + step] if tid + step < nthreads else 0
        cuda.syncthreads()
        buf[tid] += add
        cuda.syncthreads()
        step *= 2


@cuda.jit(device=True)
def _bitonic_desc(keys, n_pad, tid, nthreads):
    """Sort keys[0 .. n_pad) descending (n_pad a power of two), all threads of the block."""
    size = 2
    while size <= n_pad:
        stride = size // 2
        while stride > 0:
            for i in range(tid, n_pad, nthreads):
                j = i ^ stride
                if j > i:
                    a = keys[i]
                    b = keys[j]
                    if (i & size) == 0:
                        if a < b:
                            keys[i] = b
                            keys[j] = a
                    elif a > b:
                        keys[i] = b
                        keys[j] = a
            cuda.syncthreads()
            stride //= 2
        size *= 2


# ------------------------------------------------------------------------------------------------ kernels
@cuda.jit(device=True)
def _composite(key, v):
    """(key, index) -> one uint64 whose descending order is (value desc, index asc); never 0 for a real value."""
    return (uint64(key) << uint64(32)) | uint64(M32 - v)


@cuda.jit(device=True)
def _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out):
    for r in range(tid, k, nthreads):
        v = int32(M32 - (cand[r] & uint64(M32)))
        ids_out[row, r] = v
        lp_out[row, r] = x[row, v] - lse


@cuda.jit(device=True)
def _fold(val, m, m2, ssum, nan):
    """Fold one element into a thread's running max m (also the softmax shift), second largest m2 (a second
    element: equal values count twice) and sum of exp(x - m)."""
    if val != val:
        return m, m2, ssum, 1
    if val > m:
        ssum = ssum * float32(math.exp(m - val)) + float32(1.0)
        m2 = m
        m = val
    else:
        if val > m2:
            m2 = val
        if val != float32(-math.inf):
            ssum += float32(math.exp(val - m))
    return m, m2, ssum, nan


@cuda.jit(device=True)
def _bin_of(val, lo, scale):
    """Histogram bin of a value over [lo, hi]: monotone non-decreasing in val, clamped to [0, NBINS)."""
    t = (val - lo) * scale
    if t >= float32(NBINS - 1):
        return NBINS - 1
    if t > float32(0.0):
        return int32(t)
    return 0


@cuda.jit(device=True)
def _find_crossing(hist, need, above, scan, info, tid, nthreads):
    """Scanning the bins hist[0..NBINS) from the top, the bin b* where the running count (starting at ``above``)
    first reaches ``need``: info[0] = b*, info[1] = above + count(bins > b*). Unchanged if never reached.
    Per-thread sums of a contiguous bin range, a suffix scan over threads, then the crossing thread walks its
    range."""
    per = (NBINS + nthreads - 1) // nthreads
    b0 = tid * per
    c = 0
    for b in range(b0, min(b0 + per, NBINS)):
        c += int32(hist[b])
    scan[tid] = c
    cuda.syncthreads()
    _block_suffix_scan(scan, tid, nthreads)
    run = above + (scan[tid + 1] if tid + 1 < nthreads else 0)
    if run < need and run + c >= need:
        b = min(b0 + per, NBINS) - 1
        while b >= b0:
            if run + int32(hist[b]) >= need:
                info[0] = b
                info[1] = run
                break
            run += int32(hist[b])
            b -= 1
    cuda.syncthreads()


@cuda.jit(device=True)
def _merge_lse(red_m, red_s, tid, nthreads):
    """Block tree merge of per-thread (max, sum of exp(x - max)) pairs: afterwards red_m[0], red_s[0] hold the
    block's (max, sum of exp(x - max)) (log-sum-exp = max + log(sum))."""
    stride = nthreads // 2
    while stride > 0:
        if tid < stride:
            m1 = red_m[tid]
            m3 = red_m[tid + stride]
            mx = max(m1, m3)
            if mx == float32(-math.inf):
                red_s[tid] = red_s[tid] + red_s[tid + stride]
            else:
                red_s[tid] = red_s[tid] * float32(math.exp(m1 - mx)) + red_s[tid + stride] * float32(math.exp(m3 - mx))
            red_m[tid] = mx
        cuda.syncthreads()
        stride //= 2


@cuda.jit(device=True)
def _sort_write(cand, n, x, k, lse, row, tid, nthreads, lp_out, ids_out):
    """Write the k largest of the n <= CAP candidate composites in cand, in order: a rank sort (each candidate
    counts the candidates above it; broadcast reads, no barriers) up to RANK_SORT, a bitonic network above."""
    if n <= RANK_SORT:
        for i in range(tid, n, nthreads):
            c = cand[i]
            r = 0
            for j in range(n):
                if cand[j] > c:
                    r += 1
            if r < k:
                vi = int32(M32 - (c & uint64(M32)))
                ids_out[row, r] = vi
                lp_out[row, r] = x[row, vi] - lse
        return
    n_pad = 1
    while n_pad < n:
        n_pad *= 2
    for i in range(n + tid, n_pad, nthreads):
        cand[i] = uint64(0)
    cuda.syncthreads()
    _bitonic_desc(cand, n_pad, tid, nthreads)
    _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out)


@cuda.jit(device=True)
def _topk_row(x, bits, k, lp_out, ids_out, row, cand, scan, red_m, red_s, info, lo_key):
    """The whole top-K of one row by one block (module docstring). Shared arrays: cand [CAP] uint64 (histogram /
    candidates), scan / red_m / red_s [MAX_THREADS], info [4] int32 (0: threshold bin, 1: count above it,
    2: candidates, 3: has NaN), lo_key [1] uint32 (radix fallback: candidates are keys >= lo_key)."""
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    V = x.shape[1]

    # pass 1: running (max, sum of exp) and the two largest values of each thread's strided elements; four
    # independent loads per step keep enough bytes in flight
    m = float32(-math.inf)
    m2 = float32(-math.inf)
    ssum = float32(0.0)
    nan = 0
    v = tid
    while v + 3 * nthreads < V:
        a0 = x[row, v]
        a1 = x[row, v + nthreads]
        a2 = x[row, v + 2 * nthreads]
        a3 = x[row, v + 3 * nthreads]
        m, m2, ssum, nan = _fold(a0, m, m2, ssum, nan)
        m, m2, ssum, nan = _fold(a1, m, m2, ssum, nan)
        m, m2, ssum, nan = _fold(a2, m, m2, ssum, nan)
        m, m2, ssum, nan = _fold(a3, m, m2, ssum, nan)
        v += 4 * nthreads
    while v < V:
        m, m2, ssum, nan = _fold(x[row, v], m, m2, ssum, nan)
        v += nthreads
    red_m[tid] = m
    red_s[tid] = ssum
    if tid == 0:
        info[0] = 0
        info[1] = 0
        info[2] = 0
        info[3] = 0
    cuda.syncthreads()
    if nan:
        info[3] = 1
    _merge_lse(red_m, red_s, tid, nthreads)
    hi = red_m[0]
    lse = hi + float32(math.log(red_s[0]))
    if info[3]:
        for r in range(tid, k, nthreads):
            lp_out[row, r] = float32(math.nan)
            ids_out[row, r] = -1
        return
    cuda.syncthreads()

    # threshold: the k-th largest of the 2 x threads values (m, m2) - values of distinct elements - bounds the
    # row's k-th largest from below. Located to a bin of a histogram over [lo, hi] (lo = the smallest finite m2):
    # every element of the top k lies in a bin >= b*, because the bin map is monotone.
    red_m[tid] = m2 if m2 > float32(-math.inf) else float32(math.inf)
    cuda.syncthreads()
    stride = nthreads // 2
    while stride > 0:
        if tid < stride:
            red_m[tid] = min(red_m[tid], red_m[tid + stride])
        cuda.syncthreads()
        stride //= 2
    lo = red_m[0]
    scale = float32(NBINS) / (hi - lo) if hi > lo and lo < float32(math.inf) else float32(0.0)
    for b in range(tid, NBINS, nthreads):
        cand[b] = uint64(0)
    cuda.syncthreads()
    if scale > float32(0.0):
        if m > float32(-math.inf):
            cuda.atomic.add(cand, _bin_of(m, lo, scale), uint64(1))
        if m2 > float32(-math.inf):
            cuda.atomic.add(cand, _bin_of(m2, lo, scale), uint64(1))
    cuda.syncthreads()
    _find_crossing(cand, k, 0, scan, info, tid, nthreads)     # not reached (too few values): b* = 0, take all
    bstar = info[0]

    # pass 2: collect the elements in bins >= b* (composites: one unsigned compare orders value desc, index asc)
    v = tid
    while v < V:
        val = x[row, v]
        if _bin_of(val, lo, scale) >= bstar and info[2] <= CAP:     # once overflowed, stop contending
            slot = cuda.atomic.add(info, 2, 1)
            if slot < CAP:
                cand[slot] = _composite(_order_key(bits[row, v]), v)
        v += nthreads
    cuda.syncthreads()
    n = info[2]
    if n <= CAP:
        _sort_write(cand, n, x, k, lse, row, tid, nthreads, lp_out, ids_out)
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
        _bitonic_desc(cand, 4 * nthreads, tid, nthreads)
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
        _find_crossing(cand, k, above, scan, info, tid, nthreads)
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
        # group, a block suffix scan ranks the groups, and each thread writes its ties in index order
        base = 0
        for start in range(0, V, nthreads * TIE_GROUP):
            g0 = start + tid * TIE_GROUP
            g1 = min(g0 + TIE_GROUP, V)
            cnt = 0
            for v in range(g0, g1):
                if _order_key(bits[row, v]) == threshold:
                    cnt += 1
            scan[tid] = cnt
            cuda.syncthreads()
            _block_suffix_scan(scan, tid, nthreads)       # suffix counts: rank from the end of the span
            total = scan[0]
            rank = base + total - scan[tid]               # ties before this thread's group
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

    n = info[2]
    n_pad = 1
    while n_pad < n:
        n_pad *= 2
    for i in range(n + tid, n_pad, nthreads):
        cand[i] = uint64(0)
    cuda.syncthreads()
    _bitonic_desc(cand, n_pad, tid, nthreads)
    _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out)


@cuda.jit
def _topk_kernel(x, bits, k, lp_out, ids_out):
    cand = cuda.shared.array(CAP, uint64)
    scan = cuda.shared.array(MAX_THREADS, int32)
    red_m = cuda.shared.array(MAX_THREADS, float32)
    red_s = cuda.shared.array(MAX_THREADS, float32)
    info = cuda.shared.array(4, int32)
    lo_key = cuda.shared.array(1, uint32)
    _topk_row(x, bits, k, lp_out, ids_out, cuda.blockIdx.x, cand, scan, red_m, red_s, info, lo_key)


# --- several blocks per row: the same algorithm split into four launches, for rows too few to fill the GPU ---
@cuda.jit
def _split_stats_kernel(x, S, C, part, tops):
    """Block (row, s) folds columns [s C, s C + C): per thread (max, second max) -> tops[row, s * threads + tid];
    per block (max, sum of exp, has NaN) -> part[row, s, :]."""
    row = cuda.blockIdx.x // S
    s = cuda.blockIdx.x - row * S
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    red_m = cuda.shared.array(SPLIT_THREADS, float32)
    red_s = cuda.shared.array(SPLIT_THREADS, float32)
    flag = cuda.shared.array(1, int32)
    end = min(x.shape[1], s * C + C)
    m = float32(-math.inf)
    m2 = float32(-math.inf)
    ssum = float32(0.0)
    nan = 0
    v = s * C + tid
    while v + 3 * nthreads < end:
        a0 = x[row, v]
        a1 = x[row, v + nthreads]
        a2 = x[row, v + 2 * nthreads]
        a3 = x[row, v + 3 * nthreads]
        m, m2, ssum, nan = _fold(a0, m, m2, ssum, nan)
        m, m2, ssum, nan = _fold(a1, m, m2, ssum, nan)
        m, m2, ssum, nan = _fold(a2, m, m2, ssum, nan)
        m, m2, ssum, nan = _fold(a3, m, m2, ssum, nan)
        v += 4 * nthreads
    while v < end:
        m, m2, ssum, nan = _fold(x[row, v], m, m2, ssum, nan)
        v += nthreads
    tops[row, s * nthreads + tid, 0] = m
    tops[row, s * nthreads + tid, 1] = m2
    red_m[tid] = m
    red_s[tid] = ssum
    if tid == 0:
        flag[0] = 0
    cuda.syncthreads()
    if nan:
        flag[0] = 1
    _merge_lse(red_m, red_s, tid, nthreads)
    if tid == 0:
        part[row, s, 0] = red_m[0]
        part[row, s, 1] = red_s[0]
        part[row, s, 2] = float32(flag[0])


@cuda.jit
def _split_threshold_kernel(part, tops, k, thr, count):
    """Block per row: lse from the S partials; the histogram bin b* of the k-th largest thread top (as in
    _topk_row) -> thr[row, :] = (lse, lo, scale, b*, has NaN); count[row] = 0."""
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    S = part.shape[1]
    n_tops = tops.shape[1]                    # tops [R, S * threads, 2]: (max, second max) of every thread
    hist = cuda.shared.array(NBINS, uint64)
    scan = cuda.shared.array(MAX_THREADS, int32)
    red_m = cuda.shared.array(MAX_THREADS, float32)
    red_s = cuda.shared.array(MAX_THREADS, float32)
    info = cuda.shared.array(2, int32)
    # lse: fold the partials (thread t takes partials t, t + nthreads, ...), then the block merge
    m = float32(-math.inf)
    ssum = float32(0.0)
    nan = float32(0.0)
    for i in range(tid, S, nthreads):
        pm = part[row, i, 0]
        ps = part[row, i, 1]
        nan = max(nan, part[row, i, 2])
        mx = max(m, pm)
        if mx != float32(-math.inf):
            ssum = ssum * float32(math.exp(m - mx)) + ps * float32(math.exp(pm - mx))
        m = mx
    red_m[tid] = m
    red_s[tid] = ssum
    if tid == 0:
        info[0] = 0
        info[1] = 0
    cuda.syncthreads()
    _merge_lse(red_m, red_s, tid, nthreads)
    hi = red_m[0]
    lse = hi + float32(math.log(red_s[0]))
    cuda.syncthreads()
    # lo = the smallest finite second max
    lo = float32(math.inf)
    for i in range(tid, n_tops, nthreads):
        t2 = tops[row, i, 1]
        if t2 > float32(-math.inf):
            lo = min(lo, t2)
    red_m[tid] = lo
    cuda.syncthreads()
    stride = nthreads // 2
    while stride > 0:
        if tid < stride:
            red_m[tid] = min(red_m[tid], red_m[tid + stride])
        cuda.syncthreads()
        stride //= 2
    lo = red_m[0]
    scale = float32(NBINS) / (hi - lo) if hi > lo and lo < float32(math.inf) else float32(0.0)
    for b in range(tid, NBINS, nthreads):
        hist[b] = uint64(0)
    cuda.syncthreads()
    if scale > float32(0.0):
        for i in range(tid, n_tops, nthreads):
            t1 = tops[row, i, 0]
            t2 = tops[row, i, 1]
            if t1 > float32(-math.inf):
                cuda.atomic.add(hist, _bin_of(t1, lo, scale), uint64(1))
            if t2 > float32(-math.inf):
                cuda.atomic.add(hist, _bin_of(t2, lo, scale), uint64(1))
    cuda.syncthreads()
    _find_crossing(hist, k, 0, scan, info, tid, nthreads)
    if tid == 0:
        thr[row, 0] = lse
        thr[row, 1] = lo
        thr[row, 2] = scale
        thr[row, 3] = float32(info[0])
        thr[row, 4] = nan
        count[row] = 0


@cuda.jit(device=True)
def _collect(b, bstar, bits, row, v, cand_g, count):
    """Append element v's composite to row's candidates if its bin reaches b* (once overflowed, stop contending)."""
    if b >= bstar and count[row] <= CAP:
        slot = cuda.atomic.add(count, row, 1)
        if slot < CAP:
            cand_g[row, slot] = _composite(_order_key(bits[row, v]), v)


@cuda.jit
def _split_collect_kernel(x, bits, S, C, thr, cand_g, count):
    """Block (row, s): the elements of columns [s C, s C + C) in bins >= b* -> cand_g[row, :] (composites)."""
    row = cuda.blockIdx.x // S
    s = cuda.blockIdx.x - row * S
    if thr[row, 4] != float32(0.0):
        return
    lo = thr[row, 1]
    scale = thr[row, 2]
    bstar = int32(thr[row, 3])
    end = min(x.shape[1], s * C + C)
    nthreads = cuda.blockDim.x
    v = s * C + cuda.threadIdx.x
    while v + 3 * nthreads < end:            # four independent loads per step, as in pass 1
        b0 = _bin_of(x[row, v], lo, scale)
        b1 = _bin_of(x[row, v + nthreads], lo, scale)
        b2 = _bin_of(x[row, v + 2 * nthreads], lo, scale)
        b3 = _bin_of(x[row, v + 3 * nthreads], lo, scale)
        if max(max(b0, b1), max(b2, b3)) >= bstar:
            _collect(b0, bstar, bits, row, v, cand_g, count)
            _collect(b1, bstar, bits, row, v + nthreads, cand_g, count)
            _collect(b2, bstar, bits, row, v + 2 * nthreads, cand_g, count)
            _collect(b3, bstar, bits, row, v + 3 * nthreads, cand_g, count)
        v += 4 * nthreads
    while v < end:
        _collect(_bin_of(x[row, v], lo, scale), bstar, bits, row, v, cand_g, count)
        v += nthreads


@cuda.jit
def _split_select_kernel(x, bits, k, thr, cand_g, count, lp_out, ids_out):
    """Block per row: sort the collected candidates and write the top k; NaN rows -> NaN / -1; a row whose
    candidates overflowed CAP runs the whole one-block algorithm (_topk_row)."""
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    cand = cuda.shared.array(CAP, uint64)
    scan = cuda.shared.array(MAX_THREADS, int32)
    red_m = cuda.shared.array(MAX_THREADS, float32)
    red_s = cuda.shared.array(MAX_THREADS, float32)
    info = cuda.shared.array(4, int32)
    lo_key = cuda.shared.array(1, uint32)
    if thr[row, 4] != float32(0.0):
        for r in range(tid, k, nthreads):
            lp_out[row, r] = float32(math.nan)
            ids_out[row, r] = -1
        return
    n = count[row]
    if n > CAP:
        _topk_row(x, bits, k, lp_out, ids_out, row, cand, scan, red_m, red_s, info, lo_key)
        return
    for i in range(tid, n, nthreads):
        cand[i] = cand_g[row, i]
    cuda.syncthreads()
    _sort_write(cand, n, x, k, thr[row, 0], row, tid, nthreads, lp_out, ids_out)


@cuda.jit
def _choose_kernel(x, temperature, seed_lo, seed_hi, stream, out):
    row = cuda.blockIdx.x
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    V = x.shape[1]
    red_v = cuda.shared.array(MAX_THREADS, float64)
    red_i = cuda.shared.array(MAX_THREADS, int32)
    nan_flag = cuda.shared.array(1, int32)
    if tid == 0:
        nan_flag[0] = 0
    cuda.syncthreads()
    k0 = uint64(seed_lo)
    k1 = uint64(seed_hi)
    best = -math.inf
    best_i = V
    for v in range(tid, V, nthreads):
        val = x[row, v]
        if val != val:
            nan_flag[0] = 1
            continue
        score = float64(val)
        if temperature > 0:
            u = _philox_u(v, row, stream, k0, k1)
            score = score / temperature - math.log(-math.log(u))
        if score > best or (score == best and v < best_i):
            best = score
            best_i = v
    red_v[tid] = best
    red_i[tid] = best_i
    cuda.syncthreads()
    stride = nthreads // 2
    while stride > 0:
        if tid < stride:
            ov = red_v[tid + stride]
            oi = red_i[tid + stride]
            if ov > red_v[tid] or (ov == red_v[tid] and oi < red_i[tid]):
                red_v[tid] = ov
                red_i[tid] = oi
        cuda.syncthreads()
        stride //= 2
    if tid == 0:
        out[row] = -1 if nan_flag[0] or red_i[0] >= V else red_i[0]


# ------------------------------------------------------------------------------------------------ launchers
def topk_logprobs(logits, k: int, out=None):
    """Top-``k`` draft log-probs per row of ``logits [R, V]``: (lp [R, k] float32, ids [R, k] int32) sorted by
    (logit desc, id asc). A row containing NaN raises (host check on host backends; -1 ids on the GPU)."""
    x = _checks.array(logits, "logits", dtype=np.float32, ndim=2)
    R, V = x.shape
    k = _checks.integer(k, "k", lo=1, hi=min(V, MAX_K))
    if out is None:
        lp, ids = backend.empty((R, k), np.float32), backend.empty((R, k), np.int32)
    else:
        lp = _checks.out_array(out[0], "out[0]", (R, k), np.float32)
        ids = _checks.out_array(out[1], "out[1]", (R, k), np.int32)
    if backend.name != "cuda" and R:
        check_rows(np.asarray(x), "logits")
    if backend.name == "numpy":
        lp[...], ids[...] = topk_logprobs_ref(x, k)
        return lp, ids
    if R:
        if V >= 2 * SPLIT_CHUNK:
            _launch_split(x, k, lp, ids, SPLIT_CHUNK)
        else:
            backend.launch(_topk_kernel, R, backend.block_size(1024, 32), x, x.view(np.uint32), k, lp, ids)
    return lp, ids


_split_scratch: dict = {}    # (R, S, threads) -> preallocated buffers (kept: CUDA graphs replay their addresses)


def _launch_split(x, k: int, lp, ids, chunk: int) -> None:
    """Top-K with each row split over ceil(V / chunk) blocks (four launches; see the split kernels)."""
    R, V = x.shape
    S = -(-V // chunk)
    t = backend.block_size(SPLIT_THREADS, 16)
    key = (R, S, t)
    if key not in _split_scratch:
        e = backend.empty
        _split_scratch[key] = (e((R, S, 3), np.float32), e((R, S * t, 2), np.float32), e((R, 5), np.float32),
                               e((R, CAP), np.uint64), e((R,), np.int32))
    part, tops, thr, cand_g, count = _split_scratch[key]
    bits = x.view(np.uint32)
    big = backend.block_size(1024, 32)
    backend.launch(_split_stats_kernel, R * S, t, x, S, chunk, part, tops)
    backend.launch(_split_threshold_kernel, R, big, part, tops, k, thr, count)
    backend.launch(_split_collect_kernel, R * S, t, x, bits, S, chunk, thr, cand_g, count)
    backend.launch(_split_select_kernel, R, big, x, bits, k, thr, cand_g, count, lp, ids)


def choose_tokens(logits, temperature: float = 0.0, seed: int = 0, stream: int = 0, out=None):
    """One token per row of ``logits [M, V]``: argmax (T = 0) or a seeded Gumbel-max sample (T > 0).

    ``stream`` separates the random draws of different calls (the decode step or DDTree round); rows are the
    nodes. Rows with NaN give -1."""
    x = _checks.array(logits, "logits", dtype=np.float32, ndim=2)
    temperature = _checks.real(temperature, "temperature", lo=0.0)
    seed = _checks.integer(seed, "seed", lo=0, hi=2 ** 64 - 1)
    stream = _checks.integer(stream, "stream", lo=0, hi=M32)
    out = _checks.out_array(out, "out", (x.shape[0],), np.int32)
    if backend.name == "numpy":
        out[...] = choose_tokens_ref(x, temperature, seed, stream)
        return out
    if x.shape[0]:
        threads = backend.block_size(256, 32)
        backend.launch(_choose_kernel, x.shape[0], threads, x, float(temperature), seed & M32, (seed >> 32) & M32,
                       stream, out)
    return out
