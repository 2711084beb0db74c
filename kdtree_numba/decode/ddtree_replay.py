"""Graph-replayed DDTree rounds: the round of ``ddtree.py`` with its state on the device, captured once as one CUDA
graph and replayed, so a round costs its kernels' device time plus one small host read.

The round's inputs live in three device int32 [1] arrays (the *state*), never in launch arguments:

    start  the committed length = the root's position (its cache row)
    root   the root token (the last bonus token); the verify ids' first slot, the tree's tokens after it (the
           build writes them there): the verify's ids are copied from nowhere; the round end writes it into the
           drafter's block slot as well (``root_slot``), so the draft copies nothing either
    round  the round number, from 1 (the round end writes its trace records at row round - 1)

    draft    logits = drafter.draft_at(root, start)                               [L, V]  (DFlash: device-side)
    topk     lp, ids = top-K of log_softmax(logits)                                [L, K]
    build    tree = best-first tree of ``budget`` nodes (always budget + 1 verify rows: fixed shapes)
    verify   logits, hidden = target.forward([root, tree tokens], start, tree)     [budget + 1, V]
    accept   accepted [L + 1], n_acc [1], result = [m, tokens.., bonus]
    compact  cache rows start + accepted[j] -> start + j, the accepted rows' features gathered in the same launch;
             the drafter observes them
    (then)   records for the traces at row round - 1;  start += n_acc;  root = result[m];  round += 1
             (one launch: kernels/round_end.py)

The host reads ``result`` (L + 2 int32) once per round to emit tokens and test stop tokens, NaN and the token
limit; nothing else leaves the device until the generation ends (the records: three host copies, ddtree.py).
The read is pipelined: round i + 1 is launched before round i's result is read (from its trace record, on a
second stream that waits only for round i's end event), so the GPU runs the next round while the host emits
tokens and launches graphs; the prefill's token is read the same way, after round 1 is queued behind the prefill.
Launched ahead only while round i cannot reach the token limit (more than L + 1 tokens to go); a stop token
inside round i makes round i + 1 wasted work, which the next generation's prefill overwrites. The drafter
observes all L + 1 rows of a padded path; rows past the accepted ones are overwritten by the next round's block
before anything reads them. Stage times (the trace's ``times``) are device clock stamps taken inside the graph
before the first stage and after each (kernels/stamp.py): a graph per stage with CUDA events between them was
6 % slower (H200, 2026-12-04: DDTree-32 4659 / 4724 against 4959 / 4990 tokens/s, docs/PERFORMANCE.md).

On cuda the first round runs directly (numba compiles every kernel, CuPy's pool gets every block), then the round
is captured (``capture.CapturedStep``) and every later round replays its one graph. The program (caches, state,
tree buffers, graphs) is kept between generations with the same settings (``replay.program``): a later
generation prefills (padded to its length bucket and replayed from a graph as well: prefill_replay.py) and replays
from its first round. On the NumPy and simulator backends the same stage functions run directly, so their tests
test the device-side bookkeeping (and its reuse).
Needs a drafter that drafts from device-side state (``draft_at`` / ``observe_at`` / ``reserve`` / ``root_slot``:
the DFlash drafter); the oracle and random drafters read the host context and run with ``replay=False``.
Example: prompt [5, 9], greedy, budget 4: round 1 drafts after root r (start 2), accepts m = 3 (root + 2 nodes),
emits [a, b, bonus]; the state becomes start 4, root = bonus, round 2 - the tokens ``ddtree`` emits.
"""
from __future__ import annotations

import time

import numpy as np

from .. import backend
from ..kernels import logprobs, sampling
from ..kernels.stamp import stamp
from ..model.drafters import concat_features
from ..model.target import TreeInput
from .autoregressive import nan_error
from .ddtree import _RoundState, emit, settings
from .capture import CapturedStep
from .prefill_replay import Prefill
from .replay import Program, capacity_for, program
from .trace import STAGES, Generation


def require_device_drafter(drafter) -> None:
    """Refuse a drafter that cannot draft from device-side state (``draft_at``, ``observe_at``, ``reserve``,
    ``root_slot``)."""
    if not all(callable(getattr(drafter, f, None)) for f in ("draft_at", "observe_at", "reserve", "root_slot")):
        raise ValueError(f"replay: the {getattr(drafter, 'name', type(drafter).__name__)} drafter reads the host "
                         f"context; graph-replayed rounds need a device-side drafter (DFlash) - use replay=False")


class _RoundProgram(Program):
    """The round's buffers, device state and stage functions (module docstring) for one configuration; ``rows``:
    the target cache's capacity (prompt + tokens + one tree block fit)."""

    def __init__(self, target, drafter, budget: int, K: int, rows: int):
        super().__init__(target, drafter)
        L = drafter.depth
        self.target, self.drafter, self.budget, self.L = target, drafter, budget, L
        self.cache = target.new_cache(rows)
        drafter.reserve(rows + L + 1)                                       # + the padded path's rows
        self.s = _RoundState(L, K, budget, rows)
        self.counters = backend.empty((2,), np.int32)                       # start and round (state [1] each):
        self.start, self.round = self.counters[0:1], self.counters[1:2]      # views of one array, one upload
        self.root = self.s.verify_ids[:1]                                   # the verify's first id: no copy
        self.draft_root = drafter.root_slot()                               # the draft's: the round end writes both
        feats = drafter.feature_layers                                      # the accepted path's features [L + 1, nH]
        self.path_feats = backend.empty((L + 1, len(feats) * target.config.hidden_size), np.float32) \
            if feats else None
        self.first = backend.empty((1,), np.int32)                          # the prefill's token (-1: NaN)
        self.r: dict = {}                                                   # arrays passed from stage to stage
        self.stages = [self._draft, self._topk, self._build, self._verify, self._accept, self._compact]
        assert [f.__name__[1:] for f in self.stages] == list(STAGES)
        self.run = self._round
        self.zero = backend.zeros((1,), np.int32)                           # the prompt's first position
        self.prefill = Prefill(target, self.cache, drafter.feature_layers, self._first)
        self.hold()

    def begin(self, prompt, temperature: float, seed: int):
        """The sampler's settings; the prefill (padded and replayed per length bucket: prefill_replay.py), the
        drafter's context, the first root (``first``; clamped to >= 0 in ``root`` and the draft's slot); the
        state for round 1. Reads nothing: returns the end mark after which ``first`` may be read, so round 1
        queues behind the prefill without the host waiting between them."""
        self.set_sampler(temperature, seed)
        self.prefill(prompt)
        self.drafter.length = len(prompt)            # the context it observed (rows past it are scratch)
        backend.upload(self.counters, np.array([len(prompt), 1], np.int32))      # start, round
        self.s.rounds = []
        return backend.mark()

    def _first(self, logits, hid, last) -> None:
        """After the prompt's forward: the drafter observes every row run (a padded prefill's pad rows too:
        scratch, overwritten by the first draft's block before anything reads them), the first root (-1: NaN
        logits), clamped into the round's root and the draft's slot."""
        feats = self.drafter.feature_layers
        if feats:
            self.drafter.observe_at(concat_features(hid, feats), self.zero)
        sampling.choose_tokens(logits, *self.sampler, last, out=self.first)              # logits [1, V]
        backend.xp.maximum(self.first, 0, out=self.root)
        self.draft_root[...] = self.root

    def rounds(self):
        """Run rounds forever, yielding each round's end mark (on cuda an event: the result reader waits on it);
        the caller reads the result and stops."""
        while True:
            self.run()
            yield backend.mark()
            if backend.name == "cuda" and self.run == self._round:            # after one direct round: capture
                self.run = CapturedStep(self._round, "the DDTree round").replay

    def _round(self):
        """The six stages, the device clock stamped before the first and after each (the trace's stage times,
        kernels/stamp.py), then the round end (records, state)."""
        clock = self.s.rec["stamps"]                                        # [rounds, 7] ns
        stamp(clock, self.round, 0, row_offset=-1)
        for j, fn in enumerate(self.stages, 1):
            fn()
            stamp(clock, self.round, j, row_offset=-1)
        self._advance()

    # the stages: device state in, device state out
    def _draft(self):
        self.r["draft"] = self.drafter.draft_at(self.draft_root, self.start)                   # [L, V]

    def _topk(self):
        logprobs.topk_logprobs(self.r["draft"], self.s.lp.shape[1], out=(self.s.lp, self.s.ids),
                               arg="drafter logits")    # [L, K]; a NaN row: an error on host backends, on cuda -1
                                                        # ids that no target choice matches

    def _build(self):
        s = self.s
        self.r["tree"] = s.builder.build(s.lp[None], s.ids[None]) if self.budget else s.empty_tree

    def _verify(self):
        tree, s, B = self.r["tree"], self.s, self.budget
        depth = tree.path_depth[0, :B + 1]                                                       # [B + 1]
        self.r["logits"], self.r["hid"] = self.target.forward(
            s.verify_ids, self.cache, self.start, check_ids=False, hidden_layers=self.drafter.feature_layers,
            tree=TreeInput(None, tree.paths[0, :B + 1], depth, self.L))      # rope at start + depth: no add

    def _accept(self):
        tree, B = self.r["tree"], self.budget
        self.s.acceptor.run(self.r["logits"], tree.tokens[0], tree.parent[0], tree.n[:1], *self.sampler,
                            self.start, tree.path_depth[0, :B + 1])    # drawn at start + depth, as in ddtree.py

    def _compact(self):
        a, feats = self.s.acceptor, self.drafter.feature_layers
        if not feats:
            self.cache.compact(self.start, a.accepted, a.n_acc)
            return
        # the padded path's features gathered in the compaction's launch (rows past n_acc are scratch: its -1
        # slots take the root's row), then observed
        self.cache.compact(self.start, a.accepted, a.n_acc,
                           gather=(concat_features(self.r["hid"], feats), self.path_feats))
        self.drafter.observe_at(self.path_feats, self.start)                                   # [L + 1, nH]

    def _advance(self):                           # records at row round - 1, then start, root, round: one launch
        self.s.record(self.r["tree"], self.s.lp, self.s.ids, self.round, row_offset=-1,
                      advance=(self.start, self.root, self.round), root_copy=self.draft_root)


def ddtree_replay(target, prompt: np.ndarray, max_new_tokens: int, drafter, budget: int, temperature: float,
                  seed: int, stop_tokens=(), top_k: int | None = None, progress=None) -> Generation:
    """DDTree decoding (``top_k=1``, ``budget = depth``: the chain) with device-side state; same tokens and traces
    as ``ddtree``."""
    require_device_drafter(drafter)
    V = target.config.vocab_size
    K = max(1, min(budget, V) if top_k is None else top_k)
    rows = capacity_for(len(prompt) + max_new_tokens + budget + 1)          # + one tree block
    p = program(drafter, ("round", id(target), budget, K, rows),
                lambda: _RoundProgram(target, drafter, budget, K, rows))
    begun = p.begin(prompt, temperature, seed)
    s = p.s
    rounds, results, read = p.rounds(), [], _ResultReader()
    ahead = next(rounds) if max_new_tokens > 1 else None                  # round 1 queues behind the prefill,
    root = int(read(p.first, begun)[0])                                    # then the first token is read
    if root < 0:
        raise nan_error()
    start, out, t0 = len(prompt), [root], time.perf_counter()
    if root in stop_tokens:
        ahead = None                                                           # round 1: wasted work (a stop)
    while ahead is not None:
        end = ahead                                                            # round i: launched, maybe running
        ahead = next(rounds) if max_new_tokens - len(out) > p.L + 1 else None  # round i + 1 (module docstring)
        result = read(s.rec["result"][len(s.rounds)], end)                    # the round's one host read
        _check_result(result, p.L, V, len(s.rounds) + 1)
        m, stopped = emit(result, out, stop_tokens)
        s.rounds.append((start, root))
        results.append(result)
        start, root = start + m, int(result[m])
        if progress is not None:
            progress(min(len(out), max_new_tokens), max_new_tokens)
        if stopped or len(out) >= max_new_tokens:
            break
        if ahead is None:                                                      # near the limit: one at a time
            ahead = next(rounds)
    p.cache.length = start
    drafter.length = start
    return Generation([int(x) for x in prompt], out[:max_new_tokens], s.traces(results), 1 + len(s.rounds),
                      time.perf_counter() - t0, settings(drafter, budget, temperature, seed, top_k, replay=(
                          "cuda graphs" if backend.name == "cuda" else "direct (device-side state)")))


class _ResultReader:
    """``read(row, end)``: a host copy of a device record row once the event ``end`` has passed. On cuda the copy
    runs on a stream of its own that waits for ``end`` only, so the round launched after it keeps running while
    the host waits; on the host backends the row is simply copied."""

    def __init__(self):
        self.stream = backend.cp.cuda.Stream(non_blocking=True) if backend.name == "cuda" else None

    def __call__(self, row, end) -> np.ndarray:
        if self.stream is None:
            return np.array(backend.to_host(row))
        self.stream.wait_event(end)
        return row.get(stream=self.stream)                 # contiguous row: CuPy's copy, then this stream's sync


def _check_result(result: np.ndarray, L: int, V: int, i: int) -> None:
    """Round i's result as read from its device record: m <= L + 1 accepted tokens, each in the vocabulary (m < 0,
    NaN logits, is ``emit``'s error). A graph that wrote elsewhere is a named error, never garbage tokens."""
    m = int(result[0])
    if m > L + 1 or (m > 0 and not ((result[1:m + 1] >= 0) & (result[1:m + 1] < V)).all()):
        raise RuntimeError(f"replay: the device records of round {i} hold an impossible result {result.tolist()} "
                           f"(expected [m <= {L + 1}, m tokens < {V}, ..]); generate with replay=False and report "
                           f"this")
