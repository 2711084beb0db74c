"""The tree build's heap path: for budgets <= HEAP_BUDGET (64, K > 1) one warp runs DDTree's heap algorithm
itself, pop by pop - the same tree as ``tree_build.build_tree_ref`` and the level loop, bit for bit.

The level loop pays its barriers, sort and merge once per depth: its build stage took 0.104 ms of a 1.1 ms DDTree-64
round of the trained pair (bench_round), against 15-19 us for bench_tree's 2-3-deep trees. Warp 0 runs the heap
algorithm instead (``_heap_lanes``), with the frontier kept sorted across the 32 lanes - lane j holds the j-th node
in pop order - so a pop is lane 0's node and its two pushes (the next sibling, the first child) land where they
belong by two ballots and one gather: the same tree, with no levels to count (``stats`` stays 0). Its cost grows
with the budget, not with the depth. So the kernel picks by the rows (``tree_build.heap_path``, mode 0;
``heap_pays``): the heap when budget <= HEAP_POPS_PER_LEVEL (8) x ``depth_bound``, an upper bound on the depth read
off the rows (the greedy path's weights against depth 1's budget-th log-prob); the level loop otherwise.
TreeBuilder modes LEVELS / HEAP force either (tests).
Measured on the H200 (bench_tree's second table, graph replays, one request, K = budget, 2026-12-05): the heap path
13.2-15.3 us at budget 16, 21.2-23.1 at 32, 36.5-37.9 at 64 (~0.6-0.8 us a pop) against the level loop's ~6-7 us a
level plus ~5 (11.0 us 1 deep at budget 16, 25.0 3 deep at 64, 74.5-127 for trees 12-15 deep). The first heap loop
(until 2026-12-05) scanned the frontier slots every pop - each lane the first of its slots, a 5-step shuffle
butterfly, lane 0's serial slot bookkeeping - and took 18.9-20.8 / 32.4-33.9 / 61.4-63.3 us (~0.95 us a pop): the
sorted lanes are 1.36-1.68x faster, and it was deleted.
Each node carries the two weights its pop will push (``_push_weights``, computed when it is pushed, from log-probs
staged as float64) since 2026-12-06: on an H100 (bench_tree's second table, this code against the one before, two
processes on one machine) the heap path took 10.9-11.2 / 15.6-16.1 / 25.3-27.3 us at budgets 16 / 32 / 64 against
13.5-14.1 / 19.9-20.8 / 32.6-33.1 (~0.31 us a pop against ~0.39); the level loop 11.2-129 against 12.5-132.

Shapes: the request's log-prob rows ``lp_req`` [L * K] float32 (each row sorted descending), staged as float64
into the build kernel's shared ``sort_w`` (ROW_FLOATS entries, unused by the heap path otherwise); a node table of
shared arrays (HEAP_BUDGET entries: the build kernel's ``small`` table) receives the popped nodes at entries 0 ..
n - 1 in pop order, so a tie's walk and ``tree_build._write_outputs``' walks up the parents read shared memory.
Thread mapping: warp 0 of the build kernel's block; the other warps wait at the closing barrier.
"""
import math

import numpy as np
from numba import cuda, float64, int32, uint32

from ._intrinsics import SIM
from .primitives import FULL, warp_sync
from .tree_order import _leaf_tuple_less

HEAP_BUDGET = 64          # budgets up to this (K > 1): warp 0 may run the heap itself (``_heap_lanes``)
assert HEAP_BUDGET <= 64  # ``_heap_lanes`` keeps (B + 1) // 2 <= 32 frontier nodes, one a lane (its docstring)
HEAP_POPS_PER_LEVEL = 8   # mode 0 runs the heap when budget <= this x depth_bound: a level of the loop costs ~8-10
                          # heap pops (H200: ~0.6-0.8 us a pop, ~6-7 us a level; module docstring)
ROW_FLOATS = 2048         # the log-probs a heap build stages, as float64 (tree_build's sort_w: SORT_CACHE entries)


def heap_fits(L: int, K: int, budget: int) -> bool:
    """Whether the heap path can run: budgets up to HEAP_BUDGET with K > 1 (K = 1 is a chain: ``_chain_nodes``)
    and the log-prob rows a pop can read, L x min(K, budget + 1), within the ROW_FLOATS of the build kernel's
    row buffer. Example: heap_fits(15, 4096, 64) -> True (15 x 65 floats); heap_fits(32, 4096, 64) -> False."""
    return K > 1 and budget <= HEAP_BUDGET and L * min(K, budget + 1) <= ROW_FLOATS


@cuda.jit(device=True)
def _heap_fits(L, K, B):
    """``heap_fits`` in the kernel (uint32 L, K, B)."""
    return K > uint32(1) and B <= uint32(HEAP_BUDGET) and L * min(K, uint32(B + uint32(1))) <= uint32(ROW_FLOATS)


def depth_bound(lp: np.ndarray, budget: int) -> int:
    """An upper bound on the tree's depth from the rows alone: the greedy path's weights S_d = lp[0][0] + ..
    + lp[d-1][0] (float64, in this order) bound every depth-d node's weight, and the first min(budget, K) ranks of
    depth 1 already give ``budget`` nodes of weight >= t = lp[0][budget - 1] (t = -inf when K < budget), so no
    depth with S_d < t is reached. Returns the first d with S_(d+1) < t or -inf (L if none). ``lp [L, K]``.
    Example: rows [[-0.1, -2.5], [-0.2, -1.8]], budget 2: t = -2.5, S = -0.1, -0.3 -> 2."""
    L, K = lp.shape
    t = np.float64(lp[0, budget - 1]) if 0 < budget <= K else -np.inf
    s, d = np.float64(0.0), 0
    while d < L and lp[d, 0] != -np.inf and s + np.float64(lp[d, 0]) >= t:
        s += np.float64(lp[d, 0])
        d += 1
    return d


def heap_pays(lp: np.ndarray, budget: int) -> bool:
    """Mode 0's rule (``tree_build.heap_path`` adds where it fits and the test modes): the budget's pops are
    predicted cheaper than the levels, budget <= HEAP_POPS_PER_LEVEL x depth_bound (a pop costs ~0.6-0.8 us, a
    level ~6-7 us on the H200: module docstring). Example: 15 rows of N(0, 4) logits over 4096 tokens, rank 0
    raised by 12 (trees 10-11 deep), budget 64: bound 15 -> True (64 <= 90); raised by 9 (3 deep): bound 3 ->
    False (64 > 18) - the faster path in both (measured)."""
    return budget <= HEAP_POPS_PER_LEVEL * depth_bound(lp, budget)


@cuda.jit(device=True)
def _heap_pays(lp_req, L, K, B, scratch):
    """The device side of ``heap_path`` in mode 0: B <= HEAP_POPS_PER_LEVEL x depth_bound, depth_bound from the
    rows' first entries staged in ``scratch`` (float64 shared, >= L entries) and summed by every thread in the same
    order as the host (so both decide alike). Every thread returns the same answer; ends with a barrier (scratch
    is free again)."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    i = tid
    while i < L:
        scratch[i] = float64(lp_req[i * K])
        i = uint32(i + nt)
    cuda.syncthreads()
    t = float64(lp_req[B - uint32(1)]) if B <= K else -math.inf
    s = 0.0
    d = uint32(0)
    while d < L and scratch[d] != -math.inf and s + scratch[d] >= t:
        s += scratch[d]
        d = uint32(d + uint32(1))
    cuda.syncthreads()
    return B <= uint32(HEAP_POPS_PER_LEVEL) * d


if SIM:
    @cuda.jit(device=True)
    def _lane_read(v, src, buf):
        """Lane src's v (src may differ by lane): the simulator's stand-in of one shfl through shared ``buf``."""
        cuda.syncthreads()
        buf[cuda.threadIdx.x] = v
        cuda.syncthreads()
        return buf[src]

    @cuda.jit(device=True)
    def _lane_mask(pred, buf):
        """Bit l set where lane l's pred holds: the simulator's stand-in of one ballot through shared ``buf``."""
        cuda.syncthreads()
        buf[cuda.threadIdx.x] = int32(1 if pred else 0)
        cuda.syncthreads()
        m = uint32(0)
        for j in range(32):
            if buf[j] != 0:
                m |= uint32(1) << uint32(j)
        return m

else:
    @cuda.jit(device=True)
    def _lane_read(v, src, buf):
        """Lane src's v (src may differ by lane: a gather): one shfl (two for a float64). buf: the simulator's."""
        return cuda.shfl_sync(FULL, v, src)

    @cuda.jit(device=True)
    def _lane_mask(pred, buf):
        """Bit l set where lane l's pred holds: one ballot. buf: the simulator's."""
        return uint32(cuda.ballot_sync(FULL, pred))


@cuda.jit(device=True)
def _stage_rows(lp_req, rows, L, K, B):
    """Every thread: the L rows' first W = min(K, B + 1) log-probs, as float64, into the shared ``rows``
    (ROW_FLOATS entries; row d at d W): what a pop reads - a popped node's rank is below B, so a sibling's at most
    B. float32 -> float64 is exact, so the heap's float64 sums are unchanged, and no pop waits on a conversion.
    Then a barrier. Returns W."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    W = min(K, uint32(B + uint32(1)))
    i = tid
    while i < uint32(L * W):
        d = i // W
        rows[i] = float64(lp_req[d * K + (i - d * W)])
        i = uint32(i + nt)
    cuda.syncthreads()
    return W


# ------------------------------------------------------------------------------------------------ the heap loop
@cuda.jit(device=True)
def _pack(d, rk, p):
    """A frontier node in one int32: depth << 16 | rank << 8 | (tree parent's entry + 1); rank and parent + 1 are at
    most B <= HEAP_BUDGET < 256. -1: no node. Example: _pack(2, 1, 0) = 0x20101."""
    return int32((int32(d) << int32(16)) | (int32(rk) << int32(8)) | int32(p + 1))


@cuda.jit(device=True, inline=True)
def _push_logprobs(rows, W, L, d, rk):
    """The log-probs ``_push_weights`` needs for the node at depth d >= 1, rank rk: (lp[d-1][rk], lp[d-1][rk+1],
    lp[d][0]) from the staged ``rows``, every index clamped into the L x W staged entries (values past the row or
    the last depth are read but not used: the child of a depth-L node, depth L + 1, reads row L - 1), so the three
    loads go out at once and never past the buffer, even at L W = ROW_FLOATS."""
    last = uint32(W - uint32(1))
    nxt = uint32(rk + uint32(1))
    base = uint32(uint32(min(d, L) - uint32(1)) * W)
    return (rows[uint32(base + min(rk, last))], rows[uint32(base + min(nxt, last))],
            rows[uint32(min(d, uint32(L - uint32(1))) * W)])


@cuda.jit(device=True, inline=True)
def _push_weights(w, lps, W, L, d, rk):
    """What popping the node (weight w, depth d, rank rk; ``lps`` from ``_push_logprobs``) pushes: its next
    sibling's weight (w - lp[d-1][rk]) + lp[d-1][rk+1] and its first child's w + lp[d][0] (float64, the heap's
    order), each -inf where there is none (rank rk + 1 outside the staged row of W = min(K, B + 1) ranks, depth L,
    a -inf log-prob). A rank-B node, the only one whose sibling lies outside the row when K > B, never pops
    (``_heap_lanes``). Example (rows [[-0.1, -2.5], [-0.2, -1.8]], W = 2, L = 2): node (0), w = -0.1 -> (-2.5,
    -0.3); node (0,1), w = -1.9 -> (-inf, -inf)."""
    cur, nxt, first = lps
    sw = (w - cur) + nxt if uint32(rk + uint32(1)) < W and nxt > -math.inf else -math.inf
    cw = w + first if d < L and first > -math.inf else -math.inf
    return sw, cw


@cuda.jit(device=True)
def _heap_lanes(lp_req, rows, L, K, B, nodes, fbuf, ibuf, count):
    """Budgets <= HEAP_BUDGET (``tree_build.heap_path``): warp 0 runs the heap algorithm itself - ``build_tree_ref``
    pop for pop, so the same tree bit for bit - with the frontier (the pushed, unpopped nodes) kept sorted across
    the warp's lanes: lane j holds the j-th node in pop order (weight ``fw``, ``_pack``ed depth / rank / parent
    ``fk``, and the two weights its pop will push, ``fsw`` / ``fcw``), so a pop is lane 0's node, and its pushes
    are inserted where they belong: every lane compares its node with the two new ones, two ballots count the
    nodes ahead of each, and one gather (shfl from lane src) shifts the rest. A node's pushes are computed when it
    is pushed (``_push_logprobs`` before the comparisons, ``_push_weights`` after the gather), so a pop starts from
    lane 0's four values without a load or an add in between: ~210 instructions a pop instead of ~160 (the SASS),
    on a shorter dependent path; 202 since its sums and compares are kept to 32 bits and the table is shared (the
    loop's hot path, ``benchmarks/ptxas_report.py --sass``, sm_90), which left a DDTree-32 build of the trained
    pair's rows at the same 14.3 us (H100, docs/PERFORMANCE.md, forty-first session). Table entries 0 .. n - 1
    receive the popped nodes in pop order (what ``tree_build._write_outputs`` reads); log-probs are read from rows
    staged in shared memory as float64 (L x min(K, B + 1) entries: a popped node's rank is below B, so a sibling's
    at most B). No level statistics: ``stats`` stays 0.
    Why 32 lanes hold every node that matters: after pop n (n + 1 popped) B - n - 1 pops remain, so a node at
    position >= B - n - 1 never pops (pushes only ever land ahead of it), and the frontier holds at most n + 2
    nodes; min(n + 2, B - n - 1) <= (B + 1) / 2 <= 32 for B <= HEAP_BUDGET = 64. A node shifted past lane 31 is one
    of those and is dropped. Ties (equal float64 weights) compare rank tuples through the popped ancestors in the
    table (lane 0 writes the popped node at entry n, then a __syncwarp, before any lane compares), in one loop
    over a lane's bit mask of the comparisons that tied, so the table walk is compiled once, not three times (the
    pop loop: 17 KB of SASS instead of 45 KB, ptxas sm_90; ncu found the level loop bound by instruction fetch).
    The same pops as ``build_tree_ref``: the same weights (sibling (w - lp[d-1][r]) + lp[d-1][r+1], child w +
    lp[d][0], float64 in that order) and the same order. Returns the node count (through the shared ``count``).
    Example (L = 2, K = 2, budget 3, rows [[-0.1, -2.5], [-0.2, -1.8]]): lanes [(0) -0.1]; pop (0) -> push (1) -2.5
    and (0,0) -0.3: (0,0) first, (1) behind it -> lanes [(0,0) -0.3, (1) -2.5]; pop (0,0) -> (0,1) -1.9 goes ahead
    of (1) -> [(0,1), (1)]; pop (0,1): 3 nodes."""
    W = _stage_rows(lp_req, rows, L, K, B)
    w, depth, rank, parent, _, _ = nodes
    tid = uint32(cuda.threadIdx.x)
    if tid < uint32(32):
        lane = int32(tid)
        fw = -math.inf                                   # this lane's frontier node (fk -1: none) and the
        fk = int32(-1)                                   # weights it pushes when popped (``_push_weights``)
        fsw = -math.inf
        fcw = -math.inf
        if lane == 0 and B > uint32(0) and L > uint32(0) and rows[0] > -math.inf:
            fw = rows[0]
            fk = _pack(1, 0, -1)
            fsw, fcw = _push_weights(fw, _push_logprobs(rows, W, L, uint32(1), uint32(0)), W, L, uint32(1),
                                     uint32(0))
        n = uint32(0)                                    # nodes popped
        while n < B:
            hw = _lane_read(fw, 0, fbuf)                 # the pop: lane 0's node
            hk = _lane_read(fk, 0, ibuf)
            sw = _lane_read(fsw, 0, fbuf)                # its next sibling's weight (-inf: none) ...
            cw = _lane_read(fcw, 0, fbuf)                # ... and its first child's
            if hk < 0:
                break
            d = uint32(hk) >> uint32(16)
            rk = (uint32(hk) >> uint32(8)) & uint32(255)
            if lane == 0:                                # what _write_outputs and tie walks read (no record
                w[n] = hw                                # parents: the level loop's)
                depth[n] = d
                rank[n] = rk
                parent[n] = int32(uint32(hk) & uint32(255)) - int32(1)
            # entry n seen by every lane's tie comparisons below (a child's walk starts at its parent, entry n)
            warp_sync()
            sk = int32(hk + int32(256)) if sw > -math.inf else int32(-1)          # the sibling (-1: none)
            ck = _pack(uint32(d + uint32(1)), 0, n) if cw > -math.inf else int32(-1)   # the first child
            # what the two new nodes will push in turn depends on the popped node alone: the loads go out here,
            # the adds follow the gather, so both overlap the comparisons, ballots and shuffles between
            rk1 = uint32(rk + uint32(1))                 # the sibling's rank, the child's depth (32-bit: numba
            d1 = uint32(d + uint32(1))                   # widens sums to 64 bits, and compares of those cost twice)
            s_lp = _push_logprobs(rows, W, L, d, rk1)
            c_lp = _push_logprobs(rows, W, L, d1, uint32(0))
            # three orders by weight - the child before the sibling, this lane's node before each - and equal
            # weights (rare) settled by rank tuples in one loop over a bit mask, so the tie walk is compiled once
            behind = lane > 0 and fk >= 0                # lanes 1.. hold the nodes left after the pop
            c_first = ck >= 0 and (sk < 0 or cw > sw)
            f_c = behind and ck >= 0 and fw > cw
            f_s = behind and sk >= 0 and fw > sw
            ties = uint32(uint32(1) if behind and ck >= 0 and fw == cw else uint32(0))
            if behind and sk >= 0 and fw == sw:
                ties = uint32(ties | uint32(2))
            if ck >= 0 and sk >= 0 and cw == sw:
                ties = uint32(ties | uint32(4))
            while ties != uint32(0):
                j = uint32(ties & uint32(~ties + uint32(1)))   # the lowest tie left
                kx = ck if j == uint32(4) else fk
                ky = ck if j == uint32(1) else sk
                less = _leaf_tuple_less(kx >> 16, (kx >> 8) & 255, (kx & 255) - 1, ky >> 16, (ky >> 8) & 255,
                                        (ky & 255) - 1, depth, parent, rank)
                if j == uint32(1):
                    f_c = less
                elif j == uint32(2):
                    f_s = less
                else:
                    c_first = less
                ties = uint32(ties ^ j)
            aw = sw                                      # a: the first of the two in pop order, b: the other
            ak = sk
            bw = cw
            bk = ck
            if c_first:
                aw = cw
                ak = ck
                bw = sw
                bk = sk
            ma = _lane_mask(f_c if c_first else f_s, ibuf)
            mb = _lane_mask(f_s if c_first else f_c, ibuf)
            pa = int32(cuda.popc(ma)) if ak >= 0 else int32(64)             # a's new lane
            pb = int32(cuda.popc(mb) + 1) if bk >= 0 else int32(64)         # b's (after a)
            src = int32(lane + int32(1) - int32(lane > pa) - int32(lane > pb))   # whose node moves to this lane
            gw = _lane_read(fw, min(src, int32(31)), fbuf)
            gk = _lane_read(fk, min(src, int32(31)), ibuf)
            gsw = _lane_read(fsw, min(src, int32(31)), fbuf)
            gcw = _lane_read(fcw, min(src, int32(31)), fbuf)
            s_sw, s_cw = _push_weights(sw, s_lp, W, L, d, rk1)
            c_sw, c_cw = _push_weights(cw, c_lp, W, L, d1, uint32(0))
            a_sw = c_sw if c_first else s_sw
            a_cw = c_cw if c_first else s_cw
            b_sw = s_sw if c_first else c_sw
            b_cw = s_cw if c_first else c_cw
            if lane == pa:
                fw = aw
                fk = ak
                fsw = a_sw
                fcw = a_cw
            elif lane == pb:
                fw = bw
                fk = bk
                fsw = b_sw
                fcw = b_cw
            elif src > int32(31):
                fw = -math.inf
                fk = int32(-1)
            else:
                fw = gw
                fk = gk
                fsw = gsw
                fcw = gcw
            n = uint32(n + uint32(1))
        if lane == 0:
            count[0] = n
    cuda.syncthreads()
    return uint32(count[0])
