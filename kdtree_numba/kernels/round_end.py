"""The end of a DDTree round in one launch: the round's trace records, and (replay) the next round's device state.

    rec[row] <- the tree (tokens, depth, parent, logw [B], n), the walk (accepted [L+1], n_acc, result [L+2]) and
                draft_lp[d] = lp[d, j] where ids[d, j] == chosen[accepted[d]]   (d < n_acc; NaN otherwise / not found)
    advance:    start += n_acc;  root = max(result[max(result[0], 0)], 0);  round += 1   (root also into root_copy)

``draft_lp[d]`` is the log-prob the drafter gave at depth d + 1 to the token the target chose there (the trace's
draft probabilities; NaN where it was outside the draft's top-K). The replayed round (decode/ddtree_replay.py)
did this with eight scatters into the record rows, the lookup kernel, its scatter and five CuPy operations for the
state: ~16 launches of ~2.5 us each, every round; the direct loop (decode/ddtree.py) with ten.
Mapping: one block of whole warps (512 threads; one warp on the simulator); its threads stride over the record
columns (B, L + 1, L + 2) and thread 0 writes the scalars; warp w looks depths w, w + warps, .. up, 32 of the
depth's K ids compared at once and the first hit taken by a warp min (with a thread walking the K ids one by one
the kernel took 10.9 us of a DDTree-32 round on the H200 against 8.3 for the chain's K = 1, ncu, cold caches).
``row`` is an int or a device int32 [1] (the round counter, with ``row_offset = -1``: row = round - 1); the row
is read by every thread before a barrier, after which thread 0 may advance the counter itself.
Shapes: tree rows tokens / depth / parent [B] int32, logw [B] float64, n [1]; accepted [L+1], n_acc [1],
result [L+2], chosen [B+1] int32; lp / ids [L, K]; rec: dict of [rounds, ...] device arrays as above.
Example: accepted [0, 2, -1], n_acc [2], chosen [7, 1, 3], ids [[5, 7], [9, 3]], lp [[-1, -2], [-3, -4]]
-> draft_lp = [-2 (7 at depth 1), -4 (3 at depth 2)]; result [2, 7, 3, -1] -> root 3, start + 2.
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, int32

from .. import backend
from . import _checks
from .primitives import warp_min

FIELDS = ("tokens", "depth", "parent", "logw", "n", "accepted", "n_acc", "result", "draft_lp")


def draft_lp_ref(chosen, accepted, m: int, lp, ids):
    """draft_lp [L]: for d < m, the draft's log-prob of chosen[accepted[d]] at depth d + 1 (NaN if not in ids[d])."""
    L = lp.shape[0]
    out = np.full(L, np.nan, np.float32)
    for d in range(min(m, L)):
        c = chosen[accepted[d]]
        hit = np.flatnonzero(np.asarray(ids[d]) == c) if c >= 0 else []
        if len(hit):
            out[d] = lp[d, hit[0]]
    return out


@cuda.jit
def _round_end_kernel(tokens, depth, parent, logw, n, accepted, n_acc, result, chosen, lp, ids,
                      r_tokens, r_depth, r_parent, r_logw, r_n, r_accepted, r_n_acc, r_result, r_draft_lp,
                      row0, row_dev, advance, start, root, round_, copy_root, root_copy):
    tid = cuda.threadIdx.x
    nt = cuda.blockDim.x
    row = row0 + row_dev[0]
    m = n_acc[0]
    for i in range(tid, r_tokens.shape[1], nt):
        r_tokens[row, i] = tokens[i]
        r_depth[row, i] = depth[i]
        r_parent[row, i] = parent[i]
        r_logw[row, i] = logw[i]
    for i in range(tid, accepted.shape[0], nt):
        r_accepted[row, i] = accepted[i]
    for i in range(tid, result.shape[0], nt):
        r_result[row, i] = result[i]
    buf = cuda.shared.array(32, int32)                  # the simulator's warp scratch (untouched on the GPU)
    lane = tid % 32
    K = ids.shape[1]
    for d in range(tid // 32, lp.shape[0], nt // 32):   # a warp per depth: 32 of its ids compared at once
        c = chosen[accepted[d]] if d < m else -1         # warp-uniform, as every branch below
        first = K
        if c >= 0:
            for j0 in range(0, K, 32):
                j = j0 + lane
                first = warp_min(j if j < K and ids[d, j] == c else K, buf)
                if first < K:
                    break
        if lane == 0:
            r_draft_lp[row, d] = lp[d, first] if first < K else math.nan
    cuda.syncthreads()                                   # every thread has read row (round_ may be row_dev)
    if tid == 0:
        r_n[row] = n[0]
        r_n_acc[row] = m
        if advance:
            start[0] += m
            r = max(result[max(result[0], 0)], 0)
            root[0] = r
            if copy_root:
                root_copy[0] = r
            round_[0] += 1


def round_end(rec: dict, tree, acceptor, lp, ids, row, row_offset: int = 0, advance=None, root_copy=None) -> None:
    """Write the round's records into row ``row + row_offset`` of ``rec`` (module docstring) from ``tree`` (a
    DeviceTrees of one request: its row 0 is used), ``acceptor`` (tree_accept.Acceptor after its run) and the
    round's top-K draft ``lp, ids [L, K]``. ``advance = (start, root, round)``, device int32 [1] arrays: also
    move the replayed round's state on; ``root_copy`` (device int32 [1], with ``advance``): a second home of the
    next root (the drafter's block slot, ``DFlashDrafter.root_slot``: no copy launch in the draft). No host read
    on the GPU."""
    missing = [f for f in FIELDS if f not in rec]
    if missing:
        raise ValueError(f"rec: missing the record {missing[0]!r}, expected the keys {FIELDS}")
    rounds, B = rec["tokens"].shape
    L = lp.shape[0]
    if rec["draft_lp"].shape != (rounds, L) or rec["accepted"].shape != (rounds, acceptor.accepted.shape[0]):
        raise ValueError(f"rec: draft_lp {tuple(rec['draft_lp'].shape)} / accepted {tuple(rec['accepted'].shape)}"
                         f" do not match {L} depths and the acceptor's {acceptor.accepted.shape[0]} path slots")
    if root_copy is not None and advance is None:
        raise ValueError("root_copy: a second home of the next root needs advance=(start, root, round)")
    row0, row_dev = _checks.device_int(row, "row")
    row0 += row_offset
    if not hasattr(row, "shape") and not 0 <= row0 < rounds:
        raise ValueError(f"row: expected a record row in [0, {rounds}), got {row0}")
    cols = (tree.tokens[0, :B], tree.depth[0, :B], tree.parent[0, :B], tree.logw[0, :B], tree.n[:1])
    if backend.name == "numpy":
        r = _checks.host_int(row) + row_offset
        for f, v in zip(FIELDS, cols + (acceptor.accepted, acceptor.n_acc, acceptor.result)):
            rec[f][r] = v[0] if f in ("n", "n_acc") else v
        m = int(acceptor.n_acc[0])
        rec["draft_lp"][r] = draft_lp_ref(acceptor.chosen, acceptor.accepted, m, lp, ids)
        if advance is not None:
            start, root, round_ = advance
            res = acceptor.result
            start[0] += m
            root[0] = max(int(res[max(int(res[0]), 0)]), 0)
            if root_copy is not None:
                root_copy[0] = root[0]
            round_[0] += 1
        return
    flag = advance is not None
    start, root, round_ = advance if flag else (row_dev, row_dev, row_dev)      # unused when not advancing
    backend.launch(_round_end_kernel, 1, backend.block_size(512, 32), *cols, acceptor.accepted, acceptor.n_acc,
                   acceptor.result, acceptor.chosen, lp, ids, *(rec[f] for f in FIELDS), row0, row_dev, flag,
                   start, root, round_, root_copy is not None,
                   acceptor.n_acc if root_copy is None else root_copy)    # a read-only placeholder: the simulator
                                                                          # copies arguments back one by one
