"""DDTree's best-first draft tree, built on the GPU - the same tree the heap algorithm builds, bit for bit.

**The heap algorithm (the reference, ``build_tree_ref``).** Per-depth candidates come sorted: ``lp[d][r]`` is the
log-prob of the r-th best token at depth d (d = 1..L, r < K). A node is a rank tuple (r_1, .., r_d), weight
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
below walks record parents (usually zero steps) and, for equal weights, trie parents to compare rank tuples.

**The parallel formulation (``_build_kernel``, one block per request).** Level by level, d = 1..L:
  1. expand: every node of depth d-1 in the current top list G (the root for d = 1) is a parent; its children's
     sibling chain r = 0, 1, .. carries the heap's telescoped float64 weights
     (w_0 = W_p + lp[d][0], w_{r+1} = (w_r - lp[d][r]) + lp[d][r+1]). A chain stops at rank B (r earlier
     siblings pop first), at a -inf log-prob, or - once G holds B nodes - when its weight falls below
     tau - margin, tau = the smallest weight in G: any B nodes bound the final B-th weight from below, and no node
     lighter than that by more than the accumulated rounding (margin = 2^-30 |tau|) can pop within the first B.
     Fast path: while every step is exact ((w_r - lp[r]) == W_p, the rule for sums of float32 log-probs),
     w_r = W_p + lp[d][r]: non-increasing, each computable alone. So one thread per parent finds its chain's
     length by binary search, a block scan (warp shuffles, one barrier) turns lengths into table slots, and one
     thread per child writes its entry, checks the exactness its successor relies on, and finds its record
     parent: in a chain whose weights never rise (every exact chain) no earlier sibling is lighter, so it is the
     nearest lighter node on the parent's generation path. If any step is inexact, the level is redone with one
     thread per parent walking its chain in order (``_walk_chains``; test:
     test_inexact_telescoping_walks_chains_in_order); a rising chain (only possible there) gets its record
     parents in chain order by previous-greater jumps.
  2. order the candidates with the comparator: a rank sort (each candidate counts those popping before it, no
     barriers) up to RANK_SORT candidates, a bitonic sort above, in shared memory with the weights and record
     depths beside the indices, so the comparator only reads the table for equal weights or record-tree nodes.
     At d = 1 the fast path needs no sort: one exact chain from the root is already in pop order,
  3. merge them into G (co-ranking by binary search), keep the first B, and rewrite the node table in the new
     pop order (table index == pop position) with remapped parent / record-parent links; tau by a block minimum.
After depth L (or when a depth adds no node) G is the tree in pop order. The per-depth top-B is exact for *any*
total order consistent with the heap (a node's first B at depth d are among the first B of all nodes at depth
d, and its parent pops before it), which is why the level-by-level split loses nothing.
Cost (B = 256, 16 requests, H200, ncu): a block spends its time waiting on instruction fetch, barriers and
round trips, not on arithmetic, so the kernel is written for few instructions and few barriers - unsigned
32-bit while loops (numba's range() computes a 64-bit trip count by division; signed indices add wraparound
code), warp-shuffle scans and minima, the next depth's log-probs loaded while a level runs, and coalesced
output stores: 33 -> 19 us. (Earlier: with one atomic per child and every chain walked in order from global
memory, the root's 256-child chain alone took 54-107 of 140 us, and the bitonic sort ~0.65 us per stage.)

Worked example (L = 2, K = 2, budget 3): lp = [[-0.1, -2.5], [-0.2, -1.8]].
  d = 1: chain of the root: (0) w = -0.1, (1) w = -2.5           -> G = [(0), (1)]
  d = 2: parents (0): (0,0) -0.3, (0,1) -1.9;  (1): (1,0) -2.7 ... G full? no (2 < 3): all kept as candidates;
         sorted: (0,0) -0.3, (0,1) -1.9, (1,0) -2.7; merge with G -> [(0) -0.1, (0,0) -0.3, (0,1) -1.9]
  tree: node 1 = (0) depth 1 parent 0; node 2 = (0,0) depth 2 parent 1; node 3 = (0,1) depth 2 parent 1.
The heap pops (0), (0,0), (0,1) - the same.

Also produced for verify: each node's root-to-node path ``paths [n+1, L+1]`` (node indices by depth, -1 padded)
and ``path_depth [n+1]`` (0 for the root): the compact ancestor representation tree_verify reads. The kernel
fills paths with -1 by consecutive threads, then writes each node's entries by walking up its parents.
Shapes: lp [R, L, K] float32 (rows sorted desc), ids [R, L, K] int32 -> per request a ``Tree`` (kernels/tree.py) of
up to B nodes.
"""
from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np
from numba import cuda, float32, float64, int32, uint32

from .. import backend
from . import _checks
from ._intrinsics import block_min, block_prefix_sum
from .tree import Tree

MAX_BUDGET = 1024
MARGIN = 2.0 ** -30
MAX_THREADS = 256         # the build kernel's block size (at most; whole warps)
MAX_WARPS = MAX_THREADS // 32
PENDING = -2              # record parent not yet computed (filled in parallel)
SORT_CACHE = 2048         # candidates sorted with their keys in shared memory (16 KB + 8 KB)
RANK_SORT = 64            # up to this many candidates: rank sort; above: bitonic (measured: 128 made no
                          # difference at B = 64 and 256, R = 16 after the 32-bit rewrite)
SLOW_CHAINS, BITONIC = 1, 2   # TreeBuilder modes (tests): walk every chain in order / always sort by bitonic


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


# ------------------------------------------------------------------------------------------------ comparator
@cuda.jit(device=True)
def _tuple_less(x, y, depth, tpar, rank):
    """Rank tuple of node x < that of node y (lexicographic; a prefix sorts first)."""
    xa = x
    ya = y
    while depth[xa] > depth[ya]:
        xa = tpar[xa]
    while depth[ya] > depth[xa]:
        ya = tpar[ya]
    if xa == ya:
        return depth[x] < depth[y]
    while tpar[xa] != tpar[ya]:
        xa = tpar[xa]
        ya = tpar[ya]
    return rank[xa] < rank[ya]


@cuda.jit(device=True)
def _key_less(x, y, w, depth, tpar, rank):
    """Heap key of x < key of y: heavier first, equal weights by rank tuple."""
    if w[x] != w[y]:
        return w[x] > w[y]
    return _tuple_less(x, y, depth, tpar, rank)


@cuda.jit(device=True)
def _pops_before(a, b, w, depth, tpar, rank, rpar, rdep):
    """Heap pop order: preorder of the record tree (record ancestors first, siblings by key)."""
    if rdep[a] == 1 and rdep[b] == 1:
        return _key_less(a, b, w, depth, tpar, rank)
    x = a
    y = b
    while rdep[x] > rdep[y]:
        x = rpar[x]
    if x == b:
        return False
    while rdep[y] > rdep[x]:
        y = rpar[y]
    if y == a:
        return True
    while rpar[x] != rpar[y]:
        x = rpar[x]
        y = rpar[y]
    return _key_less(x, y, w, depth, tpar, rank)


@cuda.jit(device=True)
def _record_parent(gen, wx, w, rpar):
    """Nearest generation ancestor (starting at the generator) with a strictly smaller weight, i.e. a larger key
    (ancestors always have smaller rank tuples, so equal weights never make them larger)."""
    z = gen
    while z >= 0 and not (w[z] < wx):
        z = rpar[z]
    return z


# ------------------------------------------------------------------------------------------------ kernel
@cuda.jit(device=True)
def _before(a, wa, ra, b, wb, rb, w, depth, tpar, rank, rpar, rdep):
    """Node a pops before node b; (wa, ra), (wb, rb): their weights and record depths, already at hand. Two nodes
    without record parents and with different weights (the common case) compare without touching the table."""
    if ra == 1 and rb == 1 and wa != wb:
        return wa > wb
    return _pops_before(a, b, w, depth, tpar, rank, rpar, rdep)


@cuda.jit
def _build_kernel(lp, ids, budget, cap, wtab, itab, scratch, out_i, out_logw, paths, path_depth, n_out, overflow,
                  mode):
    # Every per-thread loop is an unsigned 32-bit while loop: numba's range() computes a 64-bit trip count (a
    # division) and signed indices add wraparound code; ncu showed this kernel bound by instruction fetch and
    # count (stall_no_inst 34 % of samples, ~4000 instructions per warp for a two-level tree), not by its work.
    r = uint32(cuda.blockIdx.x)
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    L = uint32(ids.shape[1]) if budget > 0 else uint32(0)
    K = uint32(ids.shape[2])
    B = uint32(budget)
    n_lp = uint32(min(K, B))                 # ranks a chain can reach (a node's r earlier siblings pop first)
    cap32 = uint32(cap)
    sh = cuda.shared.array(2, int32)                     # slow path: 0 candidate count, 1 an inexact chain was seen
    wpart = cuda.shared.array(MAX_WARPS, int32)          # the warps' partials of the block collectives
    wmin = cuda.shared.array(MAX_WARPS, float64)
    ibuf = cuda.shared.array(32, int32)                  # scratch of the simulator's warp collectives
    fbuf = cuda.shared.array(32, float64)
    lps2 = cuda.shared.array((2, MAX_BUDGET), float32)   # depth d's log-probs lp[r, d - 1, :n_lp] in row d & 1
    sw = cuda.shared.array(SORT_CACHE, float64)          # weight / record depth of each sort slot
    srd = cuda.shared.array(SORT_CACHE, int32)
    sord = cuda.shared.array(SORT_CACHE, int32)          # candidate order while sorting (cached sorts)
    clen = cuda.shared.array(MAX_BUDGET, int32)          # per parent: chain length, then its first slot
    rk_x = cuda.shared.array(RANK_SORT, int32)           # rank sort output: index, weight, record depth
    rk_w = cuda.shared.array(RANK_SORT, float64)
    rk_d = cuda.shared.array(RANK_SORT, int32)

    # the table of request r (two copies, swapped every depth): entries [0, |G|) are G in pop order, candidates
    # are appended after them. Fields: weight (float64); depth, rank, trie parent, record parent, record depth.
    w = wtab[0, r]
    dep = itab[0, 0, r]
    rank = itab[0, 1, r]
    tpar = itab[0, 2, r]
    rpar = itab[0, 3, r]
    rdep = itab[0, 4, r]
    w2 = wtab[1, r]
    dep2 = itab[1, 0, r]
    rank2 = itab[1, 1, r]
    tpar2 = itab[1, 2, r]
    rpar2 = itab[1, 3, r]
    rdep2 = itab[1, 4, r]
    nmap = scratch[0, r]        # old table index -> new pop position (or -1)
    order = scratch[1, r]       # candidate indices being sorted (sorts above SORT_CACHE)
    if tid == 0:
        overflow[r] = 0
    # the log-probs, read serially by the chain searches, sit in shared memory: depth 1's row now, each next row
    # loaded while a level runs (its first nt entries held in a register) and stored at the level's end. Loading
    # each row when its level started cost a round trip to L2 per level (ncu).
    lrow = lp[r]                             # [L * K] float32; depth d's row starts at (d - 1) K
    c = tid
    while c < n_lp:
        lps2[1, c] = lrow[c]
        c = uint32(c + nt)
    cuda.syncthreads()
    gn = uint32(0)              # |G| (every thread keeps it)
    tau = -math.inf             # the smallest weight in G
    d = uint32(1)
    while d <= L:
        if tid == 0:
            sh[0] = 0
            sh[1] = 0
        floor_w = tau - MARGIN * max(1.0, abs(tau)) if gn == B else -math.inf
        lps = lps2[d & uint32(1)]               # this depth's log-probs, sorted descending
        top_lp = float64(lps[0])
        more = d < L
        pf = lrow[uint32(d * K + tid) if more and tid < n_lp else uint32(0)]     # the next row's entry tid
        # 1. expand. Fast path: while every telescoping step is exact, (w_c - lp[c]) + lp[c+1] == W_p + lp[c+1],
        # so a chain's weights are w_c = W_p + lp[c] - non-increasing, each computable on its own.
        # 1a. each thread takes a run of parents: chain lengths by binary search (first c with lp = -inf or
        # w_c < floor), then a block scan turns them into first slots
        n_par = uint32(1) if d == uint32(1) else gn
        per = uint32((n_par + nt - uint32(1)) // nt)
        p0 = uint32(tid * per)
        p1 = uint32(min(p0 + per, n_par))
        run = int32(0)
        pi = p0
        while pi < p1:
            n_c = uint32(0)
            if top_lp != -math.inf and (d == uint32(1) or uint32(dep[pi]) == d - uint32(1)):
                wp = 0.0 if d == uint32(1) else w[pi]
                hi = n_lp
                while n_c < hi:
                    mid = (n_c + hi) >> uint32(1)
                    a = float64(lps[mid])
                    if a != -math.inf and (wp + a if d > uint32(1) else a) >= floor_w:
                        n_c = uint32(mid + uint32(1))
                    else:
                        hi = mid
            clen[pi] = n_c
            run = int32(run + n_c)
            pi = uint32(pi + uint32(1))
        first, total = block_prefix_sum(run, wpart, ibuf)
        pi = p0
        while pi < p1:
            n_c = clen[pi]
            clen[pi] = first
            first = int32(first + n_c)
            pi = uint32(pi + uint32(1))
        cn = uint32(total)
        cuda.syncthreads()
        ovf = cn > cap32
        n_pad = uint32(1)
        while n_pad < cn:
            n_pad = uint32(n_pad << uint32(1))
        cached = n_pad <= uint32(SORT_CACHE)
        ob = sord if cached else order         # candidate table indices, sorted in place (-1 pads sort last)
        # 1b. one thread per child: its parent (the last with first slot <= s), rank, weight, exactness, and its
        # record parent: in a chain whose weights never rise (every exact chain) no earlier sibling is lighter, so
        # it is the nearest lighter node on the parent's generation path (G's links are final). Also the sort's
        # keys beside the indices, and the node map cleared.
        if not ovf:
            slot = tid
            while slot < cn:
                lo = uint32(0)
                hi = n_par
                while hi - lo > uint32(1):
                    mid = (lo + hi) >> uint32(1)
                    if uint32(clen[mid]) <= slot:
                        lo = mid
                    else:
                        hi = mid
                c = uint32(slot - uint32(clen[lo]))
                a = float64(lps[c])
                wp = 0.0 if d == uint32(1) else w[lo]
                wc = a if d == uint32(1) and c == uint32(0) else wp + a
                if wc - a != wp:
                    sh[1] = 1                # the next step rounds: this level walks its chains in order
                x = uint32(gn + slot)
                z = int32(-1) if d == uint32(1) else _record_parent(int32(lo), wc, w, rpar)
                rd = int32(1) if z < 0 else int32(rdep[z] + 1)
                w[x] = wc
                dep[x] = d
                rank[x] = c
                tpar[x] = -1 if d == uint32(1) else int32(lo)
                rpar[x] = z
                rdep[x] = rd
                nmap[x] = -1
                ob[slot] = x
                if cached:
                    sw[slot] = wc
                    srd[slot] = rd
                slot = uint32(slot + nt)
            i = uint32(cn + tid)
            while i < n_pad:
                ob[i] = -1
                if cached:
                    sw[i] = -math.inf
                    srd[i] = 0
                i = uint32(i + nt)
            i = tid
            while i < gn:
                nmap[i] = -1
                i = uint32(i + nt)
        cuda.syncthreads()
        slow = (sh[1] != 0 or (mode & SLOW_CHAINS) != 0) and not ovf
        if slow:
            cn, ovf = _walk_chains(d, gn, n_lp, floor_w, cap32, lps, w, dep, rank, tpar, rpar, rdep, nmap, sh)
            n_pad = uint32(1)
            while n_pad < cn:
                n_pad = uint32(n_pad << uint32(1))
            cached = n_pad <= uint32(SORT_CACHE)
            ob = sord if cached else order
            i = tid
            while i < n_pad:
                x = int32(gn + i) if i < cn else int32(-1)
                ob[i] = x
                if cached:
                    sw[i] = w[x] if x >= 0 else -math.inf
                    srd[i] = rdep[x] if x >= 0 else 0
                i = uint32(i + nt)
            cuda.syncthreads()
        if ovf:
            if tid == 0:
                overflow[r] = 1
            break
        if cn == uint32(0):
            break

        # 2. sort the candidates by pop order; up to SORT_CACHE of them with their weights and record depths beside
        # them in shared memory (the comparator only reads the table for equal weights or record-tree nodes).
        # d = 1 on the fast path: one exact chain from the root is already in pop order (weights non-increasing,
        # equal weights by rank, no record parents). Up to RANK_SORT candidates: rank sort - candidate i goes to
        # position #{j popping before i}, no barriers. Above: a bitonic network (-1 pads sort last).
        if d == uint32(1) and not slow and (mode & (SLOW_CHAINS | BITONIC)) == 0:
            pass
        elif cn <= uint32(RANK_SORT) and not mode & BITONIC:
            i = tid
            while i < cn:
                xi = ob[i]
                wi = sw[i]
                ri = srd[i]
                pos = 0
                j = uint32(0)
                while j < cn:
                    if j != i and _before(ob[j], sw[j], srd[j], xi, wi, ri, w, dep, tpar, rank, rpar, rdep):
                        pos += 1
                    j = uint32(j + uint32(1))
                rk_x[pos] = xi
                rk_w[pos] = wi
                rk_d[pos] = ri
                i = uint32(i + nt)
            cuda.syncthreads()
            i = tid
            while i < cn:
                ob[i] = rk_x[i]
                sw[i] = rk_w[i]
                srd[i] = rk_d[i]
                i = uint32(i + nt)
            cuda.syncthreads()
        else:
            size = uint32(2)
            while size <= n_pad:
                stride = size >> uint32(1)
                while stride > uint32(0):
                    i = tid
                    while i < n_pad:
                        j = i ^ stride
                        if j > i:
                            a = ob[i]
                            b = ob[j]
                            if a < 0 or b < 0:               # pads last
                                swap = (a < 0 and b >= 0) if (i & size) == 0 else (b < 0 and a >= 0)
                            else:
                                if cached:
                                    a_first = _before(a, sw[i], srd[i], b, sw[j], srd[j], w, dep, tpar, rank, rpar,
                                                      rdep)
                                else:
                                    a_first = _pops_before(a, b, w, dep, tpar, rank, rpar, rdep)
                                # ascending half: b first if it pops earlier; descending half: the reverse
                                swap = (not a_first) if (i & size) == 0 else a_first
                            if swap:
                                ob[i] = b
                                ob[j] = a
                                if cached:
                                    sw[i], sw[j] = sw[j], sw[i]
                                    srd[i], srd[j] = srd[j], srd[i]
                        i = uint32(i + nt)
                    cuda.syncthreads()
                    stride = stride >> uint32(1)
                size = uint32(size << uint32(1))

        # 3. merge with G by co-ranking (a binary search in the other list); keep the first B
        ck = min(cn, B)
        end = uint32(gn + ck)
        i = tid
        while i < end:
            if i < gn:                       # a G member: how many kept candidates pop before it
                x = int32(i)
                wx = w[i]
                rx = rdep[i]
                lo = uint32(0)
                hi = ck
                while lo < hi:
                    mid = (lo + hi) >> uint32(1)
                    y = ob[mid]
                    if _before(y, sw[mid] if cached else w[y], srd[mid] if cached else rdep[y], x, wx, rx,
                               w, dep, tpar, rank, rpar, rdep):
                        lo = uint32(mid + uint32(1))
                    else:
                        hi = mid
                pos = uint32(i + lo)
            else:                            # the (i-gn)-th candidate: how many G members pop before it
                k = uint32(i - gn)
                x = ob[k]
                wx = sw[k] if cached else w[x]
                rx = srd[k] if cached else rdep[x]
                lo = uint32(0)
                hi = gn
                while lo < hi:
                    mid = (lo + hi) >> uint32(1)
                    if _before(int32(mid), w[mid], rdep[mid], x, wx, rx, w, dep, tpar, rank, rpar, rdep):
                        lo = uint32(mid + uint32(1))
                    else:
                        hi = mid
                pos = uint32(k + lo)
            if pos < B:
                nmap[x] = pos
            i = uint32(i + nt)
        cuda.syncthreads()
        # rewrite the table in the new pop order, and tau = the smallest weight in G (a lower bound of the final
        # B-th weight, used once G is full)
        end = uint32(gn + cn)
        m = math.inf
        x = tid
        while x < end:
            p = nmap[x]
            if p >= 0:
                wx = w[x]
                w2[p] = wx
                dep2[p] = dep[x]
                rank2[p] = rank[x]
                t = tpar[x]
                tpar2[p] = nmap[t] if t >= 0 else -1
                t = rpar[x]
                rpar2[p] = nmap[t] if t >= 0 else -1
                rdep2[p] = rdep[x]
                m = min(m, wx)
            x = uint32(x + nt)
        if more:                             # the next depth's row into the other buffer (before the barrier)
            nxt = lps2[(d + uint32(1)) & uint32(1)]
            if tid < n_lp:
                nxt[tid] = pf
            c = uint32(tid + nt)
            while c < n_lp:
                nxt[c] = lrow[d * K + c]
                c = uint32(c + nt)
        tau = block_min(m, wmin, nt >> uint32(5), fbuf)
        w, w2 = w2, w
        dep, dep2 = dep2, dep
        rank, rank2 = rank2, rank
        tpar, tpar2 = tpar2, tpar
        rpar, rpar2 = rpar2, rpar
        rdep, rdep2 = rdep2, rdep
        gn = min(B, end)
        d = uint32(d + uint32(1))

    # outputs: node i + 1 = table entry i; fewer than B nodes are padded with children of the root (verified,
    # never accepted). paths (flat rows of width L + 1): -1 everywhere by consecutive threads (coalesced), then
    # each node's own entries - its ancestors by depth, found by walking up. (A thread per node writing its whole
    # row, at a stride of a row, was a third of the kernel's time: ncu.)
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
        if i < gn:
            dd = uint32(dep[i])
            out_tokens[r, i] = ids[r, dd - uint32(1), rank[i]]
            out_depth[r, i] = dd
            out_parent[r, i] = tpar[i] + 1
            out_logw[r, i] = w[i]
            path_depth[r, i + uint32(1)] = dd
            node = int32(i)
            k = dd
            while k > uint32(0):
                paths[r, row + k] = node + 1
                node = tpar[node]
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
        n_out[r] = gn
        path_depth[r, 0] = 0
        paths[r, 0] = 0


@cuda.jit(device=True)
def _walk_chains(d, gn, n_lp, floor_w, cap, lps, w, dep, rank, tpar, rpar, rdep, nmap, sh):
    """The slow path of step 1 (a telescoping step rounded): one thread per parent walks the sibling chain of its
    children in the heap's float64 order, in a range reserved with a shared atomic (sh[0]); then the record parents
    of the chains whose weights never rise, one thread per child, and the node map cleared. Returns (candidate
    count, overflowed), the same in every thread. Ends with a barrier."""
    tid = uint32(cuda.threadIdx.x)
    nt = uint32(cuda.blockDim.x)
    top_lp = float64(lps[0])
    n_par = uint32(1) if d == uint32(1) else gn
    pi = tid
    while pi < n_par:
        parent = -1 if d == uint32(1) else int32(pi)
        wp = 0.0 if d == uint32(1) else w[pi]
        if top_lp != -math.inf and (d == uint32(1) or uint32(dep[pi]) == d - uint32(1)):
            # the chain's length, in registers; and whether its weights never rise (then no earlier sibling is
            # lighter, and every record parent lies on the parent's generation path: found in parallel below)
            wc = wp + top_lp if d > uint32(1) else top_lp
            n_c = uint32(0)
            rising = False
            while wc >= floor_w:
                n_c = uint32(n_c + uint32(1))
                if n_c >= n_lp:
                    break
                nxt = float64(lps[n_c])
                if nxt == -math.inf:
                    break
                w_last = wc
                wc = (wc - float64(lps[n_c - uint32(1)])) + nxt
                if wc > w_last:
                    rising = True
            if n_c > uint32(0):
                base = uint32(gn + uint32(cuda.atomic.add(sh, 0, int32(n_c))))
                if base + n_c <= gn + cap:
                    # write the chain: the same float64 operations in the same order, so the same weights
                    prev = -1                # the previous sibling's entry, weight, record parent and its depth
                    w_prev = 0.0
                    rp_prev = -1
                    rd_prev = 0
                    wc = wp + top_lp if d > uint32(1) else top_lp
                    c = uint32(0)
                    while c < n_c:
                        if c > uint32(0):
                            wc = (wc - float64(lps[c - uint32(1)])) + float64(lps[c])
                        x = uint32(base + c)
                        w[x] = wc
                        dep[x] = d
                        rank[x] = c
                        tpar[x] = parent
                        if not rising:
                            rpar[x] = PENDING
                        else:
                            # rising chain: record parents in chain order - the generator (previous sibling, or the
                            # parent for the first child) if it is lighter, else its record ancestors
                            if c == uint32(0):
                                z = _record_parent(parent, wc, w, rpar)
                                rd = 1 if z < 0 else rdep[z] + 1
                            elif w_prev < wc:
                                z = prev
                                rd = rd_prev + 1
                            else:
                                z = _record_parent(rp_prev, wc, w, rpar)
                                rd = 1 if z < 0 else rdep[z] + 1
                            rpar[x] = z
                            rdep[x] = rd
                            prev = int32(x)
                            w_prev = wc
                            rp_prev = z
                            rd_prev = rd
                        c = uint32(c + uint32(1))
        pi = uint32(pi + nt)
    cuda.syncthreads()
    total = uint32(sh[0])
    if total > cap:
        return total, True
    end = uint32(gn + total)
    x = uint32(gn + tid)
    while x < end:
        if rpar[x] == PENDING:
            z = _record_parent(tpar[x], w[x], w, rpar)
            rpar[x] = z
            rdep[x] = 1 if z < 0 else rdep[z] + 1
        x = uint32(x + nt)
    x = tid
    while x < end:
        nmap[x] = -1
        x = uint32(x + nt)
    cuda.syncthreads()
    return total, False


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
    order, BITONIC always sorts with the bitonic network - the paths the fast ones fall back to."""

    def __init__(self, R: int, L: int, K: int, budget: int, capacity: int | None = None, mode: int = 0):
        self.R, self.L, self.K, self.B = R, L, K, budget
        self.mode = _checks.integer(mode, "mode", lo=0, hi=SLOW_CHAINS | BITONIC)   # tests: force the slow paths
        worst = budget * min(K, budget)
        self.cap = worst if capacity is None else max(1, min(capacity, worst))
        tab = budget + self.cap
        sort_cap = 1
        while sort_cap < self.cap:
            sort_cap *= 2
        e = backend.empty
        # few, packed arrays: every array argument costs host time at each launch
        self.wtab = e((2, R, tab), np.float64)                 # [copy, request, entry]
        self.itab = e((2, 5, R, tab), np.int32)                # [copy, field, request, entry]
        self.scratch = e((2, R, max(tab, sort_cap)), np.int32)  # node map, sort buffer
        B1 = max(budget, 1)
        self.out_i = e((3, R, B1), np.int32)                   # tokens, depth, parent
        self.out = DeviceTrees(self.out_i[0], self.out_i[1], self.out_i[2], e((R, B1), np.float64),
                               e((R, B1 + 1, L + 1), np.int32), e((R, B1 + 1), np.int32), e((R,), np.int32))
        self.overflow = backend.zeros((R,), np.int32)
        self._paths_flat = self.out.paths.reshape(R, -1)       # the kernel writes paths as flat rows (a view)

    def build(self, lp, ids) -> DeviceTrees:
        """Launch the build for ``lp, ids [R, L, K]`` (no host sync); ``self.overflow`` flags a too-small cap."""
        o = self.out
        if backend.name == "numpy":
            host_ids = np.asarray(ids)
            for r in range(self.R):
                self._pack(r, build_tree_ref(np.asarray(lp[r]), host_ids[r], self.B))
            return o
        threads = backend.block_size(MAX_THREADS, 32)    # the simulator's warp collectives need one warp
        R, L, K = self.R, self.L, self.K
        backend.launch(_build_kernel, R, threads, lp.reshape(R, L * K), ids, self.B, self.cap, self.wtab, self.itab,
                       self.scratch, self.out_i, o.logw, self._paths_flat, o.path_depth, o.n, self.overflow,
                       self.mode)
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
