"""MLA attention as two dense products on cuBLAS's TF32 tensor cores (variant "gemm"), 3xTF32 for fp32 accuracy.

Absorbed MLA is multi-query attention: every head of every token scores the *same* latent cache rows. So the
scores of all T x N query rows over the K keys they may see are one dense product, and so are the weighted values:

    S [M, K]   = Q [M, D] @ C[:K]^T                   M = T N query rows (token-major: r = t N + h), D = Lkv + R
    P          = softmax_k(scale S, masked)           each row over its visible keys (tree: ancestors-or-self)
    out [M, Lkv] = P @ C[:K, :Lkv]                    values = the latent itself
For a large tree verify (256 nodes x 64 heads = 16448 rows over 4096+ keys) both are big enough for cuBLAS to run
near the tensor cores' peak, which the streaming kernels (mla_attention's v5) cannot reach from numba.

Accuracy: TF32 keeps 10 mantissa bits (~5e-4 relative), too coarse for the project's 1e-4 parity. Each operand
is split once, x = hi + lo with hi = x truncated to TF32 (exact in TF32) and lo = x - hi (exact in fp32), and
    a . b ~ a_hi . b_hi + a_hi . b_lo + a_lo . b_hi       (the dropped a_lo . b_lo is ~2^-22 |a||b|)
The scores are ONE GEMM with K tripled: [q_hi | q_lo | q_hi] @ [k_lo | k_hi | k_hi]^T (``_split3_kernel`` writes
both operands in those orders, ``q3 [M, 3D]`` and ``k3 [Kp, 3D]``; the two small cross terms come first in K, so
they sum in an accumulator of their own size before the large hi . hi terms join it: 4.6e-5 -> 1.4e-5 max error
against float64 on a tree, H100). P V the same way: the softmax writes each row of P split beside its scores,
[P_hi | P_lo | P_hi] up to P3_MAX_KEYS keys (then P V is one GEMM against [V_lo ; V_hi ; V_hi]) or [P_hi | P_lo]
beyond (two GEMMs: [P_hi | P_lo] @ [V_lo ; V_hi], then += P_hi V_hi; ``p_copies`` says which and why), over the
values split once more and transposed (``_split_vt_kernel``: ``vt [Lkv, W Kp]``, so cuBLAS runs P V as A @ B^T,
its faster TF32 layout here).

Steps (one call):
  1. ``_split3_kernel`` x 2 and ``_split_vt_kernel``: k3 and vt from the cache's first K rows (rows past the
     visible span - the future of a device-side start, and the padding - are written as zeros, so garbage there
     cannot reach a product), q3 from q.
  2. per chunk of query rows (``chunk_rows``: the chunk's W copies of P take at most WORK_BYTES; ``splits``
     forces a count - tests): S = q3 @ k3^T (TF32 cuBLAS) into the first Kp columns of the chunk's work rows
     [n, W Kp], then ``_softmax_split_kernel`` (one warp per row: an online max / sum over its visible keys, then
     P = exp(scale S - m) / l split across the row, zeros where masked), then P V into the chunk's rows of
     ``out`` (``_pv``). A causal chunk's S stops after the keys its last token sees (a prefill's triangle: later
     chunks read more keys, earlier ones fewer); such a chunk's P V takes three GEMMs over views.
Padding: K is rounded up to KEY_PAD = 32 keys (zero rows, masked): cuBLAS leaves its fast Hopper TF32 kernels when
S's rows are not 16-byte aligned - measured on an H100 (torch TF32 matmul, 2026-12-06): 16448 x 4353 x 1728 ran
at 102-120 TFLOP/s, 16448 x 4352 x 1728 at 318-373.
Masks: token t of the new rows (the tree's or the causal chunk's) sees every committed row k < start; then
causal: k <= start + t; tree: k = start + paths[t, d] for d <= depths[t], t's root-to-t path (the softmax reads
the path's entries; it tests no key).
Cost: S's write and the softmax's reads and writes are memory traffic the streaming kernels never pay, so this
pays only for big launches: ``pays`` says where ``variant=None`` picks it. Measured on an H100 (2026-12-06,
docs/PERFORMANCE.md, bench_verify's phases table), 256 nodes x 64 heads over 4096 + 257 keys: 1.78 ms against
v5's 3.84 and torch SDPA's 4.95 - the score GEMM 0.67 (371 TFLOP/s), P V 0.54, the softmax 0.49, the splits
0.09; over 512 + 257 keys 0.41 ms against SDPA's 0.93. Each row chunk re-reads the split keys, so more chunks only
cost (512 context: 1 / 4 / 16 chunks 0.51 / 0.59 / 1.12 ms, the first version).
On the simulator the GEMMs run in NumPy on TF32-truncated operands (the same arithmetic, fp32 accumulation), the
split and softmax kernels as on the GPU (one warp a block).
Shapes: q [T, N, D] float32, cache [C, D] float32, paths [T, >= L+1] / depths [T] int32 (tree) -> out [T, N, Lkv].
Example: one head, D = 2, Lkv = 1, cache [[1, 0], [0, 1]], start 0, q [[[0, 0]], [[ln 3, 0]]] (causal): token 0
sees row 0 -> out 1; token 1 sees rows 0, 1 with weights 3/4, 1/4 -> out 0.75; K = 2 keys pad to 32, one chunk.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks, _cublas
from .mma import SIM, trunc_tf32
from .primitives import GROUP_BUF, group_max, group_sum, warp_sync

KEY_PAD = 32             # S's rows padded to a multiple of 32 keys (128 bytes: cuBLAS's aligned TF32 kernels)
WORK_BYTES = 1 << 30     # one chunk's S -> P (p_copies floats per row and key) at most this
P3_MAX_KEYS = 1024       # ``p_copies``: P's row holds three copies up to this many (padded) keys, else two
ROWS_PER_BLOCK = 1 if SIM else 8   # softmax rows (one warp each) per block; the simulator's warp collectives
                                   # assume a block of one warp
SOFTMAX_UNROLL = 4       # keys a softmax lane loads before it uses any
SPLIT_UNROLL = 4         # columns a split thread loads before it stores any
GEMM_MIN_ROWS = 1024     # ``pays``: variant=None runs "gemm" with a host start from this many query rows (T N)
GEMM_MIN_KEYS = 512      # over at least this many keys (a tree verify), or from
GEMM_MIN_CAUSAL_ROWS = 4096   # this many rows over
GEMM_MIN_CAUSAL_KEYS = 2048   # this many keys (a causal chunk: its GEMM computes the whole square, v5 the triangle).
# From bench_verify on an H100 (2026-12-06, thirty-seventh session, docs/PERFORMANCE.md): every tree cell of >= 1040
# rows ran 1.2-2.2x faster than v5 (1040 - 1088 rows: 1.4-1.6x at 512, 4096 and 32768 context), cells of 272
# rows 0.56-0.79x at 4096 and 32768 context; the causal 512-token chunk (32768 rows over 512 keys) 1.05x, the
# 2048-token one 1.43x; decode steps (64 rows) 0.2-0.5x. The causal bounds are the thirty-sixth session's.
KEYS, QUERIES = 0, 1     # _split3_kernel's orders: [lo | hi | hi] (keys) or [hi | lo | hi] (queries)


def pays(rows: int, keys: int, device_start: bool, causal: bool = False) -> bool:
    """Whether ``variant=None`` runs "gemm" for ``rows`` query rows over ``keys`` keys: on a GPU, with a host start
    (a device start's S spans the whole cache), rows >= GEMM_MIN_ROWS and keys >= GEMM_MIN_KEYS (``causal``:
    GEMM_MIN_CAUSAL_ROWS and GEMM_MIN_CAUSAL_KEYS). Example, on the GPU: pays(257 * 64, 512 + 257, False) -> True
    (a 256-node verify over 512 rows, 64 heads); pays(17 * 64, 4113, False) -> True; pays(17 * 16, 4113, False)
    -> False; pays(512 * 64, 512, False, causal=True) -> False."""
    least_rows, least_keys = (GEMM_MIN_CAUSAL_ROWS, GEMM_MIN_CAUSAL_KEYS) if causal else (GEMM_MIN_ROWS, GEMM_MIN_KEYS)
    return backend.name == "cuda" and not device_start and rows >= least_rows and keys >= least_keys


def padded_keys(n_keys: int) -> int:
    """Keys rounded up to KEY_PAD. Example: padded_keys(4353) -> 4384."""
    return -(-max(n_keys, 1) // KEY_PAD) * KEY_PAD


def p_copies(kp: int) -> int:
    """Copies of P in a row of the work buffer over ``kp`` padded keys: 3, [P_hi | P_lo | P_hi] - P V is then one
    GEMM with K tripled, as the scores are - up to P3_MAX_KEYS keys, else 2, [P_hi | P_lo] and two GEMMs. Measured
    on an H100 (2026-12-06, docs/PERFORMANCE.md), 256 nodes x 64 heads: over 800 keys three copies ran the call
    0.42 ms against 0.44 (one GEMM of K = 2400 instead of K = 1600 + 800; 64 nodes over 608 keys: 0.109 against
    0.118); a tie over 1120 - 1312 keys; over 4384 keys two ran 1.78 against 1.90 (the third copy's write costs more
    than the second GEMM). Example: p_copies(800) -> 3; p_copies(4384) -> 2."""
    return 3 if kp <= P3_MAX_KEYS else 2


def chunk_rows(rows: int, keys: int, splits: int | None) -> int:
    """Query rows per chunk: all ``rows`` when their work rows (``p_copies`` floats a key) over ``keys`` (padded)
    keys fit WORK_BYTES, else the most that do (at least one); ``splits`` forces ceil(rows / splits). Example:
    chunk_rows(16448, 32800, None) -> 4092 (1 GiB / (2 x 4 x 32800)); chunk_rows(10, 32, 3) -> 4."""
    if splits is not None:
        return -(-rows // splits)
    kp = padded_keys(keys)
    return max(1, min(rows, WORK_BYTES // (4 * p_copies(kp) * kp)))


def split3_ref(x, rows: int, order: int, n_valid: int | None = None):
    """NumPy reference of ``_split3_kernel``: [rows, 3D] = [lo | hi | hi] (KEYS) or [hi | lo | hi] (QUERIES) of
    each row of ``x [R, D]`` (hi = x with its 13 low mantissa bits cleared, lo = x - hi), zeros from row
    min(R, n_valid). Example: x = [[1 + 2^-12]], QUERIES -> [[1, 2^-12, 1]]."""
    x = np.asarray(x, np.float32)
    n = x.shape[0] if n_valid is None else min(x.shape[0], n_valid)
    hi = (x[:n].view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    lo = x[:n] - hi
    out = np.zeros((rows, 3 * x.shape[1]), np.float32)
    out[:n] = np.concatenate([lo, hi, hi] if order == KEYS else [hi, lo, hi], axis=1)
    return out


# ------------------------------------------------------------------------------------------------ kernels
@cuda.jit
def _split3_kernel(x, start0, start_dev, n_new, order, out):
    """out [Rp, 3D] from x [R, D]: row r = [lo | hi | hi] (order KEYS) or [hi | lo | hi] (QUERIES) of x[r], hi =
    x truncated to TF32, lo = x - hi; zeros for r >= R or r >= start + n_new (start = start0 + start_dev[0]: a
    key row past the visible span). One block per row of out, SPLIT_UNROLL columns a thread: every thread's loads
    are issued before its first store (memory-bound: bytes in flight set the speed)."""
    D = x.shape[1]
    r = cuda.blockIdx.x
    n_valid = min(x.shape[0], start0 + start_dev[0] + n_new)
    vals = cuda.local.array(SPLIT_UNROLL, float32)
    c0 = cuda.threadIdx.x
    step = cuda.blockDim.x
    while c0 < D:
        for u in range(SPLIT_UNROLL):
            c = c0 + u * step
            vals[u] = x[r, c] if r < n_valid and c < D else float32(0.0)
        for u in range(SPLIT_UNROLL):
            c = c0 + u * step
            if c < D:
                hi = trunc_tf32(vals[u])
                lo = float32(vals[u] - hi)
                out[r, c] = lo if order == KEYS else hi
                out[r, D + c] = hi if order == KEYS else lo
                out[r, 2 * D + c] = hi
        c0 += SPLIT_UNROLL * step


@cuda.jit
def _split_vt_kernel(x, start0, start_dev, n_new, kp, vt):
    """vt [Lkv, W Kp] = [V_lo^T | V_hi^T (| V_hi^T when W = 3)]: the values x[:Kp, :Lkv] split (zeros for rows past
    R or start + n_new, as ``_split3_kernel``) and transposed, so P V runs as A @ B^T, cuBLAS's faster TF32 layout
    for it (H200: 414 against 322 TFLOP/s with V read row-major). A 32 x 32 tile a block of 32 x 8 threads through
    shared memory: reads coalesced along the latent, writes along the keys."""
    tile = cuda.shared.array((32, 33), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.x * 32, cuda.blockIdx.y * 32
    lkv = vt.shape[0]
    n_valid = min(x.shape[0], start0 + start_dev[0] + n_new)
    for j in range(4):
        r = r0 + ty + 8 * j
        tile[ty + 8 * j, tx] = x[r, c0 + tx] if r < n_valid and c0 + tx < lkv else float32(0.0)
    cuda.syncthreads()
    r = r0 + tx
    for j in range(4):
        c = c0 + ty + 8 * j
        if c < lkv and r < kp:
            v = tile[tx, ty + 8 * j]
            hi = trunc_tf32(v)
            vt[c, r] = float32(v - hi)
            vt[c, kp + r] = hi
            if vt.shape[1] == 3 * kp:
                vt[c, 2 * kp + r] = hi


@cuda.jit(device=True)
def _store_split(p, i, k, kc, v):
    """P = v at key k of row i: hi -> p[i, k] (and p[i, 2 kc + k] when p holds three copies), lo -> p[i, kc + k]."""
    hi = trunc_tf32(v)
    p[i, k] = hi
    p[i, kc + k] = float32(v - hi)
    if p.shape[1] == 3 * kc:
        p[i, 2 * kc + k] = hi


@cuda.jit
def _softmax_split_kernel(p, kc, r0, n_heads, start0, start_dev, scale, tree, paths, depths):
    """Row i of the chunk (query row r0 + i, token t = (r0 + i) // n_heads): p[i, :kc] holds the raw scores; write
    P = exp(scale s - m) / l over t's visible keys (0 elsewhere) split as [P_hi | P_lo (| P_hi)] across p's row
    (p [n, W kc], W = 2 or 3). Visible keys: a dense run [0, dense) - every committed key, plus (causal) the new
    keys up to t - and (tree) t's path, start + paths[t, d] for d <= depths[t]; no per-key mask test.
    One warp per row. Pass 1: a running (m, l) per lane over the dense run, SOFTMAX_UNROLL keys a lane loaded
    before any is used (keys base + lane + 32 u), then over the path entries; the lanes' pairs merge (m = max,
    l = sum of l e^(m_lane - m)). Pass 2 writes the dense run the same way; past it, the tree's P is first staged
    in the P_lo columns (zeros, then the path entries, a warp barrier between) and then split in place, so a
    path entry's score is read before the zeros reach it. Grid: ceil(rows / ROWS_PER_BLOCK) blocks of
    32 ROWS_PER_BLOCK threads. Memory-bound: S read twice (the second time from L2), P written W times."""
    buf = cuda.shared.array(GROUP_BUF, float32)      # the simulator's group scratch (GPU: unused)
    xs = cuda.local.array(SOFTMAX_UNROLL, float32)
    lane = cuda.threadIdx.x % 32
    i = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    if i >= p.shape[0]:                              # the whole warp leaves together
        return
    t = (r0 + i) // n_heads
    start = start0 + start_dev[0]
    dense = min(kc, start if tree else start + t + 1)
    neg = float32(-math.inf)
    m = neg
    l = float32(0.0)
    for base in range(0, dense, 32 * SOFTMAX_UNROLL):
        for u in range(SOFTMAX_UNROLL):
            k = base + lane + 32 * u
            xs[u] = float32(scale * p[i, k]) if k < dense else neg
        cm = xs[0]
        for u in range(1, SOFTMAX_UNROLL):
            cm = max(cm, xs[u])
        if cm > m:
            l *= float32(math.exp(m - cm))
            m = cm
        if m > neg:
            for u in range(SOFTMAX_UNROLL):
                l += float32(math.exp(xs[u] - m))
    dt = depths[t] if tree else -1
    for d in range(lane, dt + 1, 32):
        x = float32(scale * p[i, start + paths[t, d]])
        if x > m:
            l = l * float32(math.exp(m - x)) + float32(1.0)
            m = x
        else:
            l += float32(math.exp(x - m))
    mx = group_max(m, 32, buf)
    w = float32(0.0) if m == neg else float32(l * math.exp(m - mx))
    inv = float32(1.0) / group_sum(w, 32, buf)       # every token sees at least itself: l > 0
    for base in range(0, dense, 32 * SOFTMAX_UNROLL):
        for u in range(SOFTMAX_UNROLL):
            k = base + lane + 32 * u
            xs[u] = float32(scale * p[i, k]) if k < dense else neg
        for u in range(SOFTMAX_UNROLL):
            k = base + lane + 32 * u
            if k < dense:
                _store_split(p, i, k, kc, float32(math.exp(xs[u] - mx)) * inv)
    if tree:
        for k in range(dense + lane, kc, 32):        # stage: zeros in P_lo's columns past the dense run ...
            p[i, kc + k] = float32(0.0)
        warp_sync()
        for d in range(lane, dt + 1, 32):            # ... then the path's P (its scores are still in p[i, :kc])
            k = start + paths[t, d]
            p[i, kc + k] = float32(math.exp(float32(scale * p[i, k]) - mx)) * inv
        warp_sync()
    for k in range(dense + lane, kc, 32):
        _store_split(p, i, k, kc, p[i, kc + k] if tree else float32(0.0))


# ------------------------------------------------------------------------------------------------ launcher
def _gemm_tf32(a, b, out, accumulate: bool = False):
    """``out (+)= a @ b`` on TF32 tensor cores (cuBLAS) - on the simulator in NumPy with both operands truncated to
    TF32 and fp32 accumulation, the same arithmetic."""
    if backend.name == "cuda":
        return _cublas.gemm(a, b, out, accumulate, tf32=True)
    cut = np.uint32(0xFFFFE000)
    a, b = ((np.ascontiguousarray(x).view(np.uint32) & cut).view(np.float32) for x in (a, b))
    prod = np.matmul(a, b, dtype=np.float32)
    if accumulate:
        out += prod
    else:
        out[...] = prod
    return out


def _split3(x, rows: int, order: int, start0=0, start_dev=None, n_new: int = 0):
    """The [rows, 3D] operand of ``x [R, D]`` (``_split3_kernel``); keys past start + n_new are zeros."""
    D = x.shape[1]
    out = backend.empty((rows, 3 * D), np.float32)                                 # [rows, 3D]
    if start_dev is None:
        start_dev, n_new = _checks.device_int(0, "start")[1], x.shape[0]
    threads = backend.block_size(32 * max(1, -(-D // (32 * SPLIT_UNROLL))), 32)   # D = 576: 160 threads
    backend.launch(_split3_kernel, rows, threads, x, start0, start_dev, n_new, order, out)
    return out


def _split_vt(x, lkv: int, rows: int, start0, start_dev, n_new: int, copies: int):
    """``vt [Lkv, copies rows]`` = [V_lo^T | V_hi^T (| V_hi^T)]: the values of ``x [R, D]`` split and transposed
    (``_split_vt_kernel``)."""
    vt = backend.empty((lkv, copies * rows), np.float32)                           # [Lkv, W rows]
    backend.launch(_split_vt_kernel, (-(-rows // 32), -(-lkv // 32)), (32, 8), x, start0, start_dev, n_new, rows,
                   vt)
    return vt


def _softmax(p, kc: int, r0: int, n_heads: int, start0, start_dev, scale: float, tree: bool, paths, depths):
    """``_softmax_split_kernel`` over the chunk rows of ``p [n, W kc]``: one warp a row, ROWS_PER_BLOCK a block."""
    backend.launch(_softmax_split_kernel, -(-p.shape[0] // ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, p, kc, r0,
                   n_heads, start0, start_dev, np.float32(scale), tree, paths, depths)


def _pv(p, vt, kc: int, out):
    """``out = P @ V`` from ``p [n, W kc]`` = [P_hi | P_lo (| P_hi)] and ``vt [Lkv, W Kp]`` (``_split_vt``) in
    3xTF32 form, cross terms first: with every key (kc = Kp) one GEMM over the whole row (W = 3) or two (W = 2:
    [P_hi | P_lo] @ [V_lo ; V_hi], then += P_hi V_hi); a causal chunk of fewer keys takes three, over views."""
    W = p.shape[1] // kc
    kp = vt.shape[1] // W
    if kc == kp:
        if W == 3:
            return _gemm_tf32(p, vt.T, out)
        _gemm_tf32(p, vt.T, out)
        return _gemm_tf32(p[:, :kc], vt[:, kp:].T, out, accumulate=True)
    v_lo, v_hi = vt[:, :kc].T, vt[:, kp:kp + kc].T                                # [kc, Lkv] views
    _gemm_tf32(p[:, kc:2 * kc], v_hi, out)
    _gemm_tf32(p[:, :kc], v_lo, out, accumulate=True)
    return _gemm_tf32(p[:, :kc], v_hi, out, accumulate=True)


def gemm_attention(q, cache, start, scale: float, lkv: int, out, splits: int | None = None, paths=None,
                   depths=None):
    """Attention of the T new tokens ``q [T, N, D]`` over ``cache [C, D]`` as GEMMs (module docstring) into
    ``out [T, N, Lkv]``: causal (``paths`` None) or over the tree ``paths`` / ``depths``; ``start`` an int or a
    device int32 [1] (then S spans every cache row); ``splits`` forces the number of row chunks. Arguments are
    checked by the callers (mla_attention / tree_verify.tree_attention)."""
    start0, start_dev = _checks.device_int(start, "start")
    device_start = hasattr(start, "shape")
    T, N, D = q.shape
    M = T * N
    if M == 0:
        return out
    tree = paths is not None
    if not tree:                                             # typed like the real ones, never read
        paths, depths = backend.placeholder((1, 1), np.int32), backend.placeholder((1,), np.int32)
    keys = cache.shape[0] if device_start else start0 + T   # every key any row may see
    Kp = padded_keys(keys)
    seen = cache[:keys]                                                               # [<= Kp, D]
    W = p_copies(Kp)
    k3 = _split3(seen, Kp, KEYS, start0, start_dev, T)                                # [Kp, 3D]
    vt = _split_vt(seen, lkv, Kp, start0, start_dev, T, W)                            # [Lkv, W Kp]
    q3 = _split3(q.reshape(M, D), M, QUERIES)                                         # [M, 3D]
    rows = chunk_rows(M, Kp, splits)
    work = backend.empty((rows * W * Kp,), np.float32)                                # S -> P, W copies a row
    o = out.reshape(M, lkv)
    for r0 in range(0, M, rows):
        n = min(rows, M - r0)
        kc = Kp
        if not tree and not device_start:                    # the chunk's last token sees keys 0 .. start + t
            kc = padded_keys(start0 + (r0 + n - 1) // N + 1)
        p = work[:n * W * kc].reshape(n, W * kc)                                      # [n, W kc]
        _gemm_tf32(q3[r0:r0 + n], k3[:kc].T, p[:, :kc])
        _softmax(p, kc, r0, N, start0, start_dev, scale, tree, paths, depths)
        _pv(p, vt, kc, o[r0:r0 + n])
    return out
