"""SwiGLU on the fused gate/up projection: y = silu(g) * u,  silu(g) = g / (1 + exp(-g))

The model concatenates gate_proj and up_proj at load, so one GEMM gives ``gu = [g | u]`` per token and this kernel
reads both halves in one pass.
Mapping: one thread per output element (token t, column j): reads gu[t, j] and gu[t, I + j], writes y[t, j].
Shapes: gu [T, 2I] float32 -> y [T, I] float32.
Example: swiglu([[0, 1, 2, 3]]) -> [[0 * 2, silu(1) * 3]] = [[0, 2.1932]]
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks


def swiglu_ref(gu: np.ndarray) -> np.ndarray:
    inter = gu.shape[1] // 2
    g, u = gu[:, :inter], gu[:, inter:]                                # [T, I] each
    with np.errstate(over="ignore"):                                   # exp(-g) -> inf gives silu -> -0
        return (g / (np.float32(1.0) + np.exp(-g)) * u).astype(np.float32)


@cuda.jit
def _swiglu_kernel(gu, out):
    inter = out.shape[1]
    idx = cuda.grid(1)
    if idx >= out.shape[0] * inter:
        return
    t = idx // inter
    j = idx % inter
    g = gu[t, j]
    out[t, j] = g / (float32(1.0) + float32(math.exp(-g))) * gu[t, inter + j]


def swiglu(gu, out=None):
    """``silu(gu[:, :I]) * gu[:, I:]`` for ``gu [T, 2I]``; returns ``out [T, I]``."""
    gu = _checks.array(gu, "gu", dtype=np.float32, ndim=2)
    if gu.shape[1] % 2:
        raise ValueError(f"gu: expected an even number of columns [gate | up], got shape {tuple(gu.shape)}")
    T, inter = gu.shape[0], gu.shape[1] // 2
    out = _checks.out_array(out, "out", (T, inter), np.float32)
    if backend.name == "numpy":
        out[...] = swiglu_ref(gu)
        return out
    n = T * inter
    if n == 0:
        return out
    threads = backend.block_size(256, 32)
    backend.launch(_swiglu_kernel, (n + threads - 1) // threads, threads, gu, out)
    return out
