"""SwiGLU on the fused gate/up projection: y = silu(g) * u,  silu(g) = g / (1 + exp(-g))

The model concatenates gate_proj and up_proj at load, so one GEMM gives ``gu = [g | u]`` per token and this kernel
reads both halves in one pass.
Mapping: one block per token row; its threads stride over the columns j, each reading gu[t, j] and gu[t, I + j]
and writing y[t, j], four columns per loop step so that eight loads are in flight per thread (a thread per
element with 64-bit index division reached only 36 % of the copy bandwidth).
``norm_rows=(x, eps)``: gu is the product of raw rows x [T, H] with a post-attention RMSNorm's weight folded into
the gate/up weights (rmsnorm.folded_norm), so gu[t] is first scaled by r = 1 / sqrt(mean(x[t]**2) + eps) (each
block sums its row's squares first, rmsnorm.row_inv_rms): y = silu(r g) * (r u) - the norm's launch saved.
Shapes: gu [T, 2I] float32 (rows may be strided) -> y [T, I] float32.
Example: swiglu([[0, 1, 2, 3]]) -> [[0 * 2, silu(1) * 3]] = [[0, 2.1932]]; with norm_rows ([[2, 2]], 0): r = 0.5,
y = [[0, silu(0.5) * 1.5]] = [[0, 0.4668]]
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks
from .rmsnorm import norm_rows_args, row_inv_rms, scale_rows_ref

MAX_THREADS = 256   # threads per block (the row scale's reduction buffer)


def swiglu_ref(gu: np.ndarray) -> np.ndarray:
    inter = gu.shape[1] // 2
    g, u = gu[:, :inter], gu[:, inter:]                                # [T, I] each
    with np.errstate(over="ignore"):                                   # exp(-g) -> inf gives silu -> -0
        return (g / (np.float32(1.0) + np.exp(-g)) * u).astype(np.float32)


@cuda.jit(device=True, inline=True)
def _silu_mul(g, u):
    return g / (float32(1.0) + float32(math.exp(-g))) * u


@cuda.jit
def _swiglu_kernel(gu, out, norm_src, eps):
    t = cuda.blockIdx.x
    n = cuda.blockDim.x
    inter = out.shape[1]
    red = cuda.shared.array(MAX_THREADS, float32)
    r = float32(1.0)                         # no norm_rows: x * 1 is x, bit for bit
    if norm_src.shape[0]:                    # the same branch for the whole block (row_inv_rms has barriers)
        r = row_inv_rms(norm_src, t, eps, red)
    j = cuda.threadIdx.x
    while j + 3 * n < inter:
        g0 = gu[t, j]
        g1 = gu[t, j + n]
        g2 = gu[t, j + 2 * n]
        g3 = gu[t, j + 3 * n]
        u0 = gu[t, inter + j]
        u1 = gu[t, inter + j + n]
        u2 = gu[t, inter + j + 2 * n]
        u3 = gu[t, inter + j + 3 * n]
        out[t, j] = _silu_mul(g0 * r, u0 * r)
        out[t, j + n] = _silu_mul(g1 * r, u1 * r)
        out[t, j + 2 * n] = _silu_mul(g2 * r, u2 * r)
        out[t, j + 3 * n] = _silu_mul(g3 * r, u3 * r)
        j += 4 * n
    while j < inter:
        out[t, j] = _silu_mul(gu[t, j] * r, gu[t, inter + j] * r)
        j += n


def swiglu(gu, out=None, norm_rows=None):
    """``silu(gu[:, :I]) * gu[:, I:]`` for ``gu [T, 2I]`` (a column view of a wider product is fine: the MoE's
    shared expert reads its columns of the fused router + shared-expert GEMM); returns ``out [T, I]``.
    ``norm_rows=(x [T, H], eps)``: gu's rows scaled by 1 / rms(x) first (module docstring)."""
    gu = _checks.array(gu, "gu", dtype=np.float32, ndim=2, strided=True)
    if gu.shape[1] % 2:
        raise ValueError(f"gu: expected an even number of columns [gate | up], got shape {tuple(gu.shape)}")
    T, inter = gu.shape[0], gu.shape[1] // 2
    src, eps = norm_rows_args(norm_rows, T)
    out = _checks.out_array(out, "out", (T, inter), np.float32)
    if backend.name == "numpy":
        out[...] = swiglu_ref(scale_rows_ref(gu, norm_rows, src, eps))
        return out
    if T == 0 or inter == 0:
        return out
    backend.launch(_swiglu_kernel, T, backend.block_size(MAX_THREADS, 16), gu, out, src, np.float32(eps))
    return out
