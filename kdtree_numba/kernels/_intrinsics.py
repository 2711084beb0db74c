"""GPU instructions numba-cuda does not spell plainly, with stand-ins for numba's CUDA simulator.

- ``ex2(t)`` = 2^t as one ``ex2.approx.ftz.f32`` (MUFU.EX2; relative error < 2^-22, results below 2^-126 flush
  to 0). libdevice's ``fast_expf`` adds a range test and two multiplies for subnormal results; the softmax sums
  here only ever need exp(x - max) <= 1, where a flushed 1e-38 changes nothing.
- ``fmax(a, b)`` / ``fmin(a, b)``: one FMNMX (numba's ``max`` on floats is a compare and a select). A NaN operand
  is ignored (the other one is returned), as in C's fmaxf.

The simulator's libdevice stubs return NaN, so there each is plain Python (ex2 rounded once to float32, without
the flush to zero). ``SIM`` says which one runs. Warp and block collectives (shuffles, reductions, scans, the
bitonic sort) and the streaming-softmax step live in kernels/primitives.py.
Example: ex2(float32(-1.0)) = 0.5; fmax(float32(nan), float32(2.0)) = 2.0.
"""
from __future__ import annotations

import math

import numba
from llvmlite import ir
from numba import cuda, float32, types
from numba.cuda.extending import intrinsic

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
