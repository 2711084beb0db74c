"""KV compaction (DDTree commit): move the accepted tree rows to the front of the tree block, every layer at once.

    for every layer l, j < n:   cache[l, start + j] = cache[l, start + accepted[j]]
``accepted`` are node indices in ascending order with the root first (accepted[0] == 0), so accepted[j] >= j:
rows only move towards the front. After the move the committed length is ``start + n``. The same launch may also
gather the accepted rows of another array (``gather=(src, dst)``: dst[j] = src[max(accepted[j], 0)] for every
slot j of ``accepted``, padding included): the replayed DDTree round's features for the drafter, which took a
launch of their own.

Mapping: grid (layer, column chunk of CHUNK); a block copies its chunk of the n accepted rows through shared
memory - all reads of a group of up to MAXP rows, a barrier, then all writes - so a row is never overwritten
before it is read, even when source and destination ranges overlap. Groups go in ascending j; a later group's
sources (>= its j) lie past every earlier destination. With a gather, one more grid row (x = layers) copies its
column chunk of every slot straight from src to dst (separate arrays: nothing to stage).
Shapes: cache [layers, capacity, W] float32, accepted [M] int32 (n <= M used; n may live on the device in
``n_accepted [1]`` so the decode loop needs no host read).
Example: accepted [0, 2, 5] at start 10: rows 10, 12, 15 -> rows 10, 11, 12 in every layer.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, float32

from .. import backend
from . import _checks

MAXP = 16
CHUNK = 128


def compact_ref(cache: np.ndarray, start: int, accepted: np.ndarray) -> None:
    """In place: cache[:, start + j] = cache[:, start + accepted[j]] (fancy indexing copies the sources first)."""
    acc = np.asarray(accepted)
    cache[:, start:start + acc.size] = cache[:, start + acc]


@cuda.jit
def _compact_kernel(cache, start0, start_dev, accepted, n_accepted, src, dst):
    start = start0 + start_dev[0]                          # the host part + the device part (graph replay)
    layer = cuda.blockIdx.x
    c0 = cuda.blockIdx.y * CHUNK
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    if layer == cache.shape[0]:                            # the gather's grid row
        F = dst.shape[1]
        width = max(min(CHUNK, F - c0), 0)
        for i in range(tid, dst.shape[0] * width, nthreads):
            j = i // width
            dst[j, c0 + i % width] = src[max(accepted[j], 0), c0 + i % width]
        return
    W = cache.shape[2]
    if c0 >= W:                                            # a chunk only the gather's width has
        return
    n = n_accepted[0]
    width = min(CHUNK, W - c0)
    buf = cuda.shared.array((MAXP, CHUNK), float32)
    for r0 in range(0, n, MAXP):
        rows = min(MAXP, n - r0)
        for i in range(tid, rows * width, nthreads):        # read the group's rows
            j = i // width
            buf[j, i % width] = cache[layer, start + accepted[r0 + j], c0 + i % width]
        cuda.syncthreads()
        for i in range(tid, rows * width, nthreads):        # then write them to the front
            j = i // width
            cache[layer, start + r0 + j, c0 + i % width] = buf[j, i % width]
        cuda.syncthreads()


def compact(cache, start: int, accepted, n_accepted=None, gather=None):
    """Move rows ``start + accepted[j]`` to ``start + j`` in every layer of ``cache [layers, capacity, W]``.

    ``n_accepted``: a 1-element int32 device array holding n (the decode loop's path length, never read on the
    host); default ``len(accepted)``. ``start``: an int, or a device int32 [1] array the kernel reads (a captured
    DDTree round: decode/ddtree_replay.py), then unchecked against the capacity. ``gather = (src [T, F], dst [M,
    F])`` (float32, M = len(accepted)): also dst[j] = src[max(accepted[j], 0)] for every j < M, in the same launch."""
    cache = _checks.array(cache, "cache", dtype=np.float32, ndim=3)
    accepted = _checks.array(accepted, "accepted", dtype=np.int32, ndim=1)
    start0, start_dev = _checks.device_int(start, "start")
    if gather is not None:
        gather = _check_gather(gather, accepted.shape[0])
    if hasattr(start, "shape") and backend.name != "numpy":
        if n_accepted is None:
            raise ValueError("n_accepted: required with a device-side start (the count must live on the device too)")
        n_accepted = _checks.array(n_accepted, "n_accepted", dtype=np.int32, shape=(1,))
        return _launch(cache, start0, start_dev, accepted, n_accepted, gather)
    start = _checks.host_int(start)
    if n_accepted is None:
        if start + accepted.shape[0] > cache.shape[1]:
            raise ValueError(f"accepted: {accepted.shape[0]} rows from start {start} exceed the cache's "
                             f"{cache.shape[1]} rows")
        n_accepted = backend.asarray(np.array([accepted.shape[0]], np.int32))
    else:                      # the count lives on the device; the tree rows written by verify bound it
        n_accepted = _checks.array(n_accepted, "n_accepted", dtype=np.int32, shape=(1,))
        if start >= cache.shape[1]:
            raise ValueError(f"start: {start} is past the cache's {cache.shape[1]} rows")
    if backend.name == "numpy":
        n = int(n_accepted[0])
        acc = accepted[:n]
        if n and (acc[0] != 0 or np.any(np.diff(acc) <= 0) or acc[-1] + start >= cache.shape[1]):
            raise ValueError(f"accepted: expected ascending node indices starting with the root 0, got {acc}")
        compact_ref(cache, start, acc)
        if gather is not None:
            src, dst = gather
            dst[...] = src[np.maximum(accepted, 0)]
        return cache
    return _launch(cache, start0, start_dev, accepted, n_accepted, gather)


def _check_gather(gather, slots: int):
    """``gather``'s (src [T, F], dst [slots, F]) float32 arrays, or a named error."""
    if not (isinstance(gather, tuple) and len(gather) == 2):
        raise ValueError(f"gather: expected a pair (src [T, F], dst [M, F]), got {type(gather).__name__}")
    src = _checks.array(gather[0], "gather src", dtype=np.float32, ndim=2)
    if gather[1] is None:
        raise ValueError("gather dst: expected the [M, F] array to gather into, got None")
    return src, _checks.out_array(gather[1], "gather dst", (slots, src.shape[1]), np.float32)


def _launch(cache, start0, start_dev, accepted, n_accepted, gather):
    threads = backend.block_size(256, 32)
    if gather is None:
        src = dst = backend.placeholder((1, 1))       # never read: the gather's grid row is not launched
        grid = (cache.shape[0], -(-cache.shape[2] // CHUNK))
    else:
        src, dst = gather
        grid = (cache.shape[0] + 1, -(-max(cache.shape[2], dst.shape[1]) // CHUNK))
    backend.launch(_compact_kernel, grid, threads, cache, start0, start_dev, accepted, n_accepted, src, dst)
    return cache
