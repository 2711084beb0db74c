"""Skinny GEMM: ``x @ w.T`` for a few dozen rows in one launch - a warp per 32 outputs, K across its lanes.

    out[i, j] = sum_k x[i, k] * w[j, k]            (or out[i, j] += ..., ``accumulate``)

A DDTree-64 verify multiplies 65 rows by weights of a few hundred columns: a few MFLOP, so the time is latency -
the launch, a round trip to memory, the reduction - not arithmetic. cuBLAS answers such shapes with split-K
kernels (8-12 us on the H200 at 17-65 rows, in a graph, against ~5 us for one row). This kernel does the product
in one pass of one launch:

Mapping: warp g owns an RW x CW = 8 x 4 patch of out (rows row0 .. row0+7, columns col0 .. col0+3). Lane l takes
k = l, l + 32, l + 64, ...: per k it loads 8 values of x and 4 of w (consecutive lanes read consecutive k:
coalesced), U = 4 such k steps' 48 loads issued before their first multiply, and adds the 8 x 4 products into 32
register accumulators acc[r * CW + c]. Then every output's sum is spread over the 32 lanes; a *reduce-scatter*
finishes all 32 in 31 shuffles (not 32 x 5): at offset o = 16, 8, 4, 2, 1 each lane sends its partner the half of
its 2o partial sums the partner keeps and adds the half it receives, so after the five steps lane l holds the
whole sum of value l, i.e. out[row0 + l // 4, col0 + l % 4]. x (a few KB) stays in L1/L2 for the warps that
re-read it.
K split (K_WARPS = 2): the two warps of a patch take one half of K each, cut at a multiple of 32 - slices of
kc = 32 ceil(K / 64), [0, kc) and [kc, K) - so at the model's K = 256 each warp's 48 loads of one U step cover its
whole slice: one round trip to memory instead of two. The second warp leaves its 32 sums in shared memory, one
barrier, the first adds them (always in that order: the same bits every run) and writes. A block holds WARPS /
K_WARPS = 2 patches. Grid: (column groups / 2, row blocks of 8).
Shapes: x [M, K] float32 (k contiguous, rows may be strided), w [N, K] float32 (HF's [out, in]; k contiguous),
out [M, N] float32 (columns contiguous).
Example: x = [[1, 2]], w = [[3, 4], [5, 6]] -> out = [[11, 17]]: one patch (its second warp's K slice is empty, K <
32: zeros); lanes 0 and 1 of the first hold k = 0 and 1; after the reduce-scatter lane 0 holds 1*3 + 2*4 = 11
(value 0: row 0, column 0) and lane 1 holds 1*5 + 2*6 = 17.

Where it runs: a tree verify's products (17-80 rows) run what kernels/gemm_choice.py times fastest for their shape -
this kernel or cuBLAS over row blocks - with this kernel as the default where ``pays``; products of more rows run it
where ``pays``. Where it pays, measured on the H200 (docs/PERFORMANCE.md,
2026-12-04; graph replays of one product against cuBLAS on the same arrays, same process):
  - 17-65 rows, K <= 256, up to 512 columns (the verify's q_a/kv_a, q_b, o_proj, router + shared gate/up and
    shared down; at 128 rows, the prefill's narrowest): 0.6-4.4 us less than cuBLAS's 8-12 us per product;
  - it loses where the work grows - 65 rows x 1536 columns (16.1 against 13.4 us), K = 768 at 65 rows (14.5
    against 13.6), 128 rows x >= 392 columns - and at one row (a decode step: cuBLAS's GEMV, 5 us, against 7-9);
  - at 16 rows (the draft, the chain's verify) it was within +-0.6 us alone but 3-6 us behind per forward in the
    round, so MIN_ROWS is 17.
  In the trained pair's DDTree-64 round (bench_round's replayed steady state): verify 0.715 -> 0.643 ms, the round
  1.05-1.09 -> 0.98-0.99 ms; plain steps and the chain unchanged; tokens identical.
ptxas (sm_90): 113 registers (192 when x's rows are strided; 123 / 190 before the K split), no spills, no local
memory (the accumulators stay in registers), 512 bytes of shared memory (the K slices' sums); a k0 pass of 128
FFMA and 48 loads is 438 instructions (705 with signed indices: a negative-index test and select per load,
2026-12-05, ``benchmarks/ptxas_report.py --loops``; no change in the round's tokens/s beyond ab_replay's drift,
and still no gain at 16 rows: MIN_ROWS stays 17, H200 2026-12-05; again with the K split, H100 2026-12-06: the
chain 2.6 % slower at MIN_ROWS 16).
Variants measured and dropped: 1, 2, 4, 16 rows per warp (4 ties 8, the rest lose), U = 8 (0.3-4 us slower).
The K split, measured in the round (H100, 2026-12-06, ``benchmarks/ab_replay.py --config kw2 --config
kw1:kdtree_numba.kernels.skinny_gemm.K_WARPS=1``, HumanEval/0-23, 3 passes): DDTree-32 8107 against 7898 tokens/s
(+2.7 %), the chain and plain decoding (which do not run it) unchanged, tokens identical; K_WARPS = 4 loses (DDTree-64
-5.7 %), and the LM head and the dense gate/up through it (MAX_OUTPUTS 135168) lose 1.4 %.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32, uint64

from .. import backend
from . import _checks
from ._intrinsics import SIM
from .primitives import FULL, warp_xor

RW = 8                                   # rows of a warp's patch
CW = 32 // RW                            # columns of a warp's patch (RW * CW = 32 = lanes)
U = 4                                    # k steps whose RW + CW loads each are issued together
_XN, _WN = U * RW, U * CW                # sizes of the load buffers (numba wants a constant per local array)
WARPS = 2 if SIM else 4                  # warps per block (the simulator: one patch, its two K slices)
K_WARPS = 2                              # warps that split one patch's K (WARPS // K_WARPS patches a block)

MIN_ROWS = 17                            # gemm.linear takes this kernel (gemm_choice: by default) for M >= MIN_ROWS,
MAX_OUTPUTS = 65 * 512                   # M * N <= MAX_OUTPUTS
MAX_K = 256                              # and K <= MAX_K (the module docstring's measurements)


def pays(m: int, k: int, n: int) -> bool:
    """Whether gemm.linear takes this kernel over cuBLAS for an [m, k] x [k, n] product on the GPU."""
    return m >= MIN_ROWS and m * n <= MAX_OUTPUTS and k <= MAX_K


def reads(a, b, out) -> bool:
    """Whether ``out (+)= a @ b`` has the layout this kernel reads: a [m, k] and w = b.T along k, out along its
    columns (float32 strides of 4 bytes), k <= MAX_K. Example: a weight's transposed view b = w.T of a row-major
    w [n, k] fits; b = w2 of a row-major w2 [k, n] does not (b.strides[0] = 4 n)."""
    return a.shape[1] <= MAX_K and a.strides[1] == 4 and b.strides[0] == 4 and out.strides[1] == 4


def skinny_ref(x, w, out=None, accumulate: bool = False):
    """NumPy reference: ``x @ w.T`` (added onto ``out`` when ``accumulate``), float32."""
    y = np.matmul(x, w.T, dtype=np.float32)
    if out is None:
        return y
    if accumulate:
        out += y
    else:
        out[...] = y
    return out


@cuda.jit(device=True, inline=True)
def _half(acc, o, upper, buf):
    """One reduce-scatter step: of acc[0 .. 2o) the lane keeps one half (upper: acc[o .. 2o)), adds its partner's
    copy of that half (lane ^ o sends it) and stores the sums in acc[0 .. o)."""
    for t in range(o):
        send = acc[t] if upper else acc[t + o]
        keep = acc[t + o] if upper else acc[t]
        acc[t] = keep + warp_xor(send, o, buf)


@cuda.jit(device=True, inline=True)
def patch_sum(x, row0, row_end, w, col0, col_end, buf, k_lo, k_hi):
    """The warp's RW x CW patch of ``x @ w.T`` at (row0, col0) over k in [k_lo, k_hi): lane l returns the whole
    sum of value l, i.e. out[row0 + l // CW, col0 + l % CW] (rows from row_end and columns from col_end read as
    zeros). Every lane of the warp calls (the reduce-scatter's shuffles); the module docstring's mapping. Also the
    grouped GEMM's variant 4 (moe_grouped_gemm), with one expert's W[e] as ``w``."""
    lane = cuda.threadIdx.x % 32
    acc = cuda.local.array(32, float32)                 # acc[r * CW + c]: this lane's part of value r * CW + c
    for v in range(32):
        acc[v] = float32(0.0)
    xv = cuda.local.array(_XN, float32)                 # [U, RW] x values of U k steps
    wv = cuda.local.array(_WN, float32)                 # [U, CW] w values of U k steps
    for k0 in range(k_lo + lane, k_hi, 32 * U):
        for u in range(U):                              # every load first ...
            k = k0 + 32 * u
            ku = uint64(k)                              # unsigned indices: no negative-index test and select
            for r in range(RW):                         # per load (ptxas: 705 -> 438 instructions a k0 pass)
                xv[u * RW + r] = x[uint64(row0 + r), ku] if row0 + r < row_end and k < k_hi else float32(0.0)
            for c in range(CW):
                wv[u * CW + c] = w[uint64(col0 + c), ku] if col0 + c < col_end and k < k_hi else float32(0.0)
        for u in range(U):                              # ... then the 4 x 32 multiply-adds
            for c in range(CW):
                for r in range(RW):
                    acc[r * CW + c] += xv[u * RW + r] * wv[u * CW + c]
    if not SIM:
        cuda.syncwarp(FULL)                             # converged before the 31 shuffles (primitives' note)
    _half(acc, 16, lane & 16 != 0, buf)
    _half(acc, 8, lane & 8 != 0, buf)
    _half(acc, 4, lane & 4 != 0, buf)
    _half(acc, 2, lane & 2 != 0, buf)
    _half(acc, 1, lane & 1 != 0, buf)
    return acc[0]


@cuda.jit
def _skinny_kernel(x, w, out, accumulate, k_warps):
    buf = cuda.shared.array(32 * WARPS if SIM else 1, float32)   # the simulator's stand-in for shuffles
    part = cuda.shared.array((WARPS, 32), float32)      # the K slices' sums of the block's patches
    warp = cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    group = cuda.blockIdx.x * (WARPS // k_warps) + warp // k_warps     # this warp's column group
    kpart = warp % k_warps                              # and its slice of K
    col0 = group * CW
    row0 = cuda.blockIdx.y * RW
    M = x.shape[0]
    N = w.shape[0]
    K = x.shape[1]
    kc = -(-K // (32 * k_warps)) * 32                   # a slice: whole 32-wide steps (coalesced lanes)
    k_lo = min(K, kpart * kc)
    v = patch_sum(x, row0, M, w, col0, N, buf, k_lo, min(K, k_lo + kc))   # every warp: the barrier below
    if kpart > 0:
        part[warp, lane] = v
    cuda.syncthreads()
    if kpart == 0:
        for j in range(1, k_warps):                     # the slices in order: the same sum every run
            v += part[warp + j, lane]
        r = row0 + lane // CW
        c = col0 + lane % CW
        if r < M and c < N:
            if accumulate:
                out[r, c] += v
            else:
                out[r, c] = v


def skinny_linear(x, w, out=None, accumulate: bool = False):
    """``out = x @ w.T`` (``out += x @ w.T`` with ``accumulate``) on the current backend, whatever its shape (the
    rule ``pays`` is gemm.linear's, not this function's): x [M, K], w [N, K], out [M, N] (allocated when None),
    float32; rows may be strided. Bad arguments raise ValueError naming them. Returns ``out``."""
    x, w, out = _checks.linear_operands(x, w, out, accumulate)
    return run(x, w, out, accumulate)


def run(x, w, out, accumulate: bool = False):
    """skinny_linear without the checks: for gemm.linear, which has checked its arguments already."""
    M = x.shape[0]
    N = w.shape[0]
    if backend.name == "numpy":
        return skinny_ref(x, w, out, accumulate)
    if M and N:
        groups = -(-N // CW)                            # column groups, K_WARPS warps each
        if K_WARPS < 1 or WARPS % K_WARPS:
            raise ValueError(f"K_WARPS: {K_WARPS} does not divide the block's {WARPS} warps")
        per_block = WARPS // K_WARPS
        backend.launch(_skinny_kernel, (-(-groups // per_block), -(-M // RW)), 32 * WARPS, x, w, out,
                       bool(accumulate), K_WARPS)
    return out
