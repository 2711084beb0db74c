"""Time stamps on the device: one thread writes the GPU's nanosecond clock into a record, so a DDTree round
replayed as one CUDA graph still says where its time went (decode/ddtree_replay.py stamps before its first stage
and after each of the six).

    stamps[row, col] <- %globaltimer   (int64 nanoseconds; row = row0 + row_dev[0], col a launch constant)

Why not CUDA events between the stages: an event needs the stages in separate graphs (an event recorded inside a
stream capture becomes a dependency, not a time), and seven graph launches with eight event records made DDTree-32
6 % slower than one graph with these stamps (H200, 2026-12-04, benchmarks/ab_replay.py: 4659 / 4724 against 4959 /
4990 tokens/s; docs/PERFORMANCE.md). A stamp is a one-thread kernel node inside the graph, read back with the
round's other records at the end of a generation; the clock ticks coarsely, so read stage times averaged over
rounds. ``row`` is an int or a device int32 [1] (the round counter: the replayed round passes it with
``row_offset = -1``), as in kernels/round_end.py.
On the NumPy backend the host clock (``time.perf_counter_ns``) is written when the call is made; on the simulator
the kernel reads the host clock too (``_intrinsics.globaltimer``'s stand-in). Differences of stamps are
durations; a single stamp means nothing on its own (the GPU clock's zero is arbitrary).
Example: stamps int64 [4, 7], round counter [3] on the device: ``stamp(stamps, counter, 0, row_offset=-1)``
writes stamps[2, 0]; seven such stamps around six stages give their times as np.diff(stamps[2]) / 1e6 ms.
"""
from __future__ import annotations

import time

import numpy as np
from numba import cuda

from .. import backend
from . import _checks
from ._intrinsics import globaltimer


@cuda.jit
def _stamp_kernel(stamps, row0, row_dev, col):
    if cuda.threadIdx.x == 0:
        stamps[row0 + row_dev[0], col] = globaltimer()


def stamp(stamps, row, col: int, row_offset: int = 0) -> None:
    """Write the device clock (ns) into ``stamps[row + row_offset, col]`` (stamps: a backend int64 [rows, cols]
    array; row an int or a device int32 [1]); no host read on the GPU."""
    stamps = _checks.array(stamps, "stamps", dtype=np.int64, ndim=2)
    row0, row_dev = _checks.device_int(row, "row")
    row0 += row_offset
    col = _checks.integer(col, "col", lo=0, hi=stamps.shape[1] - 1)
    if not hasattr(row, "shape") and not 0 <= row0 < stamps.shape[0]:
        raise ValueError(f"row: expected a stamp row in [0, {stamps.shape[0]}), got {row0}")
    if backend.name == "numpy":
        stamps[_checks.host_int(row) + row_offset, col] = time.perf_counter_ns()
        return
    backend.launch(_stamp_kernel, 1, 1, stamps, row0, row_dev, col)
