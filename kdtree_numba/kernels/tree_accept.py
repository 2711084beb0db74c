"""Tree accept: choose a token at every verified node, then walk the tree from the root while the choice is a child.

    chosen[i] = argmax(logits[i])  (T = 0)   or   a Gumbel-max sample of softmax(logits[i] / T)  (T > 0)
    path = [0]; while some child j of path[-1] has tokens[j] == chosen[path[-1]]: path.append(j)
    bonus = chosen[path[-1]]
Every emitted token is a genuine target sample given its prefix, so this is lossless at any temperature (no
draft-probability rejection step). Siblings carry distinct tokens, so at most one child matches.
At T > 0 node i's draw is keyed by its *position* (``sampling``'s module docstring): the stream is the root's
position and node i draws from stream + depth[i], the same uniforms plain decoding uses for the token after that
position. A walked node's prefix is the one plain decoding has there, so its choice is plain decoding's token:
DDTree (and the chain) emit exactly plain decoding's tokens at every temperature, for the same seed - whatever the
tree's shape or node order (siblings share their uniforms; only one of them is ever walked).
The token choice is ``sampling.choose_tokens`` (one block per node); the walk is ``_walk_kernel``: one block, at
each step every thread scans a strided share of the nodes for the matching child (at most L + 1 steps).
Outputs stay on the device: ``accepted [L+1]`` node indices (ascending, -1 padded), ``n_acc [1]``, and one packed
row the host reads per round, ``result = [m, token_1 .. token_{m-1}, bonus]`` (m = path length with the root;
m = -1 when a node the walk uses has NaN logits; NaN rows of rejected nodes are ignored, as plain decoding never
computes them).
Shapes: logits [n+1, V] float32, node tokens/parents [B] int32 (node i at index i-1), n [1] int32.
Example: parents [-1, 0, 0, 1] tokens [_, 5, 7, 9], chosen [7, 1, 3, 4] -> path [0, 2], bonus 3.
"""
from __future__ import annotations

import numpy as np
from numba import cuda, int32

from .. import backend
from . import _checks, sampling


def walk_ref(chosen, tokens, parents, n: int):
    """The accepted path (node indices with the root) and the bonus token; (None, None) when a node the walk
    uses holds a NaN row (chosen -1). NaN rows of rejected nodes do not matter: plain decoding never sees them.
    (A -1 choice matches no child, so only the walk's last node can be one.)"""
    chosen = np.asarray(chosen)
    path = [0]
    while True:
        cur = path[-1]
        nxt = [j for j in range(1, n + 1) if parents[j - 1] == cur and tokens[j - 1] == chosen[cur]]
        if not nxt:
            return (path, int(chosen[cur])) if chosen[cur] >= 0 else (None, None)
        path.append(nxt[0])


@cuda.jit
def _walk_kernel(chosen, tokens, parents, n_nodes, accepted, n_acc, result):
    tid = cuda.threadIdx.x
    nthreads = cuda.blockDim.x
    L1 = accepted.shape[0]
    n = n_nodes[0]
    found = cuda.shared.array(1, int32)
    for i in range(tid, L1, nthreads):
        accepted[i] = -1
    cuda.syncthreads()
    cur = 0
    m = 1
    while True:
        if tid == 0:
            found[0] = -1
            accepted[m - 1] = cur
        cuda.syncthreads()
        want = chosen[cur]
        for j in range(tid + 1, n + 1, nthreads):
            if parents[j - 1] == cur and tokens[j - 1] == want:
                found[0] = j
        cuda.syncthreads()
        nxt = found[0]
        cuda.syncthreads()
        if nxt < 0 or m >= L1:
            break
        if tid == 0:
            result[m] = tokens[nxt - 1]
        cur = nxt
        m += 1
    if tid == 0:
        n_acc[0] = m
        result[0] = m if chosen[cur] >= 0 else -1       # a NaN row on the walk (a -1 choice matches no child,
        result[m] = chosen[cur]                           # so only its last node can be one)


class Acceptor:
    """Preallocated outputs of the accept stage for trees of depth <= L and budget B."""

    def __init__(self, L: int, budget: int):
        self.L = L
        self.chosen = backend.empty((budget + 1,), np.int32)
        # the walk writes only the accepted prefix of these two; the rest is -1 (never read uninitialised when a
        # whole row is copied into the trace records or to the host)
        self.accepted = backend.full((L + 1,), -1, np.int32)
        self.n_acc = backend.empty((1,), np.int32)
        self.result = backend.full((L + 2,), -1, np.int32)

    def run(self, logits, tokens, parents, n_nodes, temperature: float, seed: int, stream: int, depths):
        """Choose at every node of ``logits [B+1, V]`` and walk; fills accepted / n_acc / result (no host sync).
        ``temperature``, ``seed``, ``stream`` (the root's position): host values or device arrays, as
        ``sampling.choose_tokens`` takes; ``depths [B+1]`` int32 the nodes' depths (the root's 0): node i draws
        from stream + depths[i] (module docstring)."""
        rows = logits.shape[0]
        chosen = self.chosen[:rows]
        sampling.choose_tokens(logits, temperature, seed, stream, out=chosen, row_streams=depths[:rows])
        if backend.name == "numpy":
            n = int(n_nodes[0])
            path, bonus = walk_ref(chosen, tokens, parents, n)
            self.accepted[...] = -1
            if path is None:
                self.accepted[0], self.n_acc[0], self.result[0] = 0, 1, -1
                return
            path = path[:self.L + 1]
            bonus = int(chosen[path[-1]])
            self.accepted[:len(path)] = path
            self.n_acc[0] = len(path)
            self.result[0] = len(path)
            self.result[1:len(path)] = [tokens[j - 1] for j in path[1:]]
            self.result[len(path)] = bonus
            return
        threads = backend.block_size(256, 16)
        backend.launch(_walk_kernel, 1, threads, chosen, tokens, parents, n_nodes, self.accepted, self.n_acc,
                       self.result)


def accept(logits, tokens, parents, n: int, temperature: float = 0.0, seed: int = 0, stream: int = 0):
    """Host convenience: (accepted node indices, bonus token) for one verified tree.

    logits [n+1, V] (row i = node i, row 0 the root); tokens / parents [n] for nodes 1..n (parent 0 = root);
    stream: the root's position (node i draws from stream + its depth at T > 0)."""
    logits = _checks.array(logits, "logits", dtype=np.float32, ndim=2)
    n = _checks.integer(n, "n", lo=0, hi=logits.shape[0] - 1)
    tokens = _checks.array(np.asarray(tokens, np.int32) if not backend.is_device(tokens) else tokens, "tokens",
                           dtype=np.int32, ndim=1)
    parents = _checks.array(np.asarray(parents, np.int32) if not backend.is_device(parents) else parents,
                            "parents", dtype=np.int32, shape=tokens.shape)
    if tokens.shape[0] < n:
        raise ValueError(f"tokens: expected at least n = {n} node tokens, got {tokens.shape[0]}")
    host_parents = backend.to_host(parents)
    depth = np.zeros(n + 1, np.int64)
    for j in range(1, n + 1):
        if not 0 <= host_parents[j - 1] < j:
            raise ValueError(f"parents: node {j} has parent {host_parents[j - 1]}, expected one in [0, {j})")
        depth[j] = depth[host_parents[j - 1]] + 1
    acc = Acceptor(int(depth.max()), max(n, 1))
    acc.run(logits[:n + 1], tokens, parents, backend.asarray(np.array([n], np.int32)), temperature, seed, stream,
            backend.asarray(depth.astype(np.int32)))
    result = backend.to_host(acc.result)
    if result[0] < 0:
        raise ValueError("logits: a node's target logits contain NaN")
    m = int(result[0])
    return backend.to_host(acc.accepted)[:m].tolist(), int(result[m])
