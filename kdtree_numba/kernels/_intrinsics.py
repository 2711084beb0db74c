"""GPU instructions numba-cuda does not spell plainly, with stand-ins for numba's CUDA simulator.

- ``ex2(t)`` = 2^t as one ``ex2.approx.ftz.f32`` (MUFU.EX2; relative error < 2^-22, results below 2^-126 flush
  to 0). libdevice's ``fast_expf`` adds a range test and two multiplies for subnormal results; the softmax sums
  here only ever need exp(x - max) <= 1, where a flushed 1e-38 changes nothing.
- ``fmax(a, b)`` / ``fmin(a, b)``: one FMNMX (numba's ``max`` on floats is a compare and a select). A NaN operand
  is ignored (the other one is returned), as in C's fmaxf.
- warp collectives over the 32 lanes of a warp by register shuffles (no shared memory, no barrier):
  ``warp_max``, ``warp_min``, ``warp_sum``, and for int32 counts ``warp_suffix_sum`` (inclusive: this lane and
  all higher ones) and ``warp_prefix_sum`` (exclusive, and the warp total), ``warp_bcast`` (lane ``src``'s value).
  Every lane of the warp must make the call (warp-uniform control flow), and a kernel using them must run whole
  warps. Each starts with a __syncwarp: ptxas cannot prove the lanes converged after a branch or a barrier and
  guards the shuffles with a divergence test; measured (ncu), every warp of the top-K scan took the slow,
  emulated path there until the explicit reconvergence.

The simulator has no shuffles, and its libdevice stubs return NaN. There, a kernel using the collectives runs
blocks of exactly one warp (32 threads), and each collective goes through a shared scratch array ``buf`` [32]
with two barriers: the block is the warp, so the result is the same. Callers pass ``buf`` on the GPU too, where
it is not touched (one source for both: the sim tests run the very algorithm the GPU runs).
Example: lanes holding c = [1, 0, 2, 0, ...0] -> warp_prefix_sum gives (0, 1, 1, 3, 3, ...) and total 3;
warp_suffix_sum gives (3, 2, 2, 0, ...).

Block-wide, from the warp collectives and one barrier: ``block_prefix_sum`` (int32, exclusive, and the block total)
and ``block_min`` (any float type; the smallest value to every thread; used by the top-K scan and the tree build).

``online_softmax_row(sc, h, n, m_run, l_run, alpha)``: one step of the streaming softmax both attention kernels
use, for row h of a tile of n scores: M = max(m, max_j sc[h, j]); alpha = exp(m - M); sc[h, j] = exp(sc[h, j] - M);
l = l * alpha + sum_j sc[h, j]; m = M. The caller then rescales its accumulators by alpha[h] and adds the tile.
"""
from __future__ import annotations

import math

import numba
from llvmlite import ir
from numba import cuda, float32, int32, types
from numba.cuda.extending import intrinsic

FULL = 0xFFFFFFFF
LOG2E = 1.4426950408889634
SIM = bool(numba.config.ENABLE_CUDASIM)

if SIM:
    @cuda.jit(device=True)
    def ex2(t):
        return float32(2.0 ** min(float(t), 127.0)) if t == t else float32(math.nan)

    @cuda.jit(device=True)
    def fmax(a, b):
        return b if a != a or b > a else a

    @cuda.jit(device=True)
    def fmin(a, b):
        return b if a != a or b < a else a

    @cuda.jit(device=True)
    def _gather(v, buf):
        """All 32 values of the warp (= block), as a list."""
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
    def warp_suffix_sum(v, buf):
        vals = _gather(v, buf)
        return sum(vals[cuda.threadIdx.x:])

    @cuda.jit(device=True)
    def warp_prefix_sum(v, buf):
        vals = _gather(v, buf)
        return sum(vals[:cuda.threadIdx.x]), sum(vals)

    @cuda.jit(device=True)
    def warp_bcast(v, src, buf):
        return _gather(v, buf)[src]
else:
    @intrinsic
    def _ex2_approx(typingctx, t):
        if t != types.float32:
            return None

        def codegen(context, builder, sig, args):
            fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType()])
            return builder.call(ir.InlineAsm(fnty, "ex2.approx.ftz.f32 $0, $1;", "=f,f"), args)
        return types.float32(types.float32), codegen

    def _binary_f32(inst):
        """An intrinsic (a: float32, b: float32) -> float32 emitting the one PTX instruction ``inst``."""
        @intrinsic
        def impl(typingctx, a, b):
            if a != types.float32 or b != types.float32:
                return None

            def codegen(context, builder, sig, args):
                fnty = ir.FunctionType(ir.FloatType(), [ir.FloatType(), ir.FloatType()])
                return builder.call(ir.InlineAsm(fnty, inst + " $0, $1, $2;", "=f,f,f"), args)
            return types.float32(types.float32, types.float32), codegen
        return impl

    _max_f32 = _binary_f32("max.f32")
    _min_f32 = _binary_f32("min.f32")

    @cuda.jit(device=True)
    def ex2(t):
        return _ex2_approx(float32(t))

    @cuda.jit(device=True)
    def fmax(a, b):
        return _max_f32(float32(a), float32(b))

    @cuda.jit(device=True)
    def fmin(a, b):
        return _min_f32(float32(a), float32(b))

    @cuda.jit(device=True)
    def warp_max(v, buf):
        cuda.syncwarp(FULL)
        s = 16
        while s > 0:
            v = max(v, cuda.shfl_xor_sync(FULL, v, s))
            s >>= 1
        return v

    @cuda.jit(device=True)
    def warp_min(v, buf):
        return -warp_max(-v, buf)                 # exact for floats

    @cuda.jit(device=True)
    def warp_sum(v, buf):
        cuda.syncwarp(FULL)
        s = 16
        while s > 0:
            v += cuda.shfl_xor_sync(FULL, v, s)
            s >>= 1
        return v

    @cuda.jit(device=True)
    def warp_prefix_sum(v, buf):
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
        before, total = warp_prefix_sum(v, buf)
        return int32(total - before)

    @cuda.jit(device=True)
    def warp_bcast(v, src, buf):
        cuda.syncwarp(FULL)
        return cuda.shfl_sync(FULL, v, src)


@cuda.jit(device=True)
def block_prefix_sum(v, wpart, buf):
    """(exclusive prefix sum of int32 v over the block's threads in order, the block's total), to every thread:
    a warp prefix sum, the warps' totals through ``wpart`` (shared int32 [>= warps]) and one barrier, then a warp
    prefix sum over those totals. Whole warps only; the caller separates two calls with a barrier (wpart)."""
    before, total = warp_prefix_sum(v, buf)
    lane = cuda.laneid
    if lane == 0:
        wpart[cuda.threadIdx.x // 32] = total
    cuda.syncthreads()
    nwarps = (cuda.blockDim.x + 31) // 32
    wbefore, total = warp_prefix_sum(wpart[lane] if lane < nwarps else int32(0), buf)
    return int32(before + warp_bcast(wbefore, cuda.threadIdx.x // 32, buf)), total


@cuda.jit(device=True)
def block_min(v, wpart, nwarps, buf):
    """The smallest v over the block, to every thread: a warp minimum, the warps' minima through ``wpart`` (shared
    [>= nwarps], v's type; nwarps = the block's warps, a constant where the block size is one) and one barrier.
    Same rules as block_prefix_sum. (A shared float atomic min is a compare-and-swap loop; the lanes it split
    stayed apart through the next barrier, and ncu showed every warp of the top-K scan taking ptxas's slow,
    emulated path for the shuffles after it.)"""
    m = warp_min(v, buf)
    lane = cuda.laneid
    if lane == 0:
        wpart[cuda.threadIdx.x // 32] = m
    cuda.syncthreads()
    return warp_min(wpart[lane] if lane < nwarps else wpart[0], buf)


@cuda.jit(device=True)
def online_softmax_row(sc, h, n, m_run, l_run, alpha):
    """Streaming-softmax update of row ``h`` (module docstring); one thread per row, plain float32 exp."""
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
