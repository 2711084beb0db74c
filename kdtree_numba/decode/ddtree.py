"""The DDTree decode loop: draft -> build -> verify -> accept -> commit, one target forward per round.

One round, with ``start`` committed tokens and the root (the last bonus token) at position ``start``:
  1. draft:   the drafter's logits for depths 1..L                                 [L, V]
  2. topk, build: top-K log-probs per depth, then the best-first tree of ``budget`` nodes  (on the device)
  3. verify:  one target forward over [root, node_1 .. node_n] at positions start + depth, each node attending
              to the committed cache and its ancestors only                         [n+1, V]
  4. accept:  the target's token at every node, walk from the root while it matches a child
  5. commit:  the accepted nodes' cache rows move to start, start+1, ... (every layer, one launch); emit the
              accepted tokens and the bonus; the bonus is the next root. A drafter that reads target features
              (DFlash) gets the accepted nodes' rows of the verify forward's hidden states as its next context.
Everything stays on the device except the packed accepted tokens, read once per round; the trees, accepted node
indices and stage times of all rounds (device clock stamps: kernels/stamp.py) are copied to the host once, at the end
(three blocks: ``_records``); the RoundTraces are built from them when first read (``trace.Rounds``).
``ddtree_replay.py`` runs the same round with its state on the device, captured as one CUDA graph.
"""
from __future__ import annotations

import time

import numpy as np

from .. import backend
from ..kernels import logprobs, round_end, sampling, tree_accept, tree_build
from ..kernels.stamp import stamp
from ..kernels.tree import Tree
from ..model.drafters import concat_features
from ..model.target import TreeInput
from .autoregressive import nan_error
from .trace import STAGES, Generation, Rounds, RoundTrace


def ddtree(target, prompt: np.ndarray, max_new_tokens: int, drafter, budget: int, temperature: float, seed: int,
           stop_tokens=(), top_k: int | None = None, progress=None) -> Generation:
    """DDTree decoding (``top_k=1`` with ``budget = depth``: a single draft chain)."""
    L, V = drafter.depth, target.config.vocab_size
    K = max(1, min(budget, V) if top_k is None else top_k)
    cache = target.new_cache(len(prompt) + max_new_tokens + budget + 1)       # + one tree block
    drafter.reset()
    feats = drafter.feature_layers                                             # target layers the drafter reads
    logits, hid = target.forward(prompt, cache, 0, hidden_layers=feats, check_ids=False,
                                 logits_to_keep=1)                               # prefill
    if feats:
        drafter.observe(concat_features(hid, feats), 0)
    first = sampling.choose_tokens(logits[-1:], temperature, seed, len(prompt) - 1)   # drawn at its position
    root = int(backend.to_host(first)[0])
    if root < 0:
        raise nan_error()
    s = _RoundState(L, K, budget, max_new_tokens)
    start, out, t0 = len(prompt), [root], time.perf_counter()
    while len(out) < max_new_tokens and root not in stop_tokens:
        i, clock = len(s.rounds), s.rec["stamps"]
        stamp(clock, i, 0)
        draft = _check_draft(drafter.draft(np.concatenate([prompt, out[:-1]]), root), L, V)     # 1. draft
        stamp(clock, i, 1)
        lp, ids = logprobs.topk_logprobs(draft, K, out=(s.lp, s.ids), arg="drafter logits")   # 2. build
        stamp(clock, i, 2)
        tree = s.builder.build(lp[None], ids[None]) if budget else s.empty_tree
        stamp(clock, i, 3)
        s.verify_ids[0] = root                                 # 3. verify (the tokens: the build wrote them there)
        depth = tree.path_depth[0, :budget + 1]
        logits, hid = target.forward(s.verify_ids, cache, start, check_ids=False, hidden_layers=feats,
                                     tree=TreeInput(None, tree.paths[0, :budget + 1], depth, L))   # at start + depth
        stamp(clock, i, 4)
        s.acceptor.run(logits, tree.tokens[0], tree.parent[0], tree.n[:1], temperature, seed, start, depth)
        result = backend.to_host(s.acceptor.result)                                           # 4. accept
        stamp(clock, i, 5)
        cache.compact(start, s.acceptor.accepted, s.acceptor.n_acc)                           # 5. commit
        stamp(clock, i, 6)
        m, stopped = emit(result, out, stop_tokens)
        if feats and not (stopped or len(out) >= max_new_tokens):
            # the accepted path's features: the drafter's next context rows (none after the last round: no draft
            # reads them, and they could run past max_new_tokens)
            drafter.observe(backend.xp.take(concat_features(hid, feats), s.acceptor.accepted[:m], axis=0), start)
        s.record(tree, lp, ids, i)
        s.rounds.append((start, root))
        start, root = start + m, int(result[m])
        cache.length = start
        if progress is not None:
            progress(min(len(out), max_new_tokens), max_new_tokens)
        if stopped:
            break
    return Generation([int(x) for x in prompt], out[:max_new_tokens], s.traces(), 1 + len(s.rounds),
                      time.perf_counter() - t0, settings(drafter, budget, temperature, seed, top_k))


def emit(result, out: list, stop_tokens) -> tuple[int, bool]:
    """Append a round's packed ``result = [m, accepted drafts .., bonus]`` to ``out``; returns (m, stopped). A stop
    token inside the accepted path ends generation there - ``out`` is cut right after it, exactly where plain
    decoding would have stopped. m < 0 (NaN logits where the walk looked) raises."""
    m = int(result[0])
    if m < 0:
        raise nan_error()
    emitted = [int(x) for x in result[1:m + 1]]
    out += emitted
    for i, t in enumerate(emitted):
        if t in stop_tokens:
            del out[len(out) - len(emitted) + i + 1:]
            return m, True
    return m, False


def settings(drafter, budget: int, temperature: float, seed: int, top_k, **extra) -> dict:
    """A DDTree generation's settings record (the trace's ``settings``)."""
    return {"method": "chain" if top_k == 1 else "ddtree", "budget": budget, "temperature": temperature,
            "seed": seed, "drafter": getattr(drafter, "name", "drafter"), "depth": drafter.depth, **extra}


def _check_draft(draft, L: int, V: int):
    shape = tuple(getattr(draft, "shape", ()))
    if shape != (L, V):
        raise ValueError(f"drafter: returned draft logits of shape {shape}, expected ({L}, {V}) = (depth, vocab)")
    return backend.asarray(draft, np.float32)          # NaN / inf rows: topk_logprobs names them (host backends)


class _RoundState:
    """Buffers reused by every round, and the per-round records kept on the device until the end."""

    def __init__(self, L: int, K: int, budget: int, max_rounds: int):
        e = backend.empty
        self.budget, self.L = budget, L
        self.lp, self.ids = e((L, K), np.float32), e((L, K), np.int32)
        self.builder = tree_build.TreeBuilder(1, L, K, budget)
        self.acceptor = tree_accept.Acceptor(L, budget)
        self.verify_ids = self.builder.verify_ids(0)           # [budget + 1]: the root's slot, then the tree's tokens
        self.empty_tree = self.builder.out
        if budget == 0:
            o = self.empty_tree
            o.n[...], o.paths[...], o.path_depth[...] = 0, -1, 0
            o.paths[:, :, 0] = 0
        self.rec, self._blocks = _records(max_rounds, max(budget, 1), L)
        self.rounds: list[tuple] = []

    def record(self, tree, lp, ids, i, row_offset: int = 0, advance=None, root_copy=None) -> None:
        """Copy round i's tree and accept outputs into record row ``i + row_offset``, on the device, in one launch
        (kernels/round_end.py). ``i``: an int, or a device int32 [1] array (a captured round:
        decode/ddtree_replay.py, which also passes its ``advance`` state and the drafter's ``root_copy``)."""
        round_end.round_end(self.rec, tree, self.acceptor, lp, ids, i, row_offset, advance, root_copy)

    def traces(self, results=None) -> Rounds:
        """The rounds' RoundTraces: the device records copied to the host now (three copies: ``_records``), the
        Python objects built on first use (``trace.Rounds``: ~8 us a round that a generation's wall time need not
        pay). ``results``: the result rows the host read round by round (the replayed loop), checked against the
        records' accepted counts (``_check_records``)."""
        n = len(self.rounds)
        host = [backend.to_host(b[:n]) if backend.is_device(b) else b[:n].copy()     # [n, ...] each: copies
                for b in self._blocks]                                    # (the next generation reuses b)
        h = _records(n, self.rec["tokens"].shape[1], self.rec["draft_lp"].shape[1], host)[0]
        if results is not None:
            _check_records(h["n_acc"], results)
        rounds = list(self.rounds)                       # (start, root) each: a later generation starts a new list
        return Rounds(n, lambda: _round_traces(h, rounds))


def _check_records(n_acc, results: list) -> None:
    """The rounds' accepted counts as recorded must agree with the results the host read (m = n_acc): a replayed
    graph that wrote one of them elsewhere (a replay bug, not bad input) is an error, never a garbage trace."""
    for i, want in enumerate(results):
        if int(n_acc[i]) != int(want[0]):
            raise RuntimeError(f"replay: the device records of round {i + 1} disagree (n_acc {int(n_acc[i])}, the "
                               f"result {want.tolist()}); generate with replay=False and report this")


def _records(rounds: int, B1: int, L: int, blocks=None) -> tuple[dict, list]:
    """The per-round records as views of three blocks (allocated on the backend, or the given host copies of
    their first rows): every int32 and float32 field side by side in one int32 block [rounds, 3 B1 + 3 L + 5]
    (draft_lp a float32 view of its columns), logw float64 [rounds, B1], the stage stamps int64 [rounds, stages + 1]
    - so the end of a generation copies three blocks to the host, not ten arrays. Returns (fields, blocks)."""
    widths = {"tokens": B1, "depth": B1, "parent": B1, "n": 0, "accepted": L + 1, "n_acc": 0, "result": L + 2,
              "draft_lp": L}                                                 # 0: one column, a [rounds] view
    if blocks is None:
        e = backend.empty
        blocks = [e((rounds, sum(max(w, 1) for w in widths.values())), np.int32), e((rounds, B1), np.float64),
                  e((rounds, len(STAGES) + 1), np.int64)]                    # device clock (ns) around the stages
    ints, logw, stamps = blocks
    rec, o = {}, 0
    for f, w in widths.items():
        rec[f] = ints[:, o] if w == 0 else ints[:, o:o + w]
        o += max(w, 1)
    rec["draft_lp"] = rec["draft_lp"].view(np.float32)
    rec["logw"], rec["stamps"] = logw, stamps
    return rec, blocks


def _round_traces(h: dict, rounds: list) -> list[RoundTrace]:
    """RoundTraces from the host copies of the records ``h`` and the rounds' (start, root)."""
    out = []
    for i, (start, root) in enumerate(rounds):
        k, m = int(h["n"][i]), int(h["n_acc"][i])
        tree = Tree(h["tokens"][i, :k].copy(), h["depth"][i, :k].copy(),
                    np.concatenate([[-1], h["parent"][i, :k]]).astype(np.int32), h["logw"][i, :k].copy())
        t = h["stamps"][i]                                                     # [stages + 1] ns
        times = {st: float(t[j + 1] - t[j]) / 1e6 for j, st in enumerate(STAGES)}
        probs = [float(np.exp(x)) for x in h["draft_lp"][i, :m]]
        out.append(RoundTrace(start, root, tree, h["accepted"][i, :m].tolist(), int(h["result"][i, m]), probs,
                              times))
    return out
