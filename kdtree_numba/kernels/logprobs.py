"""Draft log-probabilities with top-K, and the token choice at target logits (argmax or seeded sampling).

**topk_logprobs** - per row of draft logits (a depth of one request):
    lse = max + log(sum(exp(x - max)))        (fp32, like torch.log_softmax on fp32)
    ids[r] = the r-th largest logit's token (equal logits: lower token id first),  lp[r] = x[ids[r]] - lse
Draft logits are never divided by the temperature.
Mapping: one block per row; every (value, index) is packed as ``order_key << 32 | ~index`` (the float's bits
flipped so that unsigned order = float order), so one unsigned compare orders by (value desc, index asc) and no
two elements tie.
  Pass 1 (eight loads issued per step, then folded): each thread folds its strided elements into a running (max,
  sum of exp) and keeps two tops m, m2, the maxima of its even and of its odd steps (exp as ex2.approx on the
  GPU). Block reductions give lse and lo = the smallest m2; a NaN or +inf anywhere makes the merged sum NaN, which
  marks the row.
  Threshold: the 2 x threads tops (m, m2) are distinct elements, so their k-th largest bounds the row's
  k-th largest from below. A 2048-bin shared histogram of them over [lo, max] finds the bin b* holding it; the
  bin map is monotone, so every element of the row's top k lies in a bin >= b*. (Fewer than k values: b* = 0.)
  Pass 2 collects the elements in bins >= b* (typically k + a few percent: ~300 for k = 256, V = 163840) and sorts
  them: a rank sort (each candidate counts those above it, threads sharing a candidate's count when there are
  more threads than candidates) up to RANK_SORT, a bitonic network above.
  Overflow, when more than CAP = 4096 elements reach b* (long runs of equal values): one more pass keeps each
  thread's 4 largest composites (equal values ordered by index); after a bitonic sort of them, tau = the k-th,
  and if no thread's 4th lies above tau no thread dropped one of the top k (proof at the code).
  Last resort: radix refinement of the threshold key (a 2048-bin histogram of the top 11 key bits, a block scan
  for the bin holding the K-th value, refined by the next 11 and 10 bits while the candidates at or above it
  overflow the buffer), then collect and sort; when all 32 bits are fixed and ties at the threshold still
  overflow, the lowest-index ties are taken by an ordered scan (contiguous groups of TIE_GROUP per thread).
Split rows (V >= 2 x SPLIT_CHUNK, i.e. draft vocabularies): too few rows to fill the GPU with one block each (a
request's 15 rows use 15 of 132 SMs), so each row is spread over ceil(V / SPLIT_CHUNK) blocks, and the logits are
read once, in two launches:
  scan (512 threads per chunk of 16384 columns, staged in 64 KB of dynamic shared memory): pass 1, the block's
  bound t = the smallest thread top in the bin of the k-th largest top (t <= the block's k-th largest element),
  and the staged elements >= t (a superset of the block's top k) listed in shared memory (a 32-bit hit mask per
  thread, one shared atomic per warp), then written out coalesced into the row's candidates; more than
  k + k/4 + 64 of them (large k) -> a histogram of those elements refines t first. Block reductions and scans
  are warp shuffles (_intrinsics), seven barriers a block.
  select (block per row): lse from the blocks' partials; candidates below lo = the largest block t are dropped
  (every t is <= the row's k-th largest); a histogram over [lo, max] gives the bin b* of the k-th largest
  candidate, and the candidates in bins >= b* are rank-sorted. A block that overflowed, or more than CAP
  candidates at b*, -> the one-block algorithm for that row.
  Every element of the row's top k is >= its block's t (at most k - 1 elements of the row, so of the block, lie
  ahead of it), so the union of the candidate lists holds the top k.
History (163840 columns, k = 256, H200; 15 rows / 240 rows): a histogram of every value: - / 690 us (shared
atomics on the few hot bins of a peaked row serialise); 4 local tops per thread + a 4096-entry bitonic sort + a
counting pass: 229 / 505 us; thresholded, one block per row: 105 / 280 us; split in four launches (stats,
threshold, collect, select; two passes over the logits): 56 / 237 us; one pass, two launches: 44 / 177 us;
branch-free fold, warp collectives, hit masks, 16384-column chunks: 26 / 97 us (docs/PERFORMANCE.md has the
instruction counts behind each step).
Shapes: logits [R, V] float32 (rows = requests x depths), K <= 1024 -> lp [R, K] float32, ids [R, K] int32.
Example: logits [[0, 2, 2, -1]], K 3 -> ids [[1, 2, 0]], lp = [2, 2, 0] - log(1 + 2 e^2 + e^-1)

**choose_tokens** - a token at every row of target logits (one row per tree node or decode step):
T = 0: argmax (lowest id on ties). T > 0: a sample from softmax(x / T) by the Gumbel-max trick,
    token = argmax_v (x[v] / T + g[v]),   g[v] = -log(-log(u)),   u = hash(seed, stream, row, v) in (0, 1)
from Philox4x32-10, a counter-based generator (no RNG state: a run is reproducible from its seed, every
(token, row, stream) counter gets an independent draw, and the reference computes the same u). A row holding
NaN gives token -1, which the decode loop turns into an error.
Mapping: one block per row, strided loop + shared (value, index) arg-max reduction.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32, float64, int32, uint32, uint64

from .. import backend
from . import _checks
from ._intrinsics import (LOG2E, SIM, block_min, ex2, fmax, fmin, warp_bcast, warp_max, warp_min,
                          warp_prefix_sum, warp_suffix_sum, warp_sum)

MAX_K = 1024
HIST_BITS = 11
NBINS = 1 << HIST_BITS
TOP_BINS = 1024            # bins of the split scan's thread-top histogram (2 x 512 tops)
SEL_BINS = 1024            # bins of the split select's candidate histogram (32-bit counters)
CAP = 4096                 # candidate buffer (shared): >= MAX_K, >= NBINS
RANK_SORT = 1024           # up to this many candidates: rank sort (two barriers); above: bitonic
TIE_GROUP = 16             # contiguous elements per thread in the ordered scan of threshold ties
SPLIT_CHUNK = 16384        # columns per block when a row is split over several blocks (staged: 64 KB, dynamic)
SPLIT_THREADS = 32 if SIM else 512   # threads of the per-chunk blocks: whole warps, and on the simulator one warp
SPLIT_WARPS = SPLIT_THREADS // 32    # (its stand-ins for the warp collectives need block = warp, see _intrinsics)
MAX_THREADS = 512          # threads of the one-block-per-row kernels
MAX_WARPS = MAX_THREADS // 32
NEG = float(-np.finfo(np.float32).max)   # the fold's start: below every finite value, above -inf
M32 = 0xFFFFFFFF
# the one-block kernels at 512 threads: 64 registers keep two blocks per multiprocessor (unbounded, ptxas takes
# ~90 for the inlined fallback paths, whose few spills cost nothing on the common path); the simulator has no
# register cap
_CAP_64 = {} if SIM else {"max_registers": 64}


# ------------------------------------------------------------------------------------------------ references
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
    """T == 0: argmax (first max); T > 0: Gumbel-max sample with the counter-based uniforms,
    argmax_v (x_v - max x) / T + g_v in float64: the shift keeps every scaled logit in [-inf, 0], so a vanishing
    T (1e-308) cannot overflow to inf and tie unrelated tokens. NaN rows and rows without a value > -inf -> -1."""
    x = np.asarray(logits, np.float32)
    out = np.empty(x.shape[0], np.int32)
    for r in range(x.shape[0]):
        if np.isnan(x[r]).any() or not (x[r] > -np.inf).any():
            out[r] = -1
        elif temperature == 0:
            out[r] = int(np.argmax(x[r]))
        else:
            g = -np.log(-np.log(uniforms_ref(seed, stream, r, x.shape[1])))
            xr = x[r].astype(np.float64)
            out[r] = int(np.argmax((xr - xr.max()) / temperature + g))
    return out


def check_rows(x: np.ndarray, arg: str) -> None:
    """ValueError naming the first row with a NaN or +inf, or without any finite value."""
    for bad, what in ((np.isnan(x).any(axis=1), "NaN"), ((x == np.inf).any(axis=1), "+inf")):
        if bad.any():
            raise ValueError(f"{arg}: row {int(np.flatnonzero(bad)[0])} contains {what}")
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
    return (uint64(key) << uint64(32)) | (uint64(M32) - uint64(v))


@cuda.jit(device=True)
def _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out):
    for r in range(tid, k, nthreads):
        v = int32(M32 - (cand[r] & uint64(M32)))
        ids_out[row, r] = v
        lp_out[row, r] = x[row, v] - lse


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
    its bins [t per, t per + per) (per = nbins / nthreads, nthreads whole warps); a warp suffix sum and the warps'
    totals (shared wi [warps], one barrier) give the count above its bins, and the crossing thread walks them.
    Ends with a barrier. (A block-wide Hillis-Steele scan took 2 log2(threads) barriers.)"""
    tid = uint32(cuda.threadIdx.x)
    per = uint32(nbins // nthreads)
    b0 = tid * per
    c = int32(0)
    j = uint32(0)
    while j < per:                                         # unsigned while loops: see _sort_write
        c = int32(c + int32(hist[b0 + j]))
        j = uint32(j + uint32(1))
    suffix = warp_suffix_sum(c, ibuf)                      # this thread's bins and those of the warp's higher lanes
    w = tid // uint32(32)
    if cuda.laneid == 0:
        wi[w] = suffix
    cuda.syncthreads()
    lane = uint32(cuda.laneid)                             # + the totals of the higher warps, lane i warp i's
    run = int32(above + suffix - c + warp_sum(wi[lane] if lane > w and lane < uint32(nthreads // 32) else int32(0),
                                              ibuf))
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


@cuda.jit(device=True)
def _sort_write(cand, n, x, k, lse, row, tid, nthreads, lp_out, ids_out, rank):
    """Write the k largest of the n <= CAP candidate composites in cand, in order. Up to RANK_SORT: a rank sort -
    each candidate counts the candidates above it (broadcast reads); with more threads than candidates, every
    thread takes a share of some candidate's count (shared atomics into rank [>= RANK_SORT] int32). Above: a
    bitonic network."""
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
    n_pad = 1
    while n_pad < n:
        n_pad *= 2
    for i in range(n + tid, n_pad, nthreads):
        cand[i] = uint64(0)
    cuda.syncthreads()
    _bitonic_desc(cand, n_pad, tid, nthreads)
    _write_topk(cand, x, k, lse, row, tid, nthreads, lp_out, ids_out)


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


# --- several blocks per row (few rows, long rows): one streaming pass over the logits, then a small select ---
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
    and scans are warp collectives (_intrinsics) plus one exchange of the warps' partials. The stage is dynamic
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


@cuda.jit
def _choose_kernel(x, temperature, seed_lo, seed_hi, stream0, stream_dev, out):
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
    stream = stream0 + stream_dev[0]                       # host part + device part (graph replay)
    top = float64(0.0)
    if temperature > 0:                           # the row max: scores (x - top) / T stay in [-inf, 0]
        m = -math.inf
        for v in range(tid, V, nthreads):
            m = max(m, float64(x[row, v]))
        red_v[tid] = m
        cuda.syncthreads()
        stride = nthreads // 2
        while stride > 0:
            if tid < stride:
                red_v[tid] = max(red_v[tid], red_v[tid + stride])
            cuda.syncthreads()
            stride //= 2
        top = red_v[0]
        cuda.syncthreads()
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
            score = (score - top) / temperature - math.log(-math.log(u))
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
            backend.launch(_topk_kernel, R, backend.block_size(MAX_THREADS, 32), x, x.view(np.uint32), k, lp, ids)
    return lp, ids


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


def choose_tokens(logits, temperature: float = 0.0, seed: int = 0, stream: int = 0, out=None):
    """One token per row of ``logits [M, V]``: argmax (T = 0) or a seeded Gumbel-max sample (T > 0).

    ``stream`` separates the random draws of different calls (the decode step or DDTree round); rows are the
    nodes. Rows with NaN give -1. ``stream`` may be a device int32 [1] array (graph replay: decode/replay.py)."""
    x = _checks.array(logits, "logits", dtype=np.float32, ndim=2)
    temperature = _checks.real(temperature, "temperature", lo=0.0)
    seed = _checks.integer(seed, "seed", lo=0, hi=2 ** 64 - 1)
    stream0, stream_dev = _checks.device_int(stream, "stream")
    if stream0 > M32:
        raise ValueError(f"stream: expected an integer <= {M32}, got {stream0}")
    out = _checks.out_array(out, "out", (x.shape[0],), np.int32)
    if backend.name == "numpy":
        out[...] = choose_tokens_ref(x, temperature, seed, _checks.host_int(stream))
        return out
    if x.shape[0]:
        threads = backend.block_size(256, 32)
        backend.launch(_choose_kernel, x.shape[0], threads, x, float(temperature), seed & M32, (seed >> 32) & M32,
                       stream0, stream_dev, out)
    return out
