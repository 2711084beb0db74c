"""The heap's pop order as device comparisons - what the tree build's kernels (``tree_build``'s level loop,
``tree_heap``'s warp) use to order nodes exactly as ``tree_build.build_tree_ref`` pops them.

A node is an entry of a node table: weight ``w`` (float64), ``depth``, ``rank`` among its siblings, tree ``parent``
(-1: a depth-1 node), and for the level loop a record parent ``rparent`` / record depth ``rdepth`` (tree_build's
module docstring, "Why a parallel version is subtle"). Pop order: heavier first; equal weights by rank tuple
(Python tuple order, a prefix first); nodes whose telescoped weight rounded above their generator's pop in the
preorder of the record tree. Example: (0,) weight -0.1 and (1,) weight -0.1: ``_tuple_less`` puts (0,) first;
(0, 1) -1.9 and (1,) -2.5: (0, 1) first by weight.
"""
from numba import cuda


# Every per-thread loop below is an unsigned 32-bit while loop: numba's range() computes a 64-bit trip count (a
# division) and signed indices add wraparound code; ncu showed this kernel bound by instruction fetch and count
# (stall_no_inst 34 % of samples, ~4000 instructions per warp for a two-level tree), not by its work.
@cuda.jit(device=True)
def _tuple_less(x, y, depth, parent, rank):
    """Rank tuple of node x < that of node y (lexicographic; a prefix sorts first)."""
    xa = x
    ya = y
    while depth[xa] > depth[ya]:
        xa = parent[xa]
    while depth[ya] > depth[xa]:
        ya = parent[ya]
    if xa == ya:
        return depth[x] < depth[y]
    while parent[xa] != parent[ya]:
        xa = parent[xa]
        ya = parent[ya]
    return rank[xa] < rank[ya]


@cuda.jit(device=True)
def _leaf_tuple_less(dx, rx, px, dy, ry, py, depth, parent, rank):
    """Rank tuple of x < that of y, for nodes not in the table: each given by its depth, its rank and its parent's
    table entry (-1: a depth-1 node), only their ancestors in the table (tree_heap's frontier). ``_tuple_less``'s
    walk, one step up first. (``_tuple_less`` written as a call of this one took the build kernel from 80 to 144
    registers - ptxas, sm_90 - so the table walk stays its own.) Example: x = (0, 1) (depth 2, rank 1, parent entry 0 = node (0,)), y = (1,) (depth 1, rank 1, parent -1):
    x climbs to (0,), rank 0 < 1 -> True."""
    ox = dx
    oy = dy
    while dx > dy:
        rx = rank[px]
        px = parent[px]
        dx -= 1
    while dy > dx:
        ry = rank[py]
        py = parent[py]
        dy -= 1
    if px == py and rx == ry:                # one is the other or its ancestor: the shorter tuple first
        return ox < oy
    while px != py:
        rx = rank[px]
        px = parent[px]
        ry = rank[py]
        py = parent[py]
    return rx < ry


@cuda.jit(device=True)
def _key_less(x, y, nodes):
    """Heap key of x < key of y: heavier first, equal weights by rank tuple."""
    w, depth, rank, parent, rparent, rdepth = nodes
    if w[x] != w[y]:
        return w[x] > w[y]
    return _tuple_less(x, y, depth, parent, rank)


@cuda.jit(device=True)
def _pops_before(a, b, nodes):
    """Heap pop order: preorder of the record tree (record ancestors first, siblings by key)."""
    w, depth, rank, parent, rparent, rdepth = nodes
    if rdepth[a] == 1 and rdepth[b] == 1:
        return _key_less(a, b, nodes)
    x = a
    y = b
    while rdepth[x] > rdepth[y]:
        x = rparent[x]
    if x == b:
        return False
    while rdepth[y] > rdepth[x]:
        y = rparent[y]
    if y == a:
        return True
    while rparent[x] != rparent[y]:
        x = rparent[x]
        y = rparent[y]
    return _key_less(x, y, nodes)


@cuda.jit(device=True)
def _before(a, wa, ra, b, wb, rb, nodes):
    """Node a pops before node b; (wa, ra), (wb, rb): their weights and record depths, already at hand. Two nodes
    without record parents and with different weights (the common case) compare without touching the table."""
    if ra == 1 and rb == 1 and wa != wb:
        return wa > wb
    return _pops_before(a, b, nodes)


@cuda.jit(device=True)
def _record_parent(gen, wx, w, rparent):
    """Nearest generation ancestor (starting at the generator) with a strictly smaller weight, i.e. a larger key
    (ancestors always have smaller rank tuples, so equal weights never make them larger)."""
    z = gen
    while z >= 0 and not (w[z] < wx):
        z = rparent[z]
    return z
