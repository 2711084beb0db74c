"""The draft tree type, ``Tree``: nodes in pop order, as the tree build makes them, and their root-to-node paths.

A tree of n nodes under a root (node 0, the last committed token). Node i (1..n) is ``tokens[i-1]`` at depth
``depths[i-1]``, child of ``parents[i]`` (parents[0] == -1); ``logw[i-1]`` is the float64 sum of the draft
log-probs along its path. Nodes are numbered in pop order (best first), so a parent precedes its children.
Paths (``ancestor_paths``, ``Tree.paths``): ``paths[i, d]`` = node i's ancestor at depth d, from paths[i, 0] = 0
(the root) to paths[i, depth(i)] = i, -1 padded - the compact ancestor list tree-verify attention reads
(kernels/tree_verify.py) instead of an (n+1) x (n+1) mask.
Mapping: host (NumPy) only; the device build (kernels/tree_build.py) writes the same paths itself.
Shapes: tokens (n,) int32, depths (n,) int32, parents (n+1,) int32, logw (n,) float64;
paths [n+1, L+1] int32, path depths [n+1] int32.
Example: parents [-1, 0, 0, 1] -> depths [0, 1, 1, 2], paths [[0, -1, -1], [0, 1, -1], [0, 2, -1], [0, 1, 3]].
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Tree:
    """A draft tree in pop order. Node i (1..n) is ``tokens[i-1]`` at ``depths[i-1]``; ``parents[i]`` is its parent
    node (0 = the root); ``parents[0] == -1``; ``logw`` the float64 sum of its path's draft log-probs."""
    tokens: np.ndarray     # (n,) int32
    depths: np.ndarray     # (n,) int32
    parents: np.ndarray    # (n+1,) int32
    logw: np.ndarray       # (n,) float64

    @property
    def n(self) -> int:
        return int(self.tokens.shape[0])

    def paths(self, max_depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(paths [n+1, L+1] int32, path_depth [n+1] int32): every node's root-to-node node indices."""
        return ancestor_paths(self.parents, max_depth)

    def __eq__(self, other) -> bool:
        return (isinstance(other, Tree) and np.array_equal(self.tokens, other.tokens)
                and np.array_equal(self.depths, other.depths) and np.array_equal(self.parents, other.parents)
                and np.array_equal(self.logw.view(np.int64), other.logw.view(np.int64)))


def ancestor_paths(parents: np.ndarray, max_depth: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(paths [n+1, L+1] int32 padded with -1, depths [n+1] int32) from ``parents [n+1]`` (parents[0] == -1)."""
    parents = np.asarray(parents)
    n1 = parents.shape[0]
    depths = np.zeros(n1, np.int32)
    for i in range(1, n1):
        depths[i] = depths[parents[i]] + 1
    width = int(depths.max()) + 1 if max_depth is None else max_depth + 1
    paths = np.full((n1, width), -1, np.int32)
    for i in range(n1):
        node = i
        for d in range(depths[i], -1, -1):
            paths[i, d] = node
            node = parents[node]
    return paths, depths
