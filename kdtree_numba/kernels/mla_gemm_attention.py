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
against float64 on a tree, H100). P V is three accumulating GEMMs, P_hi V_hi + P_lo V_hi + P_hi V_lo, over the
values split once more, transposed (``_split_vt_kernel``: ``vt [2, Lkv, Kp]``, so cuBLAS runs P V as A @ B^T, its
faster TF32 layout here); the softmax writes P_hi over S and P_lo beside it.

Steps (one call):
  1. ``_split3_kernel`` x 2 and ``_split_vt_kernel``: k3 and vt from the cache's first K rows (rows past the
     visible span - the future of a device-side start, and the padding - are written as zeros, so garbage there
     cannot reach a product), q3 from q.
  2. per chunk of query rows (``chunk_rows``: S and P_lo of a chunk take at most WORK_BYTES; ``splits`` forces a
     count - tests): S = q3 @ k3^T (TF32 cuBLAS), then ``_softmax_split_kernel`` (one warp per row: an online
     max / sum over its visible keys, then P = exp(scale S - m) / l split into P_hi (over S) and P_lo, zeros where
     masked), then the three P V GEMMs into the chunk's rows of ``out``. A causal chunk's S stops after the keys
     its last token sees (a prefill's triangle: later chunks read more keys, earlier ones fewer).
Padding: K is rounded up to KEY_PAD = 32 keys (zero rows, masked): cuBLAS leaves its fast Hopper TF32 kernels when
S's rows are not 16-byte aligned - measured on an H100 (torch TF32 matmul, 2026-12-06): 16448 x 4353 x 1728 ran
at 102-120 TFLOP/s, 16448 x 4352 x 1728 at 318-373.
Masks: token t of the new rows (the tree's or the causal chunk's) sees every committed row k < start; then
causal: k <= start + t; tree: k = start + j for j on t's root-to-t path (``depth[t] >= depth[j] and
path[t, depth[j]] == j``, tree_verify's test).
Cost: S's write and the softmax's two reads and two writes are memory traffic the streaming kernels never pay,
so this pays only for big launches: ``pays`` says where ``variant=None`` picks it. Measured on an H100
(2026-12-06, docs/PERFORMANCE.md), 256 nodes x 64 heads over 4096 + 257 keys: 2.07 ms against v5's 3.84 and torch
SDPA's 4.98 - the score GEMM 0.68 (367 TFLOP/s), the softmax 0.70, P V 3 x 0.19, the splits 0.11. Each row chunk
re-reads the split keys, so more chunks only cost (512 context: 1 / 4 / 16 chunks 0.51 / 0.59 / 1.12 ms).
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
from .primitives import GROUP_BUF, group_max, group_sum

KEY_PAD = 32             # S's rows padded to a multiple of 32 keys (128 bytes: cuBLAS's aligned TF32 kernels)
WORK_BYTES = 1 << 30     # S + P_lo of one chunk of query rows at most this (8 bytes per row and key)
ROWS_PER_BLOCK = 1 if SIM else 8   # softmax rows (one warp each) per block; the simulator's warp collectives
                                   # assume a block of one warp
SPLIT_THREADS = 256
GEMM_MIN_ROWS = 4096     # ``pays``: variant=None runs "gemm" from this many query rows (T N), with a host start,
GEMM_MIN_KEYS = 512      # over at least this many keys (a tree verify) or
GEMM_MIN_CAUSAL_KEYS = 2048   # this many (a causal chunk: its GEMM computes the whole square, v5 the triangle).
# From bench_verify on an H100 (2026-12-06, docs/PERFORMANCE.md): every tree cell of >= 4096 rows ran 1.0-1.9x
# faster than v5 (512 / 256 / 16 a tie), cells of ~1000 rows -10 .. +20 %; the causal 512-token chunk (32768 rows
# over 512 keys) 0.90x, the 2048-token one 1.27x; decode steps (64 rows) 0.1-0.4x.
KEYS, QUERIES = 0, 1     # _split3_kernel's orders: [lo | hi | hi] (keys) or [hi | lo | hi] (queries)


def pays(rows: int, keys: int, device_start: bool, causal: bool = False) -> bool:
    """Whether ``variant=None`` runs "gemm" for ``rows`` query rows over ``keys`` keys: on a GPU, with a host start
    (a device start's S spans the whole cache), rows >= GEMM_MIN_ROWS and keys >= GEMM_MIN_KEYS (``causal``:
    GEMM_MIN_CAUSAL_KEYS). Example, on the GPU: pays(257 * 64, 512 + 257, False) -> True (a 256-node verify over
    512 rows, 64 heads); pays(17 * 64, 4113, False) -> False; pays(512 * 64, 512, False, causal=True) -> False."""
    least = GEMM_MIN_CAUSAL_KEYS if causal else GEMM_MIN_KEYS
    return backend.name == "cuda" and not device_start and rows >= GEMM_MIN_ROWS and keys >= least


def padded_keys(n_keys: int) -> int:
    """Keys rounded up to KEY_PAD. Example: padded_keys(4353) -> 4384."""
    return -(-max(n_keys, 1) // KEY_PAD) * KEY_PAD


def chunk_rows(rows: int, keys: int, splits: int | None) -> int:
    """Query rows per chunk: all ``rows`` when S and P_lo over ``keys`` (padded) keys fit WORK_BYTES, else the
    most that do (at least one); ``splits`` forces ceil(rows / splits). Example: chunk_rows(16448, 32800, None)
    -> 4092 (1 GiB / (8 x 32800)); chunk_rows(10, 32, 3) -> 4."""
    if splits is not None:
        return -(-rows // splits)
    return max(1, min(rows, WORK_BYTES // (8 * padded_keys(keys))))


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
    key row past the visible span). One thread per element of out[:, :D] (grid-stride)."""
    Rp = out.shape[0]
    R, D = x.shape
    n_valid = min(R, start0 + start_dev[0] + n_new)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < Rp * D:
        r = i // D
        c = i - r * D
        v = x[r, c] if r < n_valid else float32(0.0)
        hi = trunc_tf32(v)
        lo = float32(v - hi)
        out[r, c] = lo if order == KEYS else hi
        out[r, D + c] = hi if order == KEYS else lo
        out[r, 2 * D + c] = hi
        i += step


@cuda.jit
def _split_vt_kernel(x, start0, start_dev, n_new, vt):
    """vt [2, Lkv, Kp] = (hi, lo) of the values x[:, :Lkv] transposed (zeros for rows r >= R or past start +
    n_new, as ``_split3_kernel``): P V then runs as A @ B^T, cuBLAS's faster TF32 layout for it (H200: 414 against
    322 TFLOP/s with V read row-major out of k3). One thread per element, r fastest (coalesced writes). The two split
    kernels' loops look alike on purpose: sharing them (a range() loop and a device function returning (hi, lo))
    ran the q split 1.4x slower on an H100 (0.067 -> 0.096 ms at 16448 x 576)."""
    Kp = vt.shape[2]
    lkv = vt.shape[1]
    n_valid = min(x.shape[0], start0 + start_dev[0] + n_new)
    i = cuda.grid(1)
    step = cuda.gridsize(1)
    while i < lkv * Kp:
        c = i // Kp
        r = i - c * Kp
        v = x[r, c] if r < n_valid else float32(0.0)
        hi = trunc_tf32(v)
        vt[0, c, r] = hi
        vt[1, c, r] = float32(v - hi)
        i += step


@cuda.jit(device=True)
def _visible(k, t, start, n_new, tree, paths, depths):
    """Whether new token t sees key k: committed (k < start), else causal k <= start + t, or (tree) node
    j = k - start on t's path."""
    if k < start:
        return True
    j = k - start
    if j >= n_new:
        return False
    if not tree:
        return j <= t
    d = depths[j]
    return depths[t] >= d and paths[t, d] == j


@cuda.jit
def _softmax_split_kernel(s, p_lo, r0, n_heads, start0, start_dev, n_new, scale, tree, paths, depths):
    """Row i of the chunk (query row r0 + i, token t = (r0 + i) // n_heads): s[i, :] holds the raw scores; write
    P = exp(scale s - m) / l over t's visible keys (0 elsewhere) split as P_hi -> s[i], P_lo -> p_lo[i]. One warp
    per row: pass 1 keeps a running (m, l) per lane over keys lane, lane + 32, .. and merges the lanes' pairs
    (m = max, l = sum of l e^(m_lane - m)); pass 2 writes. Grid: ceil(rows / ROWS_PER_BLOCK) blocks of
    32 ROWS_PER_BLOCK threads. Memory-bound: S read twice, P_hi and P_lo written - 0.70 ms for 16448 x 4384 on an
    H100 (1.6 TB/s); four keys a lane in flight and base-2 exponentials ran 3 % faster (0.68), not kept."""
    buf = cuda.shared.array(GROUP_BUF, float32)      # the simulator's group scratch (GPU: unused)
    lane = cuda.threadIdx.x % 32
    i = cuda.blockIdx.x * (cuda.blockDim.x // 32) + cuda.threadIdx.x // 32
    if i >= s.shape[0]:                              # the whole warp leaves together
        return
    t = (r0 + i) // n_heads
    start = start0 + start_dev[0]
    K = s.shape[1]
    m = float32(-math.inf)
    l = float32(0.0)
    for k in range(lane, K, 32):
        if _visible(k, t, start, n_new, tree, paths, depths):
            x = float32(scale * s[i, k])
            if x > m:
                l = l * float32(math.exp(m - x)) + float32(1.0)
                m = x
            else:
                l += float32(math.exp(x - m))
    mx = group_max(m, 32, buf)
    w = float32(0.0) if m == float32(-math.inf) else float32(l * math.exp(m - mx))
    inv = float32(1.0) / group_sum(w, 32, buf)       # every token sees at least itself: l > 0
    for k in range(lane, K, 32):
        p = float32(0.0)
        if _visible(k, t, start, n_new, tree, paths, depths):
            p = float32(math.exp(float32(scale * s[i, k]) - mx)) * inv
        hi = trunc_tf32(p)
        s[i, k] = hi
        p_lo[i, k] = float32(p - hi)


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


def _launch_split(kernel, elements: int, *args):
    """A grid-stride split kernel over ``elements`` elements."""
    threads = backend.block_size(SPLIT_THREADS, 32)
    backend.launch(kernel, min(-(-elements // threads), 65536), threads, *args)


def _split3(x, rows: int, order: int, start0=0, start_dev=None, n_new: int = 0):
    """The [rows, 3D] operand of ``x [R, D]`` (``_split3_kernel``); keys past start + n_new are zeros."""
    D = x.shape[1]
    out = backend.empty((rows, 3 * D), np.float32)                                 # [rows, 3D]
    if start_dev is None:
        start_dev, n_new = _checks.device_int(0, "start")[1], x.shape[0]
    _launch_split(_split3_kernel, rows * D, x, start0, start_dev, n_new, order, out)
    return out


def _split_vt(x, lkv: int, rows: int, start0, start_dev, n_new: int):
    """``vt [2, Lkv, rows]``: the values of ``x [R, D]`` split and transposed (``_split_vt_kernel``)."""
    vt = backend.empty((2, lkv, rows), np.float32)                                 # [2, Lkv, rows]
    _launch_split(_split_vt_kernel, lkv * rows, x, start0, start_dev, n_new, vt)
    return vt


def _softmax(s, p_lo, r0: int, n_heads: int, start0, start_dev, n_new: int, scale: float, tree: bool, paths,
             depths):
    """``_softmax_split_kernel`` over the chunk rows of ``s [n, K]``: one warp a row, ROWS_PER_BLOCK a block."""
    backend.launch(_softmax_split_kernel, -(-s.shape[0] // ROWS_PER_BLOCK), 32 * ROWS_PER_BLOCK, s, p_lo, r0,
                   n_heads, start0, start_dev, n_new, np.float32(scale), tree, paths, depths)


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
    k3 = _split3(seen, Kp, KEYS, start0, start_dev, T)                                # [Kp, 3D]
    vt = _split_vt(seen, lkv, Kp, start0, start_dev, T)                               # [2, Lkv, Kp]: V_hi^T, V_lo^T
    q3 = _split3(q.reshape(M, D), M, QUERIES)                                         # [M, 3D]
    rows = chunk_rows(M, Kp, splits)
    work = backend.empty((2, rows * Kp), np.float32)                                  # S / P_hi, P_lo
    o = out.reshape(M, lkv)
    for r0 in range(0, M, rows):
        n = min(rows, M - r0)
        kc = Kp
        if not tree and not device_start:                    # the chunk's last token sees keys 0 .. start + t
            kc = padded_keys(start0 + (r0 + n - 1) // N + 1)
        s = work[0, :n * kc].reshape(n, kc)                                           # [n, kc]
        p_lo = work[1, :n * kc].reshape(n, kc)                                        # [n, kc]
        _gemm_tf32(q3[r0:r0 + n], k3[:kc].T, s)
        _softmax(s, p_lo, r0, N, start0, start_dev, T, scale, tree, paths, depths)
        v_hi, v_lo = vt[0, :, :kc].T, vt[1, :, :kc].T                                 # [kc, Lkv] views
        _gemm_tf32(s, v_hi, o[r0:r0 + n])
        _gemm_tf32(p_lo, v_hi, o[r0:r0 + n], accumulate=True)
        _gemm_tf32(s, v_lo, o[r0:r0 + n], accumulate=True)
    return out
