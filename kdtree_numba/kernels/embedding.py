"""Embedding: token-row gather, y[t] = table[ids[t]].

Mapping: one block per token; its threads copy the row's columns, four per loop step (loads in flight).
Shapes: table [V, H] float32, ids [T] int -> y [T, H] float32. Ids outside [0, V) raise before any launch.
Example: embed([[1, 2], [3, 4]], [1, 1, 0]) -> [[3, 4], [3, 4], [1, 2]]
"""
from __future__ import annotations

import numpy as np
from numba import cuda

from .. import backend
from . import _checks


def embed_ref(table, ids):
    return np.asarray(table)[np.asarray(ids)]


@cuda.jit
def _embed_kernel(table, ids, out):
    t = cuda.blockIdx.x
    n = cuda.blockDim.x
    H = table.shape[1]
    src = ids[t]
    c = cuda.threadIdx.x
    while c + 3 * n < H:
        v0 = table[src, c]
        v1 = table[src, c + n]
        v2 = table[src, c + 2 * n]
        v3 = table[src, c + 3 * n]
        out[t, c] = v0
        out[t, c + n] = v1
        out[t, c + 2 * n] = v2
        out[t, c + 3 * n] = v3
        c += 4 * n
    while c < H:
        out[t, c] = table[src, c]
        c += n


def check_ids(ids, vocab_size: int, arg: str = "ids"):
    """Raise a ValueError naming the first id outside [0, vocab_size)."""
    host = backend.to_host(ids)
    bad = np.flatnonzero((host < 0) | (host >= vocab_size))
    if bad.size:
        raise ValueError(f"{arg}: token id {int(host.flat[bad[0]])} at index {int(bad[0])} is outside the "
                         f"vocabulary [0, {vocab_size})")


def embed(table, ids, out=None, check: bool = True):
    """Rows of ``table [V, H]`` for ``ids [T]``; returns ``out [T, H]``.

    ``check=False`` skips the range check (a host read): for ids the engine produced itself on the device."""
    table = _checks.array(table, "table", dtype=np.float32, ndim=2)
    ids = _checks.array(ids, "ids", kinds="iu", ndim=1)
    if check:
        check_ids(ids, table.shape[0])
    out = _checks.out_array(out, "out", (ids.shape[0], table.shape[1]), np.float32)
    if backend.name == "numpy":
        out[...] = embed_ref(table, ids)
        return out
    if out.size:
        backend.launch(_embed_kernel, ids.shape[0], backend.block_size(256, 16), table, ids, out)
    return out
