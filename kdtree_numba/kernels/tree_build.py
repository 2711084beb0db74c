"""DDTree's best-first draft tree, built on the GPU - the same tree the heap algorithm builds, bit for bit.

**The heap algorithm (the reference, ``build_tree_ref``).** Per-depth candidates come sorted: ``lp[d][r]`` is the
log-prob (<= 0) of the r-th best token at depth d (d = 1..L, r < K). A node is a rank tuple (r_1, .., r_d), weight
logw = sum_i lp[i][r_i] (float64). Max-heap on logw, ties by rank tuple (Python tuple order); start with
(depth 1, rank 0). Pop -> node i (pop order; the root is node 0). Push its next sibling with
``logw - lp[d][r] + lp[d][r+1]`` (float64, in this order) and its first child with ``logw + lp[d+1][0]``.
Stop after ``budget`` pops. Candidates whose log-prob is -inf (probability 0) are never pushed, so a row of -inf
ends its branch (the official code would push them and produce NaN weights).

**Why a parallel version is subtle.** Pop order is not simply "sort by (-logw, tuple)": a sibling's telescoped
weight can round an ulp *above* its generator's (equal or ulp-close log-probs, e.g. uniform rows), yet the heap
still pops the generator first, and the sibling right after it. Exactly: the heap is a best-first search over
the *generation tree* (each node generates its next sibling and its first child). Give each node its record
parent rp(X) = the nearest generation ancestor whose key (-logw, tuple) is larger than X's (the "previous greater
element" on its generation path), or none. Best-first order is the preorder of this record tree with children in
key order: with no rounding inversions every rp is none and the order is a plain sort by key. The comparator
(``tree_order._pops_before``) walks record parents (usually zero steps) and, for equal weights, tree parents to
compare rank tuples.

**The parallel formulation (``_build_kernel``, one block per request).** Level by level, d = 1..L, with G = the
top list (the first B nodes of depth < d in pop order, B = budget):
  1. expand (``_choose_floor``, ``_write_children``, ``_walk_chains``): every node of depth d-1 in G (the root
     for d = 1) is a parent; its children's sibling chain r = 0, 1, .. carries the heap's telescoped float64
     weights (w_0 = W_p + lp[d][0], w_{r+1} = (w_r - lp[d][r]) + lp[d][r+1]). A chain stops at rank B (r earlier
     siblings pop first), at a -inf log-prob, or below the level's floor (next paragraph).
     Fast path: while every step is exact ((w_r - lp[r]) == W_p, the rule for sums of float32 log-probs),
     w_r = fl(W_p + lp[d][r]): non-increasing, each computable alone. So one thread per parent finds its chain's
     length by binary search, a block scan (warp shuffles, one barrier) turns lengths into table slots, and one
     thread per child writes its entry, checks the exactness its successor relies on, and finds its record
     parent: in a chain whose weights never rise (every exact chain) no earlier sibling is lighter, so it is the
     nearest lighter node on the parent's generation path. If any step is inexact, the level is redone with one
     thread per parent walking its chain in order (``_walk_chains``; test:
     test_inexact_telescoping_walks_chains_in_order); a rising chain (only possible there) gets its record
     parents in chain order by previous-greater jumps.
  2. sort the candidates by pop order (``_rank_sort`` up to RANK_SORT candidates: each counts those popping
     before it, no barriers; ``_bitonic_sort`` above), in shared memory with the weights and record depths beside
     the indices (up to SORT_CACHE candidates; global memory above), so the comparator only reads the table for
     equal weights or record-tree nodes. At d = 1 the fast path needs no sort: one exact chain from the root is
     already in pop order.
  3. merge them into G (``_merge``: co-ranking by binary search), keep the first B, and rewrite the node table in
     the new pop order (``_rewrite_table``: table index == pop position, parent / record-parent links remapped).
After depth L (or when a depth adds no node) G is the tree in pop order (``_write_outputs``). The per-depth top-B
is exact for *any* total order consistent with the heap (a node's first B at depth d are among the first B of all
nodes at depth d, and its parent pops before it), which is why the level-by-level split loses nothing.

**The floor: which children can never pop within the first B.** Lemma: if B distinct real nodes (nodes of the
generation tree: ranks < K, finite log-probs) have weights >= t, no node X with w_X < t - margin pops among the
first B (margin = 2^-30 max(1, |t|)). Proof: if X popped at position <= B, some witness Y has not popped yet; the
heap then holds Y or a generation ancestor A of Y (every unpopped node's nearest unpopped ancestor has had its
generator popped), and w_A >= w_Y - (rounding along the path; log-probs <= 0 make every exact step non-increasing)
> w_X, so the heap would pop A before X. The rounding involved - at most 2 L B roundings along the path, and the
gap between fl(W_p + lp[r]) and a chain's telescoped weight, 2(r+1) more, each of magnitude <= 2^-53 |t| - is
< 2^-35 |t| for L <= 64, far below the margin, so the fast and the walked (slow) path use the same floor.
The witnesses, at level d: count(t) = #{G nodes with w >= t} + #{children (p, r) of the level's parents, r <
min(K, B), lp[d][r] finite, fl(W_p + lp[d][r]) >= t}, every one a real node. (G itself once full, t = tau = its
smallest weight, is the special case count_G = B: the starting floor.) When the chains at the starting floor hold
more than 2B candidates, ``_raise_floor`` bisects t over the weights of the first parent's children,
t_r = fl(W_ref + lp[d][r]) (W_ref: the first depth-(d-1) node of G in pop order; count(t_r) grows with r): the
smallest r with count(t_r) >= B, stopping as soon as B <= count(t_r) <= 2B. A probe is one pass over G (the
chain-length binary search with t in place of the floor) and a block sum (one barrier); at most
log2(min(K, B)) + 1 of them, 2-5 on peaked rows. The floor is then max(tau, t_r) - margin.
What it buys: on peaked rows (log_softmax of N(0, s^2) logits, s = 3..6, V = K = 4096, L = 8..16) the chains
at level 2 held up to ~18,000 candidates at B = 1024 with tau alone (~3,000 at level 3; ~1,900 at B = 256) -
sorted in global memory - and hold at most ~1,450 with the raised floor, inside SORT_CACHE at every level for
B = 64, 256, 1024 (tests/kernels/test_tree_build_floor.py). (The rectangle witness {(p_j, r): j <= i,
r <= ceil(B/(i+1)) - 1}, t = fl(min_{j<=i} W_pj + lp[d][r]), is valid too - count(t) >= (i+1)(r+1) >= B - but
its staircase leaves ~B ln B candidates: up to ~3,900 at B = 1024.)
Degenerate inputs: equal weights cannot be split by any floor (all witnesses tie), e.g. three finite tokens at
depth 1 and a uniform row of >= 1024 tokens at depth 2 make 3 x 1024 equal-weight candidates at B = 1024; the
level then sorts them in global memory - slower, still exact. A smaller ``capacity`` than the worst case
(budget x min(K, budget)) flags ``overflow`` instead; ``build_trees`` then retries with the worst case.

**The node table** (per request, two copies swapped every depth: entries [0, |G|) are G in pop order, the
candidates are appended after them): ``wtab[copy, request, entry]`` float64 weight, and ``itab[copy, FIELD,
request, entry]`` int32 with FIELD = DEPTH, RANK (r_d, the rank at the node's own depth), PARENT (tree parent's
entry, -1 = the root), RECORD_PARENT (entry, -1 = none), RECORD_DEPTH (1 + the record parent's, 1 without one).
Device functions receive a copy as the tuple ``nodes = (weight, depth, rank, parent, rparent, rdepth)``. The chain
(up to RANK_SORT nodes) and the heap path need no second copy: their table is a tuple of shared arrays the level
loop's sort would use (``small`` in ``_build_kernel``), so the walks up the parents that write the paths read shared
memory, not global (a 15-deep node's walk was 15 dependent global loads).

**Cost model.** A block spends its time waiting on instruction fetch, barriers and round trips, not on arithmetic
(B = 256, 16 requests, H200, ncu), so the kernel is written for few instructions and few barriers: unsigned
32-bit while loops (numba's range() computes a 64-bit trip count by division; signed indices add wraparound
code), warp-shuffle scans and minima, the next depth's log-probs loaded while a level runs, coalesced output
stores, and (the raised floor) sorts that stay in shared memory.

Worked example (L = 2, K = 2, budget 3): lp = [[-0.1, -2.5], [-0.2, -1.8]].
  d = 1: chain of the root: (0) w = -0.1, (1) w = -2.5           -> G = [(0), (1)]  (not full: no floor)
  d = 2: parents (0): (0,0) -0.3, (0,1) -1.9;  (1): (1,0) -2.7, (1,1) -4.3: 4 candidates (<= 2B, kept as is);
         sorted: (0,0), (0,1), (1,0), (1,1); merge with G -> [(0) -0.1, (0,0) -0.3, (0,1) -1.9]
  tree: node 1 = (0) depth 1 parent 0; node 2 = (0,0) depth 2 parent 1; node 3 = (0,1) depth 2 parent 1.
The heap pops (0), (0,0), (0,1) - the same.
Floor example (L = 2, K = 3, budget 4): lp = [[-0.1, -0.2, -0.3], [-0.5, -1.0, -2.0]].
  d = 1: G = [(0) -0.1, (1) -0.2, (2) -0.3] (3 < 4: no tau); d = 2: 9 candidates at floor -inf > 2B = 8, so
  bisect over t_r = -0.1 + lp[2][r]: r = 1, t = -1.1: count = 3 (G) + 4 ((0,0) -0.6, (0,1) -1.1, (1,0) -0.7,
  (2,0) -0.8) = 7 in [4, 8]: one probe, floor -1.1 - margin, those 4 candidates; tree (0), (1), (2), (0,0).

**Small budgets, deep trees: the heap itself** (``tree_heap``). The level loop pays its barriers, sort and merge once
per depth (~6-7 us a level on the H200); for budgets <= tree_heap.HEAP_BUDGET (64) warp 0 can run the heap
algorithm itself, pop by pop (~0.3 us a pop on an H100, whatever the depth: tree_heap's docstring). Mode 0 picks
by the rows (``heap_path``): the heap when the budget's pops cost less than the levels a bound on the tree's depth
predicts, the level loop otherwise. TreeBuilder modes LEVELS / HEAP force either (tests).

**A chain (K = 1: the DFlash chain baseline, one draft per depth)** needs no search: the heap pops depth 1, 2, ..
in order, each node the only child of the one before. ``_chain_nodes`` writes that table in one thread (weights
added in the heap's order; the level loop's statistics with it) instead of running the level loop once per depth:
ncu measured the loop at 77.9 us for a 15-deep chain round of the default pair (7 % of the round; a DDTree-64
tree of a few levels took 30.5 us).

Outputs for verify: each node's root-to-node path ``paths [n+1, L+1]`` (node indices by depth, -1 padded) and
``path_depth [n+1]`` (0 for the root): the compact ancestor representation tree_verify reads. The kernel fills
paths with -1 by consecutive threads, then writes each node's entries by walking up its parents. Fewer than B
nodes are padded with children of the root (verified, never accepted).
Statistics (TreeBuilder.candidates / .probes, per request and depth; ``level_counts_ref`` computes the same on the
host): the candidates each level's chains held (what step 2 sorted) and the bisection probes spent on its floor.
Shapes: lp [R, L, K] float32 (rows sorted desc), ids [R, L, K] int32 -> per request a ``Tree`` (kernels/tree.py) of
up to B nodes.
Invariants (tested): the tree equals build_tree_ref's node for node (tokens, depths, parents, float64 weights);
parents precede children; the candidates of a level include every node of that depth the heap keeps.
"""
from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np
from numba import cuda, float32, float64, int32, uint32

from .. import backend
from . import _checks
from .primitives import block_min, block_prefix_sum
from .tree import Tree
from .tree_heap import HEAP_BUDGET, ROW_FLOATS, _heap_fits, _heap_lanes, _heap_pays, heap_fits, heap_pays
from .tree_order import _before, _pops_before, _record_parent

MAX_BUDGET = 1024
MARGIN = 2.0 ** -30
MAX_THREADS = 256         # the build kernel's block size (at most; whole warps)
MAX_WARPS = MAX_THREADS // 32
PENDING = -2              # record parent not yet computed (filled in parallel)
SORT_CACHE = 2048         # candidates sorted with their keys in shared memory (16 + 8 + 8 KB); = 2 MAX_BUDGET, the
                          # most candidates a raised floor leaves (module docstring, "The floor")
RANK_SORT = 64            # up to this many candidates: rank sort; above: bitonic (128 measured no faster at
                          # B = 64 and 256, R = 16)
assert ROW_FLOATS == SORT_CACHE           # tree_heap stages its rows as float64 into the kernel's sort_w
assert HEAP_BUDGET <= RANK_SORT and 3 * RANK_SORT <= MAX_BUDGET   # ... and keeps its node table (up to RANK_SORT
                                          # nodes, as the chain's) in ranked_w / _rdepth / _node and chain_slot
SLOW_CHAINS, BITONIC = 1, 2   # TreeBuilder modes (tests): walk every chain in order / always sort by bitonic
LEVELS = 4                # TreeBuilder mode (tests): the level loop even where the heap path would run
HEAP = 8                  # TreeBuilder mode (tests): the heap path wherever it fits, however shallow the tree (where
                          # it does not, the level loop with the mode's other bits)
# the node table's int32 fields: itab[copy, FIELD, request, entry] (the float64 weight is wtab[copy, request, entry])
DEPTH, RANK, PARENT, RECORD_PARENT, RECORD_DEPTH = 0, 1, 2, 3, 4
N_FIELDS = 5


# ------------------------------------------------------------------------------------------------ reference
def _empty_tree() -> Tree:
    return Tree(np.zeros(0, np.int32), np.zeros(0, np.int32), np.array([-1], np.int32), np.zeros(0, np.float64))


def build_tree_ref(lp, ids, budget: int) -> Tree:
    """The heap algorithm, exactly as the official DDTree code runs it (plus: -inf candidates are not pushed)."""
    lp = np.asarray(lp, np.float32)
    L, K = lp.shape
    lp64 = lp.astype(np.float64)
    heap: list = []
    if budget > 0 and L > 0 and lp[0, 0] > -np.inf:
        heap.append((-lp64[0, 0], (0,), 0, 1, 0, lp64[0, 0]))
    tokens, depths, parents, logw = [], [], [-1], []
    while heap and len(tokens) < budget:
        _, tup, parent, depth, rank, w = heapq.heappop(heap)
        i = len(tokens) + 1
        tokens.append(int(ids[depth - 1][rank]))
        depths.append(depth)
        parents.append(parent)
        logw.append(w)
        if rank + 1 < K and lp[depth - 1, rank + 1] > -np.inf:
            ws = w - lp64[depth - 1, rank] + lp64[depth - 1, rank + 1]
            heapq.heappush(heap, (-ws, tup[:-1] + (rank + 1,), parent, depth, rank + 1, ws))
        if depth < L and lp[depth, 0] > -np.inf:
            wc = w + lp64[depth, 0]
            heapq.heappush(heap, (-wc, tup + (0,), i, depth + 1, 0, wc))
    return Tree(np.array(tokens, np.int32), np.array(depths, np.int32), np.array(parents, np.int32),
                np.array(logw, np.float64))


def _floor_below_ref(t: float) -> float:
    """The chains' floor for a witness weight t (module docstring, "The floor"): t - margin, or -inf."""
    return t - MARGIN * max(1.0, abs(t)) if t > -np.inf else -np.inf


@dataclasses.dataclass
class LevelCounts:
    """Per depth d = 1..L (index d - 1) of one request: the candidates the level's chains held (what step 2
    sorts), the bisection probes spent raising its floor, and the floor (-inf: none). Levels the build did not
    reach (no parent left) hold 0, 0, -inf."""
    candidates: np.ndarray   # [L] int64
    probes: np.ndarray       # [L] int64
    floors: np.ndarray       # [L] float64


def level_counts_ref(lp, budget: int) -> LevelCounts:
    """What the kernel's expansion step does at each depth, in plain NumPy (the spec of the floor; the kernel's
    TreeBuilder.candidates / .probes must equal it): G from the heap reference cut at depth d - 1, the starting
    floor from G's smallest weight once G is full, the bisection when more than 2B candidates remain, and the
    chains walked in the heap's float64 order where a fast-path step would round."""
    lp = np.asarray(lp, np.float32)
    L, K = lp.shape
    B = int(budget)
    n_lp = min(K, B)
    out = LevelCounts(np.zeros(L, np.int64), np.zeros(L, np.int64), np.full(L, -np.inf))
    no_ids = np.zeros((L, K), np.int32)
    for d in range(1, L + 1):
        row = lp[d - 1, :n_lp].astype(np.float64)
        if d == 1:
            g_w, par_w = np.zeros(0), np.zeros(1)                     # the root: weight 0
        else:
            top = build_tree_ref(lp[:d - 1], no_ids[:d - 1], B)      # G: the first B pops of depth < d
            g_w, par_w = top.logw, top.logw[top.depths == d - 1]
        if len(par_w) == 0 or row[0] == -np.inf:
            break
        fin = row[:int(np.count_nonzero(row > -np.inf))]
        child_w = par_w[:, None] + fin[None, :]                       # [parents, finite ranks] fl(W_p + lp[d][r])
        tau = g_w.min() if len(g_w) == B else -np.inf
        floor = _floor_below_ref(tau)
        if np.count_nonzero(child_w >= floor) > 2 * B:                # raise the floor: bisection over t_r
            lo, hi, t_best = 0, len(fin), -np.inf
            while lo < hi:
                mid = (lo + hi) // 2
                t = par_w[0] + fin[mid]
                count = np.count_nonzero(g_w >= t) + np.count_nonzero(child_w >= t)
                out.probes[d - 1] += 1
                if count >= B:
                    t_best, hi = t, mid
                    if count <= 2 * B:
                        break
                else:
                    lo = mid + 1
            floor = _floor_below_ref(max(tau, t_best))
        lengths = np.count_nonzero(child_w >= floor, axis=1)
        inexact = any(np.any(child_w[j, :n] - fin[:n] != par_w[j]) for j, n in enumerate(lengths))
        if inexact:                                                   # the slow path: telescoped chains
            lengths = []
            for wp in par_w.tolist():
                wc, n = wp + row[0], 0
                while wc >= floor:
                    n += 1
                    if n >= n_lp or row[n] == -np.inf:
                        break
                    wc = (wc - row[n - 1]) + row[n]
                lengths.append(n)
        out.candidates[d - 1] = int(np.sum(lengths))
        out.floors[d - 1] = floor
    return out


def heap_path(lp: np.ndarray, budget: int, mode: int) -> bool:
    """Whether the build of rows ``lp [L, K]`` runs the heap itself (``tree_heap``) rather than the level loop (the
    kernel decides the same on the device): where it fits (``tree_heap.heap_fits``), in a mode with HEAP always, in
    mode 0 by ``tree_heap.heap_pays`` (the budget's pops cheaper than the levels a bound on the depth predicts),
    never in the other modes. Example: 15 rows peaked on rank 0 (a tree 10-15 deep), budget 64 -> True; the same
    budget on rows whose tree stops at depth 3 -> False."""
    return heap_fits(*lp.shape, budget) and (bool(mode & HEAP) or (mode == 0 and heap_pays(lp, budget)))


# ------------------------------------------------------------------------------------------------ kernel steps
# Every per-thread loop is an unsigned 32-bit while loop (tree_order says why).
@cuda.jit(device=True)
def _node_table(wtab, itab, copy, r):
    """Copy ``copy`` of request r's node table as the tuple (weight, depth, rank, parent, rparent, rdepth)."""
    return (wtab[copy, r], itab[copy, DEPTH, r], itab[copy, RANK, r], itab[copy, PARENT, r],
            itab[copy, RECORD_PARENT, r], itab[copy, RECORD_DEPTH, r])


@cuda.jit(device=True)
def _load_row(dst, src, start, n):
    """dst[:n] = src[start:start + n], by consecutive threads (no barrier)."""
    c = uint32(cuda.threadIdx.x)
    while c < n:
        dst[c] = src[start + c]
        c = uint32(c + uint32(cuda.blockDim.x))


@cuda.jit(device=True)
def _store_prefetched_row(dst, src, start, n, mine):
    """Like _load_row, with this thread's first entry already in a register (``mine``, read when the level began:
    loading the row when its level started cost a round trip to L2 per level, ncu)."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    if tid < n:
        dst[tid] = mine
    c = uint32(tid + nt)
    while c < n:
        dst[c] = src[start + c]
        c = uint32(c + nt)


@cuda.jit(device=True)
def _floor_below(t):
    """The chains' floor for a witness weight t (module docstring, "The floor"): t - margin, or -inf."""
    return t - MARGIN * max(1.0, abs(t)) if t > -math.inf else -math.inf


@cuda.jit(device=True)
def _chain_nodes(lp_req, L, B, nodes, stats, r, count):
    """K = 1: the chain, as the level loop would build it. Thread 0 writes table entry i = depth i + 1, rank 0,
    tree parent i - 1 (-1: the root), no record parent, weight w_i = w_(i-1) + lp[i] (float64, the heap's sum;
    w_0 = lp[0] itself, so a -0.0 log-prob keeps its sign as in the heap), stopping at B nodes, after depth L or at
    a -inf log-prob; stats[r, d] = the one candidate level d held (at d = B + 1 only if it reached G's floor - the
    merge then cuts it). Returns the node count (through the shared ``count``, after a barrier)."""
    w, depth, rank, parent, rparent, rdepth = nodes
    if cuda.threadIdx.x == 0:
        n = uint32(0)
        wp = 0.0                              # the last node's weight: G's smallest once G is full
        d = uint32(1)
        while d <= L:
            lpd = lp_req[d - uint32(1)]
            if lpd == -math.inf:
                break
            cw = float64(lpd) if d == uint32(1) else wp + float64(lpd)   # the heap's first weight: lp itself
            if n == B:                        # G full: the child counts if it reaches the floor, then is cut
                if cw >= _floor_below(wp):
                    stats[r, d] = 1
                break
            stats[r, d] = 1
            w[n] = cw
            depth[n] = d
            rank[n] = 0
            parent[n] = int32(n) - 1
            rparent[n] = -1
            rdepth[n] = 1
            wp = cw
            n = uint32(n + uint32(1))
            d = uint32(d + uint32(1))
        count[0] = n
    cuda.syncthreads()
    return uint32(count[0])


@cuda.jit(device=True)
def _chain_length(p, d, n_lp, floor_w, top_lp, lp_d, w, depth):
    """How many children of table entry p (the root at d = 1) have weight >= floor_w on the fast path: 0 unless p
    is a parent (depth d - 1); else the first rank r < n_lp with lp_d[r] = -inf or fl(W_p + lp_d[r]) < floor_w,
    by binary search (those weights never rise with r)."""
    n_c = uint32(0)
    if top_lp != -math.inf and (d == uint32(1) or uint32(depth[p]) == d - uint32(1)):
        wp = 0.0 if d == uint32(1) else w[p]
        hi = n_lp
        while n_c < hi:
            mid = (n_c + hi) >> uint32(1)
            a = float64(lp_d[mid])
            if a != -math.inf and (wp + a if d > uint32(1) else a) >= floor_w:
                n_c = uint32(mid + uint32(1))
            else:
                hi = mid
    return n_c


@cuda.jit(device=True)
def _chain_slots(d, n_top, n_lp, floor_w, lp_d, w, depth, chain_slot, warp_sums, sim_ibuf):
    """Step 1a: each thread takes a run of parents (the root at d = 1, else G's entries), finds their chains'
    lengths at floor_w, and a block scan turns the lengths into first slots: chain_slot[p] = the first candidate
    slot of p's children. Returns the candidate count (every thread). Ends with a barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    top_lp = float64(lp_d[0])
    n_par = uint32(1) if d == uint32(1) else n_top
    per = uint32((n_par + nt - uint32(1)) // nt)
    p0 = uint32(tid * per)
    p1 = uint32(min(p0 + per, n_par))
    run = int32(0)
    p = p0
    while p < p1:
        n_c = _chain_length(p, d, n_lp, floor_w, top_lp, lp_d, w, depth)
        chain_slot[p] = n_c
        run = int32(run + n_c)
        p = uint32(p + uint32(1))
    first, total = block_prefix_sum(run, warp_sums, sim_ibuf)
    p = p0
    while p < p1:
        n_c = chain_slot[p]
        chain_slot[p] = first
        first = int32(first + n_c)
        p = uint32(p + uint32(1))
    cuda.syncthreads()
    return uint32(total)


@cuda.jit(device=True)
def _count_at_least(t, d, n_top, n_lp, lp_d, w, depth, warp_sums, sim_ibuf):
    """count(t) of the module docstring, to every thread: G's nodes with weight >= t plus the parents' children
    (ranks < n_lp, finite log-probs) with fast-path weight >= t. One barrier (inside the block sum)."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    top_lp = float64(lp_d[0])
    n_par = uint32(1) if d == uint32(1) else n_top
    count = int32(0)
    p = tid
    while p < n_par:
        if d > uint32(1) and w[p] >= t:
            count = int32(count + 1)
        count = int32(count + _chain_length(p, d, n_lp, t, top_lp, lp_d, w, depth))
        p = uint32(p + nt)
    before, total = block_prefix_sum(count, warp_sums, sim_ibuf)
    return uint32(total)


@cuda.jit(device=True)
def _raise_floor(d, n_top, n_lp, B, ref_w, lp_d, w, depth, warp_sums, sim_ibuf):
    """Bisection for a higher witness weight (module docstring, "The floor"): over t_r = fl(ref_w + lp_d[r]),
    r < the finite ranks, the smallest r with count(t_r) >= B, stopping early once count(t_r) <= 2B. Returns
    (t, probes), the same in every thread; t = -inf if no t_r has B witnesses. Ends with a barrier."""
    lo = uint32(0)                           # the finite entries of lp_d[:n_lp] (sorted: a binary search)
    hi = n_lp
    while lo < hi:
        mid = (lo + hi) >> uint32(1)
        if lp_d[mid] != -math.inf:
            lo = uint32(mid + uint32(1))
        else:
            hi = mid
    hi = lo
    lo = uint32(0)
    t_best = -math.inf
    probes = uint32(0)
    while lo < hi:
        mid = (lo + hi) >> uint32(1)
        t = ref_w + float64(lp_d[mid])
        # two scratch rows for the warps' sums, alternating: back-to-back block sums need no barrier between them
        count = _count_at_least(t, d, n_top, n_lp, lp_d, w, depth, warp_sums[probes & uint32(1)], sim_ibuf)
        probes = uint32(probes + uint32(1))
        if count >= B:
            t_best = t
            hi = mid
            if count <= B + B:
                break
        else:
            lo = uint32(mid + uint32(1))
    cuda.syncthreads()
    return t_best, probes


@cuda.jit(device=True)
def _choose_floor(d, n_top, n_lp, B, tau, ref_w, lp_d, w, depth, chain_slot, warp_sums, sim_ibuf):
    """Step 1a with its floor: tau (G's smallest weight once G is full, else -inf) gives the starting floor; if
    the chains then hold more than 2B candidates, _raise_floor finds a higher one and the lengths are redone.
    Returns (floor, candidate count, probes); chain_slot holds each parent's first slot. Ends with a barrier."""
    floor_w = _floor_below(tau)
    probes = uint32(0)
    raised = False
    while True:                              # (a loop, not two calls: one inlined copy of _chain_slots)
        n_cand = _chain_slots(d, n_top, n_lp, floor_w, lp_d, w, depth, chain_slot, warp_sums[0], sim_ibuf)
        if raised or n_cand <= B + B:
            return floor_w, n_cand, probes
        t, probes = _raise_floor(d, n_top, n_lp, B, ref_w, lp_d, w, depth, warp_sums, sim_ibuf)
        floor_w = _floor_below(max(tau, t))
        raised = True


@cuda.jit(device=True)
def _write_children(d, n_top, n_cand, n_pad, cached, lp_d, nodes, chain_slot, new_pos, cand, sort_w, sort_rdepth,
                    slow_state):
    """Step 1b, one thread per candidate slot: its parent (the last whose first slot is <= the slot), rank, weight
    and table entry (n_top + slot), whether its successor's telescoping step is exact (else slow_state[1] = 1),
    and its record parent: in a chain whose weights never rise (every exact chain) no earlier sibling is lighter,
    so it is the nearest lighter node on the parent's generation path (G's links are final). Also the sort's
    slots (index; weight and record depth when cached; -1 pads up to n_pad sort last) and new_pos cleared."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    w, depth, rank, parent, rparent, rdepth = nodes
    n_par = uint32(1) if d == uint32(1) else n_top
    slot = tid
    while slot < n_cand:
        lo = uint32(0)
        hi = n_par
        while hi - lo > uint32(1):
            mid = (lo + hi) >> uint32(1)
            if uint32(chain_slot[mid]) <= slot:
                lo = mid
            else:
                hi = mid
        c = uint32(slot - uint32(chain_slot[lo]))        # the child's rank; its parent is entry lo
        a = float64(lp_d[c])
        wp = 0.0 if d == uint32(1) else w[lo]
        wc = a if d == uint32(1) and c == uint32(0) else wp + a
        if wc - a != wp:
            slow_state[1] = 1                # the next step rounds: this level walks its chains in order
        x = uint32(n_top + slot)
        z = int32(-1) if d == uint32(1) else _record_parent(int32(lo), wc, w, rparent)
        rd = int32(1) if z < 0 else int32(rdepth[z] + 1)
        w[x] = wc
        depth[x] = d
        rank[x] = c
        parent[x] = -1 if d == uint32(1) else int32(lo)
        rparent[x] = z
        rdepth[x] = rd
        new_pos[x] = -1
        cand[slot] = x
        if cached:
            sort_w[slot] = wc
            sort_rdepth[slot] = rd
        slot = uint32(slot + nt)
    i = uint32(n_cand + tid)
    while i < n_pad:
        cand[i] = -1
        if cached:
            sort_w[i] = -math.inf
            sort_rdepth[i] = 0
        i = uint32(i + nt)
    i = tid
    while i < n_top:
        new_pos[i] = -1
        i = uint32(i + nt)


@cuda.jit(device=True)
def _walk_chains(d, n_top, n_lp, floor_w, cap, lp_d, nodes, new_pos, slow_state):
    """The slow path of step 1 (a telescoping step rounded): one thread per parent walks the sibling chain of its
    children in the heap's float64 order, in a range reserved with a shared atomic (slow_state[0]); then the record
    parents of the chains whose weights never rise, one thread per child, and new_pos cleared. Returns (candidate
    count, overflowed), the same in every thread. Ends with a barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    w, depth, rank, parent, rparent, rdepth = nodes
    top_lp = float64(lp_d[0])
    n_par = uint32(1) if d == uint32(1) else n_top
    p = tid
    while p < n_par:
        par = -1 if d == uint32(1) else int32(p)
        wp = 0.0 if d == uint32(1) else w[p]
        if top_lp != -math.inf and (d == uint32(1) or uint32(depth[p]) == d - uint32(1)):
            # the chain's length, in registers; and whether its weights never rise (then no earlier sibling is
            # lighter, and every record parent lies on the parent's generation path: found in parallel below)
            wc = wp + top_lp if d > uint32(1) else top_lp
            n_c = uint32(0)
            rising = False
            while wc >= floor_w:
                n_c = uint32(n_c + uint32(1))
                if n_c >= n_lp:
                    break
                nxt = float64(lp_d[n_c])
                if nxt == -math.inf:
                    break
                w_last = wc
                wc = (wc - float64(lp_d[n_c - uint32(1)])) + nxt
                if wc > w_last:
                    rising = True
            if n_c > uint32(0):
                base = uint32(n_top + uint32(cuda.atomic.add(slow_state, 0, int32(n_c))))
                if base + n_c <= n_top + cap:
                    # write the chain: the same float64 operations in the same order, so the same weights
                    prev = -1                # the previous sibling's entry, weight, record parent and its depth
                    w_prev = 0.0
                    rp_prev = -1
                    rd_prev = 0
                    wc = wp + top_lp if d > uint32(1) else top_lp
                    c = uint32(0)
                    while c < n_c:
                        if c > uint32(0):
                            wc = (wc - float64(lp_d[c - uint32(1)])) + float64(lp_d[c])
                        x = uint32(base + c)
                        w[x] = wc
                        depth[x] = d
                        rank[x] = c
                        parent[x] = par
                        if not rising:
                            rparent[x] = PENDING
                        else:
                            # rising chain: record parents in chain order - the generator (previous sibling, or the
                            # parent for the first child) if it is lighter, else its record ancestors
                            if c == uint32(0):
                                z = _record_parent(par, wc, w, rparent)
                                rd = 1 if z < 0 else rdepth[z] + 1
                            elif w_prev < wc:
                                z = prev
                                rd = rd_prev + 1
                            else:
                                z = _record_parent(rp_prev, wc, w, rparent)
                                rd = 1 if z < 0 else rdepth[z] + 1
                            rparent[x] = z
                            rdepth[x] = rd
                            prev = int32(x)
                            w_prev = wc
                            rp_prev = z
                            rd_prev = rd
                        c = uint32(c + uint32(1))
        p = uint32(p + nt)
    cuda.syncthreads()
    total = uint32(slow_state[0])
    if total > cap:
        return total, True
    end = uint32(n_top + total)
    x = uint32(n_top + tid)
    while x < end:
        if rparent[x] == PENDING:
            z = _record_parent(parent[x], w[x], w, rparent)
            rparent[x] = z
            rdepth[x] = 1 if z < 0 else rdepth[z] + 1
        x = uint32(x + nt)
    x = tid
    while x < end:
        new_pos[x] = -1
        x = uint32(x + nt)
    cuda.syncthreads()
    return total, False


@cuda.jit(device=True)
def _fill_sort_slots(n_top, n_cand, n_pad, cached, nodes, cand, sort_w, sort_rdepth):
    """The sort's slots after _walk_chains (candidates are the entries n_top .. n_top + n_cand - 1; -1 pads).
    Ends with a barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    w, depth, rank, parent, rparent, rdepth = nodes
    i = tid
    while i < n_pad:
        x = int32(n_top + i) if i < n_cand else int32(-1)
        cand[i] = x
        if cached:
            sort_w[i] = w[x] if x >= 0 else -math.inf
            sort_rdepth[i] = rdepth[x] if x >= 0 else 0
        i = uint32(i + nt)
    cuda.syncthreads()


@cuda.jit(device=True)
def _rank_sort(n_cand, cand, sort_w, sort_rdepth, ranked_node, ranked_w, ranked_rdepth, nodes):
    """Step 2 for up to RANK_SORT candidates (cached): candidate i goes to position #{j popping before i}, no
    barriers but the two that hand the result back. Ends with a barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    i = tid
    while i < n_cand:
        xi = cand[i]
        wi = sort_w[i]
        ri = sort_rdepth[i]
        pos = 0
        j = uint32(0)
        while j < n_cand:
            if j != i and _before(cand[j], sort_w[j], sort_rdepth[j], xi, wi, ri, nodes):
                pos += 1
            j = uint32(j + uint32(1))
        ranked_node[pos] = xi
        ranked_w[pos] = wi
        ranked_rdepth[pos] = ri
        i = uint32(i + nt)
    cuda.syncthreads()
    i = tid
    while i < n_cand:
        cand[i] = ranked_node[i]
        sort_w[i] = ranked_w[i]
        sort_rdepth[i] = ranked_rdepth[i]
        i = uint32(i + nt)
    cuda.syncthreads()


@cuda.jit(device=True)
def _bitonic_sort(n_pad, cached, cand, sort_w, sort_rdepth, nodes):
    """Step 2 above RANK_SORT candidates: a bitonic network over n_pad (a power of two) slots in pop order, -1 pads
    last; the keys travel with the indices when cached, else the comparator reads the table. Ends with a barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    size = uint32(2)
    while size <= n_pad:
        stride = size >> uint32(1)
        while stride > uint32(0):
            i = tid
            while i < n_pad:
                j = i ^ stride
                if j > i:
                    a = cand[i]
                    b = cand[j]
                    if a < 0 or b < 0:               # pads last
                        swap = (a < 0 and b >= 0) if (i & size) == 0 else (b < 0 and a >= 0)
                    else:
                        if cached:
                            a_first = _before(a, sort_w[i], sort_rdepth[i], b, sort_w[j], sort_rdepth[j], nodes)
                        else:
                            a_first = _pops_before(a, b, nodes)
                        # ascending half: b first if it pops earlier; descending half: the reverse
                        swap = (not a_first) if (i & size) == 0 else a_first
                    if swap:
                        cand[i] = b
                        cand[j] = a
                        if cached:
                            sort_w[i], sort_w[j] = sort_w[j], sort_w[i]
                            sort_rdepth[i], sort_rdepth[j] = sort_rdepth[j], sort_rdepth[i]
                i = uint32(i + nt)
            cuda.syncthreads()
            stride = stride >> uint32(1)
        size = uint32(size << uint32(1))


@cuda.jit(device=True)
def _merge(n_top, n_cand, B, cached, cand, sort_w, sort_rdepth, nodes, new_pos):
    """Step 3a: co-rank G (entries [0, n_top), in pop order) with the first min(n_cand, B) sorted candidates, each
    by a binary search in the other list; new_pos[x] = x's position in the merged order if it is < B (entries
    already hold -1). Ends with a barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    w, depth, rank, parent, rparent, rdepth = nodes
    n_kept = min(n_cand, B)
    end = uint32(n_top + n_kept)
    i = tid
    while i < end:
        if i < n_top:                        # a G member: how many kept candidates pop before it
            x = int32(i)
            wx = w[i]
            rx = rdepth[i]
            lo = uint32(0)
            hi = n_kept
            while lo < hi:
                mid = (lo + hi) >> uint32(1)
                y = cand[mid]
                if _before(y, sort_w[mid] if cached else w[y], sort_rdepth[mid] if cached else rdepth[y], x, wx, rx,
                           nodes):
                    lo = uint32(mid + uint32(1))
                else:
                    hi = mid
            pos = uint32(i + lo)
        else:                                # the (i - n_top)-th candidate: how many G members pop before it
            k = uint32(i - n_top)
            x = cand[k]
            wx = sort_w[k] if cached else w[x]
            rx = sort_rdepth[k] if cached else rdepth[x]
            lo = uint32(0)
            hi = n_top
            while lo < hi:
                mid = (lo + hi) >> uint32(1)
                if _before(int32(mid), w[mid], rdepth[mid], x, wx, rx, nodes):
                    lo = uint32(mid + uint32(1))
                else:
                    hi = mid
            pos = uint32(k + lo)
        if pos < B:
            new_pos[x] = pos
        i = uint32(i + nt)
    cuda.syncthreads()


@cuda.jit(device=True)
def _rewrite_table(end, new_pos, nodes, new_nodes):
    """Step 3b: entries [0, end) that kept a position move to it in the other copy, their links remapped. Returns
    this thread's smallest moved weight (the caller's block minimum makes it G's smallest, tau). No barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    w, depth, rank, parent, rparent, rdepth = nodes
    w2, depth2, rank2, parent2, rparent2, rdepth2 = new_nodes
    m = math.inf
    x = tid
    while x < end:
        p = new_pos[x]
        if p >= 0:
            wx = w[x]
            w2[p] = wx
            depth2[p] = depth[x]
            rank2[p] = rank[x]
            t = parent[x]
            parent2[p] = new_pos[t] if t >= 0 else -1
            t = rparent[x]
            rparent2[p] = new_pos[t] if t >= 0 else -1
            rdepth2[p] = rdepth[x]
            m = min(m, wx)
        x = uint32(x + nt)
    return m


@cuda.jit(device=True)
def _write_outputs(r, B, n_top, nodes, ids, out_i, out_logw, paths, path_depth, n_out):
    """Node i + 1 = table entry i; fewer than B nodes are padded with children of the root (verified, never
    accepted). paths (flat rows of width L + 1): -1 everywhere by consecutive threads (coalesced), then each
    node's own entries - its ancestors by depth, found by walking up. (A thread per node writing its whole row, at
    a stride of a row, was a third of the kernel's time: ncu.)"""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    w, depth, rank, parent, rparent, rdepth = nodes
    width = uint32(ids.shape[1] + 1)
    n_flat = uint32(paths.shape[1])
    e = tid
    while e < n_flat:
        paths[r, e] = -1
        e = uint32(e + nt)
    cuda.syncthreads()
    out_tokens = out_i[0]
    out_depth = out_i[1]
    out_parent = out_i[2]
    i = tid
    while i < B:
        row = uint32((i + uint32(1)) * width)
        paths[r, row] = 0
        if i < n_top:
            dd = uint32(depth[i])
            out_tokens[r, i] = ids[r, dd - uint32(1), rank[i]]
            out_depth[r, i] = dd
            out_parent[r, i] = parent[i] + 1
            out_logw[r, i] = w[i]
            path_depth[r, i + uint32(1)] = dd
            node = int32(i)
            k = dd
            while k > uint32(0):
                paths[r, row + k] = node + 1
                node = parent[node]
                k = uint32(k - uint32(1))
        else:
            out_tokens[r, i] = 0
            out_depth[r, i] = 1
            out_parent[r, i] = 0
            out_logw[r, i] = -math.inf
            path_depth[r, i + uint32(1)] = 1
            paths[r, row + uint32(1)] = i + uint32(1)
        i = uint32(i + nt)
    if tid == 0:
        n_out[r] = n_top
        path_depth[r, 0] = 0
        paths[r, 0] = 0


@cuda.jit(device=True)
def _pow2_at_least(n):
    """The smallest power of two >= n (1 for n <= 1): the bitonic network's size."""
    n_pad = uint32(1)
    while n_pad < n:
        n_pad = uint32(n_pad << uint32(1))
    return n_pad


@cuda.jit
def _build_kernel(lp, ids, budget, cap, wtab, itab, scratch, out_i, out_logw, paths, path_depth, n_out, stats,
                  mode):
    """Request blockIdx.x's tree: the module docstring's levels, each a sequence of the steps above."""
    r = uint32(cuda.blockIdx.x)
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    n_depths = uint32(ids.shape[1])
    L = n_depths if budget > 0 else uint32(0)
    K = uint32(ids.shape[2])
    B = uint32(budget)
    n_lp = uint32(min(K, B))                 # ranks a chain can reach (a node's r earlier siblings pop first)
    cap32 = uint32(cap)
    slow_state = cuda.shared.array(2, int32)             # slow path: [0] candidate count, [1] an inexact step seen
    warp_sums = cuda.shared.array((2, MAX_WARPS), int32)  # the warps' partials of block sums (two rows: _raise_floor)
    warp_mins = cuda.shared.array(MAX_WARPS, float64)    # ... of block minima
    sim_ibuf = cuda.shared.array(32, int32)              # scratch of the simulator's warp collectives
    sim_fbuf = cuda.shared.array(32, float64)
    lp_rows = cuda.shared.array((2, MAX_BUDGET), float32)  # depth d's log-probs lp[r, d - 1, :n_lp] in row d & 1
    sort_w = cuda.shared.array(SORT_CACHE, float64)      # per sort slot: weight, record depth, table entry
    sort_rdepth = cuda.shared.array(SORT_CACHE, int32)
    sort_node = cuda.shared.array(SORT_CACHE, int32)
    chain_slot = cuda.shared.array(MAX_BUDGET, int32)    # per parent: its chain's length, then its first slot
    ranked_node = cuda.shared.array(RANK_SORT, int32)    # rank sort output: entry, weight, record depth
    ranked_w = cuda.shared.array(RANK_SORT, float64)
    ranked_rdepth = cuda.shared.array(RANK_SORT, int32)

    nodes = _node_table(wtab, itab, 0, r)    # this level's table; the merge writes the next into the other copy
    new_nodes = _node_table(wtab, itab, 1, r)
    new_pos = scratch[0, r]                  # table entry -> its position in the merged pop order (or -1)
    sort_global = scratch[1, r]              # the sort's slots when they exceed SORT_CACHE
    lp_req = lp[r]                           # [L * K] float32; depth d's row starts at (d - 1) K
    e = tid
    while e < uint32(stats.shape[1]):        # overflow flag, candidates and probes per depth
        stats[r, e] = 0
        e = uint32(e + nt)
    _load_row(lp_rows[1], lp_req, uint32(0), n_lp)
    cuda.syncthreads()
    # the chain's and the heap's node table (up to RANK_SORT nodes): shared arrays the level loop's sort would use
    # (module docstring, "The node table")
    small = (ranked_w, ranked_rdepth, ranked_node, chain_slot[:RANK_SORT], chain_slot[RANK_SORT:2 * RANK_SORT],
             chain_slot[2 * RANK_SORT:3 * RANK_SORT])
    if K == uint32(1):                       # a chain: no search (module docstring)
        if min(B, L) <= uint32(RANK_SORT):
            n_top = _chain_nodes(lp_req, L, B, small, stats, r, slow_state)
            _write_outputs(r, B, n_top, small, ids, out_i, out_logw, paths, path_depth, n_out)
        else:
            n_top = _chain_nodes(lp_req, L, B, nodes, stats, r, slow_state)
            _write_outputs(r, B, n_top, nodes, ids, out_i, out_logw, paths, path_depth, n_out)
        return
    if _heap_fits(L, K, B) and (mode & HEAP or (mode == 0 and _heap_pays(lp_req, L, K, B, sort_w))):
        n_top = _heap_lanes(lp_req, sort_w, L, K, B, small, sim_fbuf, sim_ibuf, slow_state)    # the heap itself
        _write_outputs(r, B, n_top, small, ids, out_i, out_logw, paths, path_depth, n_out)
        return
    n_top = uint32(0)                        # |G| (every thread keeps it)
    tau = -math.inf                          # the smallest weight in G
    ref_w = 0.0                              # the first depth-(d-1) node's weight (the root's at d = 1)
    d = uint32(1)
    while d <= L:
        if tid == 0:
            slow_state[0] = 0
            slow_state[1] = 0
        lp_d = lp_rows[d & uint32(1)]        # this depth's log-probs, sorted descending
        has_next = d < L
        next_lp = lp_req[uint32(d * K + tid) if has_next and tid < n_lp else uint32(0)]   # next row, entry tid

        # 1. expand: the floor and the chains' lengths (fast path), the children written, or the chains walked
        floor_w, n_cand, probes = _choose_floor(d, n_top, n_lp, B, tau if n_top == B else -math.inf, ref_w, lp_d,
                                                nodes[0], nodes[1], chain_slot, warp_sums, sim_ibuf)
        overflow = n_cand > cap32
        n_pad = _pow2_at_least(n_cand)
        cached = n_pad <= uint32(SORT_CACHE)
        cand = sort_node if cached else sort_global    # candidate entries in sort order
        if not overflow:
            _write_children(d, n_top, n_cand, n_pad, cached, lp_d, nodes, chain_slot, new_pos, cand, sort_w,
                            sort_rdepth, slow_state)
        cuda.syncthreads()
        slow = (slow_state[1] != 0 or (mode & SLOW_CHAINS) != 0) and not overflow
        if slow:
            n_cand, overflow = _walk_chains(d, n_top, n_lp, floor_w, cap32, lp_d, nodes, new_pos, slow_state)
            n_pad = _pow2_at_least(n_cand)
            cached = n_pad <= uint32(SORT_CACHE)
            cand = sort_node if cached else sort_global
            if not overflow:
                _fill_sort_slots(n_top, n_cand, n_pad, cached, nodes, cand, sort_w, sort_rdepth)
        if tid == 0:
            stats[r, d] = n_cand
            stats[r, n_depths + d] = probes
        if overflow:
            if tid == 0:
                stats[r, 0] = 1
            break
        if n_cand == uint32(0):
            break

        # 2. sort the candidates by pop order (d = 1 on the fast path: one exact chain, already in order)
        if d == uint32(1) and not slow and (mode & (SLOW_CHAINS | BITONIC)) == 0:
            pass
        elif n_cand <= uint32(RANK_SORT) and not mode & BITONIC:
            _rank_sort(n_cand, cand, sort_w, sort_rdepth, ranked_node, ranked_w, ranked_rdepth, nodes)
        else:
            _bitonic_sort(n_pad, cached, cand, sort_w, sort_rdepth, nodes)
        ref_w = nodes[0][cand[0]]            # the first of them in pop order: the next level's reference weight

        # 3. merge into G, keep the first B, rewrite the table in the new pop order; tau = G's smallest weight
        _merge(n_top, n_cand, B, cached, cand, sort_w, sort_rdepth, nodes, new_pos)
        end = uint32(n_top + n_cand)
        m = _rewrite_table(end, new_pos, nodes, new_nodes)
        if has_next:                         # the next depth's row into the other buffer (before the barrier)
            _store_prefetched_row(lp_rows[(d + uint32(1)) & uint32(1)], lp_req, uint32(d * K), n_lp, next_lp)
        tau = block_min(m, warp_mins, nt >> uint32(5), sim_fbuf)
        nodes, new_nodes = new_nodes, nodes
        n_top = min(B, end)
        d = uint32(d + uint32(1))

    _write_outputs(r, B, n_top, nodes, ids, out_i, out_logw, paths, path_depth, n_out)


# ------------------------------------------------------------------------------------------------ launcher
@dataclasses.dataclass
class DeviceTrees:
    """Trees of R requests on the backend (what the decode loop keeps on the device).
    Node i of request r (1..n[r]) is at index i-1 of tokens/depth/parent/logw; paths/path_depth include the
    root at index 0."""
    tokens: object       # [R, B] int32
    depth: object        # [R, B] int32
    parent: object       # [R, B] int32  (parent node index, 0 = root)
    logw: object         # [R, B] float64
    paths: object        # [R, B+1, L+1] int32
    path_depth: object   # [R, B+1] int32
    n: object            # [R] int32

    def to_trees(self) -> list[Tree]:
        h = backend.to_host
        tokens, depth, parent, logw, n = h(self.tokens), h(self.depth), h(self.parent), h(self.logw), h(self.n)
        return [Tree(tokens[r, :n[r]].copy(), depth[r, :n[r]].copy(),
                     np.concatenate([[-1], parent[r, :n[r]]]).astype(np.int32), logw[r, :n[r]].copy())
                for r in range(n.shape[0])]


class TreeBuilder:
    """Preallocated scratch for building trees of R requests, L depths, K candidates, budget B (reused every
    round by the decode loop: no allocation on the hot path). ``mode`` (tests): SLOW_CHAINS walks every chain in
    order, BITONIC always sorts with the bitonic network - the paths the fast ones fall back to; LEVELS runs the
    level loop where ``heap_path`` would run the heap itself (any mode without HEAP does); HEAP runs the heap
    wherever it fits (``heap_fits``). ``capacity``:
    candidates one level may hold (default the worst case, B x min(K, B)); a level needing more sets ``overflow``.
    After a kernel build (sim / cuda backends; the numpy backend runs the reference and leaves them 0):
    ``overflow [R]``, ``candidates [R, L]`` (column d - 1: the candidates depth d's chains held, what the sort
    ordered) and ``probes [R, L]`` (the bisection probes spent raising depth d's floor) - views of one int32 array
    the kernel writes; ``level_counts_ref`` computes the same on the host. The heap path (``heap_path``) has no
    levels: it leaves them 0."""

    def __init__(self, R: int, L: int, K: int, budget: int, capacity: int | None = None, mode: int = 0):
        self.R, self.L, self.K, self.B = R, L, K, budget
        self.mode = _checks.integer(mode, "mode", lo=0, hi=SLOW_CHAINS | BITONIC | LEVELS | HEAP)
        worst = budget * min(K, budget)
        self.cap = worst if capacity is None else max(1, min(capacity, worst))
        tab = budget + self.cap                                  # the popped nodes, one level's candidates
        sort_cap = 1
        while sort_cap < self.cap:
            sort_cap *= 2
        e = backend.empty
        # few, packed arrays: every array argument costs host time at each launch
        self.wtab = e((2, R, tab), np.float64)                 # [copy, request, entry]
        self.itab = e((2, N_FIELDS, R, tab), np.int32)         # [copy, field (DEPTH ..), request, entry]
        self.scratch = e((2, R, max(tab, sort_cap)), np.int32)  # node map, sort buffer
        B1 = max(budget, 1)
        self._rows = e((3, R, B1 + 1), np.int32)               # tokens, depth, parent: slot 0 the caller's, B1 nodes
        self.out_i = self._rows[:, :, 1:]                      # what the kernel writes [3, R, B1] (a view)
        self.out = DeviceTrees(self.out_i[0], self.out_i[1], self.out_i[2], e((R, B1), np.float64),
                               e((R, B1 + 1, L + 1), np.int32), e((R, B1 + 1), np.int32), e((R,), np.int32))
        self.stats = backend.zeros((R, 1 + 2 * L), np.int32)       # overflow, candidates per depth, probes per depth
        self.overflow = self.stats[:, 0]
        self.candidates = self.stats[:, 1:L + 1]
        self.probes = self.stats[:, L + 1:]
        self._paths_flat = self.out.paths.reshape(R, -1)       # the kernel writes paths as flat rows (a view)

    def verify_ids(self, r: int = 0):
        """Request r's ``[slot 0, the B nodes' tokens]`` [B + 1] int32 (a view): slot 0 is free for the caller - the
        decode loop keeps the root there, so the verify's ids ``[root, tree tokens]`` are this row, copied from
        nowhere. Example: budget 3, root 7 written to slot 0, a build of tokens [4, 9, 2] -> [7, 4, 9, 2]."""
        return self._rows[0, r, :self.B + 1]

    def build(self, lp, ids) -> DeviceTrees:
        """Launch the build for ``lp, ids [R, L, K]`` (no host sync); ``self.overflow`` flags a too-small capacity."""
        o = self.out
        if backend.name == "numpy":
            host_ids = np.asarray(ids)
            for r in range(self.R):
                self._pack(r, build_tree_ref(np.asarray(lp[r]), host_ids[r], self.B))
            return o
        threads = backend.block_size(MAX_THREADS, 32)    # the simulator's warp collectives need one warp
        R, L, K = self.R, self.L, self.K
        backend.launch(_build_kernel, R, threads, lp.reshape(R, L * K), ids, self.B, self.cap, self.wtab, self.itab,
                       self.scratch, self.out_i, o.logw, self._paths_flat, o.path_depth, o.n, self.stats, self.mode)
        return o

    def _pack(self, r: int, tree: Tree) -> None:
        """Write a host Tree into request r's output rows, padded like the kernel's (numpy backend)."""
        o, n, B = self.out, tree.n, self.B
        o.n[r] = n
        o.tokens[r, :n], o.depth[r, :n], o.parent[r, :n], o.logw[r, :n] = (tree.tokens, tree.depths,
                                                                             tree.parents[1:], tree.logw)
        o.tokens[r, n:B], o.depth[r, n:B], o.parent[r, n:B], o.logw[r, n:B] = 0, 1, 0, -np.inf
        paths, depth = tree.paths(self.L)
        o.paths[r, :n + 1], o.path_depth[r, :n + 1] = paths, depth
        o.paths[r, n + 1:B + 1] = -1
        o.paths[r, n + 1:B + 1, 0] = 0
        o.paths[r, n + 1:B + 1, 1] = np.arange(n + 1, B + 1)
        o.path_depth[r, n + 1:B + 1] = 1


def build_trees(top_logprobs, top_ids, budget: int) -> list[Tree]:
    """Best-first trees of R requests: ``top_logprobs [R, L, K]`` float32 (rows sorted descending),
    ``top_ids [R, L, K]`` int. Returns R host Trees (the heap reference on the numpy backend)."""
    lp = _checks.array(top_logprobs, "top_logprobs", dtype=np.float32, ndim=3)
    R, L, K = lp.shape
    ids = _checks.array(top_ids, "top_ids", kinds="iu", shape=(R, L, K))
    budget = _checks.integer(budget, "budget", lo=0, hi=MAX_BUDGET)
    host_lp = backend.to_host(lp)
    if np.isnan(host_lp).any():
        raise ValueError("top_logprobs: contains NaN")
    if (host_lp == np.inf).any():
        raise ValueError("top_logprobs: contains +inf (expected log-probabilities)")
    if (host_lp > 0).any():          # a child heavier than its parent: the best-first order would not hold
        r, d, k = np.argwhere(host_lp > 0)[0]
        raise ValueError(f"top_logprobs: {float(host_lp[r, d, k])!r} at (request {r}, depth {d + 1}, rank {k}) is "
                         f"not a log-probability (expected values <= 0)")
    rising = host_lp[..., 1:] > host_lp[..., :-1]
    if rising.any():
        r, d, k = np.argwhere(rising)[0]
        raise ValueError(f"top_logprobs: row (request {r}, depth {d + 1}) is not sorted in descending order at "
                         f"rank {k + 1}")
    if budget == 0 or R == 0 or L == 0 or K == 0:
        return [_empty_tree() for _ in range(R)]
    if backend.name == "numpy":
        host_ids = backend.to_host(ids)
        return [build_tree_ref(host_lp[r], host_ids[r], budget) for r in range(R)]
    ids32 = ids if ids.dtype == np.int32 else backend.asarray(backend.to_host(ids).astype(np.int32))
    small = R * budget * min(K, budget) <= (1 << 22)
    builder = TreeBuilder(R, L, K, budget, None if small else max(16 * budget, 4096))
    out = builder.build(lp, ids32)
    if not small and backend.to_host(builder.overflow).any():
        builder = TreeBuilder(R, L, K, budget)
        out = builder.build(lp, ids32)
    return out.to_trees()


def build_tree(top_logprobs, top_ids, budget: int) -> Tree:
    """The best-first tree of one request: ``top_logprobs [L, K]`` float32 sorted descending per row,
    ``top_ids [L, K]`` int, ``budget`` nodes at most (0..1024). Same result on every backend."""
    lp = _checks.array(top_logprobs, "top_logprobs", dtype=np.float32, ndim=2)
    ids = _checks.array(top_ids, "top_ids", kinds="iu", shape=lp.shape)
    return build_trees(lp[None], ids[None], budget)[0]
