"""What a generation returns: the new tokens, one RoundTrace per DDTree round, counts and stage times.

JSON round trip (``to_json`` / ``Generation.from_json``) backs ``--trace out.json`` and the ``trees`` command.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Sequence

import numpy as np

from ..atomic_file import write_text_atomic
from ..config import is_int, is_num, short_repr
from ..kernels.tree import Tree

STAGES = ("draft", "topk", "build", "verify", "accept", "compact")


class TraceError(ValueError):
    """A saved trace is not valid JSON, misses a field, or holds a value it cannot (e.g. a parent out of range)."""



@dataclasses.dataclass
class RoundTrace:
    """One DDTree round.

    start: committed tokens before the round (the root sits at position ``start``); root: the root token;
    tree: the draft tree (pop order); accepted: accepted node indices, root (0) first, ascending;
    bonus: the target's token after the last accepted node; draft_probs[d-1]: the draft's probability of the token
    the target chose at depth d = 1 .. min(len(accepted), the draft's depth) (NaN when that token was outside the
    drafter's top-K);
    times: milliseconds per stage (``STAGES``: draft / topk / build / verify / accept / compact)."""
    start: int
    root: int
    tree: Tree
    accepted: list[int]
    bonus: int
    draft_probs: list[float]
    times: dict[str, float]

    @property
    def accept_length(self) -> int:
        """Tokens committed this round = len(accepted) (accepted drafts + the bonus)."""
        return len(self.accepted)

    @property
    def accepted_tokens(self) -> list[int]:
        return [int(self.tree.tokens[i - 1]) for i in self.accepted[1:]]

    def to_dict(self) -> dict:
        return {"start": self.start, "root": self.root, "tokens": self.tree.tokens.tolist(),
                "depths": self.tree.depths.tolist(), "parents": self.tree.parents.tolist(),
                "logw": [float(x) for x in self.tree.logw], "accepted": list(self.accepted), "bonus": self.bonus,
                "draft_probs": [None if math.isnan(p) else p for p in self.draft_probs], "times": self.times}

    @classmethod
    def from_dict(cls, d: dict, where: str = "round") -> "RoundTrace":
        """A round from its ``to_dict`` form, checked (``TraceError`` naming ``where``, the field and the value):
        the tree is in pop order (each node's parent an earlier node, its depth the parent's + 1) and the accepted
        nodes are a root-first path of it."""
        def bad(field, value, expected):
            return TraceError(f"{where}.{field}: got {short_repr(value)}, expected {expected}")

        if not isinstance(d, dict):
            raise TraceError(f"{where}: got {short_repr(d)}, expected an object")
        for field in ("start", "root", "tokens", "depths", "parents", "logw", "accepted", "bonus", "draft_probs",
                      "times"):
            if field not in d:
                raise TraceError(f"{where}: no {field} field, expected start, root, tokens, depths, parents, logw, "
                                 f"accepted, bonus, draft_probs and times")
        start, root, bonus = d["start"], d["root"], d["bonus"]
        for field, v in (("start", start), ("root", root), ("bonus", bonus)):
            if not (is_int(v) and 0 <= v < 2 ** 31):
                raise bad(field, v, "a non-negative integer (int32)")
        tokens, depths, parents = d["tokens"], d["depths"], d["parents"]
        for field, v in (("tokens", tokens), ("depths", depths), ("parents", parents)):
            if not (isinstance(v, list) and all(is_int(x) and -1 <= x < 2 ** 31 for x in v)):
                raise bad(field, v, "a list of integers")
        n = len(tokens)
        if any(t < 0 for t in tokens):
            raise bad("tokens", tokens, "token ids >= 0")
        if len(depths) != n or len(parents) != n + 1:
            raise bad("parents", parents, f"{n + 1} entries and depths {n} (one per node of the {n} tokens, "
                                          f"parents with the root's first)")
        if parents[0] != -1:
            raise bad("parents[0]", parents[0], "-1 (the root has no parent)")
        for i in range(1, n + 1):
            p = parents[i]
            if not 0 <= p < i:
                raise bad(f"parents[{i}]", p, f"an earlier node in [0, {i}) (pop order)")
            if depths[i - 1] != (depths[p - 1] if p else 0) + 1:
                raise bad(f"depths[{i - 1}]", depths[i - 1], f"{(depths[p - 1] if p else 0) + 1} (its parent's + 1)")
        logw = d["logw"]
        if not (isinstance(logw, list) and len(logw) == n and all(is_num(x) and -math.inf < x <= 0 for x in logw)):
            raise bad("logw", logw, f"a list of {n} finite log-probabilities (<= 0)")
        acc = d["accepted"]
        if not (isinstance(acc, list) and acc and all(is_int(x) for x in acc)):
            raise bad("accepted", acc, "a non-empty list of node indices")
        if acc[0] != 0:
            raise bad("accepted[0]", acc[0], "0 (the root)")
        for j in range(1, len(acc)):
            if not 0 < acc[j] <= n:
                raise bad(f"accepted[{j}]", acc[j], f"a node index in [1, {n}]")
            if parents[acc[j]] != acc[j - 1]:
                raise bad(f"accepted[{j}]", acc[j], f"a child of node {acc[j - 1]} (the accepted nodes form a "
                                                    f"path from the root)")
        probs = d["draft_probs"]
        if not (isinstance(probs, list) and len(acc) - 1 <= len(probs) <= len(acc)
                and all(p is None or (is_num(p) and 0 <= p <= 1) for p in probs)):
            raise bad("draft_probs", probs, f"a list of {len(acc) - 1} or {len(acc)} probabilities or nulls (one "
                                            f"per committed depth; none past the draft's depth)")
        times = d["times"]
        if not (isinstance(times, dict) and all(is_num(v) and 0 <= v < math.inf for v in times.values())):
            raise bad("times", times, "an object of milliseconds per stage (finite, >= 0)")
        tree = Tree(np.array(tokens, np.int32), np.array(depths, np.int32), np.array(parents, np.int32),
                    np.array(logw, np.float64))
        return cls(start, root, tree, list(acc), bonus, [float("nan") if p is None else float(p) for p in probs],
                   {k: float(v) for k, v in times.items()})


class Rounds(Sequence):
    """A generation's RoundTraces, built on first use: ``Rounds(n, make)`` is a sequence of n rounds whose list
    ``make()`` returns when one is first read (then kept). The decode loops copy their device records to the host
    when a generation ends and leave the Python objects (~8 us a round) to whoever reads them, so a generation's
    wall time does not include them. Reads like a list: len, indexing, slices, iteration, == against a list.
    Example: r = Rounds(2, lambda: [a, b]); len(r) -> 2 (nothing built yet); r[-1] -> b."""

    def __init__(self, n: int, make):
        self._n, self._make, self._items = n, make, None

    def _list(self) -> list:
        if self._items is None:
            self._items = list(self._make())
            self._make = None
            if len(self._items) != self._n:
                raise RuntimeError(f"Rounds: built {len(self._items)} rounds, expected {self._n}")
        return self._items

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        return self._list()[i]

    def __iter__(self):
        return iter(self._list())

    def __eq__(self, other):
        return self._list() == list(other) if isinstance(other, Sequence) and not isinstance(other, str) \
            else NotImplemented

    def __repr__(self) -> str:
        return f"Rounds({self._list()!r})" if self._items is not None else f"Rounds({self._n} rounds, not yet built)"

    def __reduce__(self):
        return list, (self._list(),)                # pickled (or deep-copied) as the plain list it builds


@dataclasses.dataclass
class Generation:
    """Result of ``kd.generate``. ``tokens``: the new tokens only; ``target_forwards``: target passes including the
    prefill; ``rounds``: DDTree rounds (empty for autoregressive decoding); ``seconds``: wall time after prefill."""
    prompt: list[int]
    tokens: list[int]
    rounds: Sequence[RoundTrace]          # a list, or Rounds (built on first use)
    target_forwards: int
    seconds: float
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def acceptance_length(self) -> float:
        """tau: mean tokens the rounds added to the output per round, (len(tokens) - 1) / rounds - the first token
        comes from the prefill. The last round counts only what it emitted: its path may run past max_new_tokens
        or a stop token, verified but cut (until 2026-12-05 the whole path counted: 4-5 % more at 128 tokens, and
        tau 7 for a 2-token generation). NaN for autoregressive decoding. Example: 1 + 5 + 4 tokens in 2 rounds,
        the second round's path 6 long but cut at max_new_tokens 10 -> tau (10 - 1) / 2 = 4.5 (``round_tokens``
        [5, 4])."""
        return (len(self.tokens) - 1) / len(self.rounds) if self.rounds else float("nan")

    @property
    def round_tokens(self) -> list[int]:
        """Tokens each round added to the output: its ``accept_length``, the last round's cut to what it emitted
        (``acceptance_length`` is their mean). Example: paths of 6 and 6 tokens, 10 tokens in all -> [6, 3]."""
        lens = [r.accept_length for r in self.rounds]
        if lens:
            lens[-1] = len(self.tokens) - 1 - sum(lens[:-1])
        return lens

    @property
    def forwards_per_token(self) -> float:
        return self.target_forwards / max(len(self.tokens), 1)

    @property
    def tokens_per_second(self) -> float:
        return len(self.tokens) / self.seconds if self.seconds > 0 else float("inf")

    def stage_totals(self) -> dict[str, float]:
        """Milliseconds spent per stage over all rounds."""
        return {s: float(sum(r.times.get(s, 0.0) for r in self.rounds)) for s in STAGES}

    def to_json(self, path=None) -> str:
        text = json.dumps({"prompt": self.prompt, "tokens": self.tokens, "target_forwards": self.target_forwards,
                           "seconds": self.seconds, "settings": self.settings,
                           "rounds": [r.to_dict() for r in self.rounds]})
        if path is not None:
            write_text_atomic(path, text)                 # the old file or the whole new one, never half of it
        return text

    @classmethod
    def from_json(cls, text_or_path: str) -> "Generation":
        """A generation from ``to_json``'s text or a file holding it; every field is checked (``TraceError``, a
        ValueError, naming the file, the round and field, the value and what was expected)."""
        if isinstance(text_or_path, os.PathLike):
            text_or_path = os.fspath(text_or_path)
        text = text_or_path
        where = "trace"
        if not isinstance(text_or_path, str) or not text_or_path.strip():
            raise TraceError(f"trace: expected JSON text or a file path, got {text_or_path!r}")
        if not text_or_path.lstrip().startswith("{"):
            where = f"trace {text_or_path}"
            with open(text_or_path, "rb") as f:
                raw = f.read()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise TraceError(f"{where}: not a kdtree_numba trace (byte {e.start} is not UTF-8 text)") from None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as e:
            raise TraceError(f"{where}: not a kdtree_numba trace (not JSON: {e.msg} at line {e.lineno})") from None
        except RecursionError:
            raise TraceError(f"{where}: not a kdtree_numba trace (JSON nested too deeply)") from None
        if not isinstance(d, dict):
            raise TraceError(f"{where}: got a JSON {type(d).__name__}, expected an object (a kdtree_numba trace)")

        def bad(field, value, expected):
            return TraceError(f"{where}: {field}: got {short_repr(value)}, expected {expected}")

        for field in ("prompt", "tokens", "rounds", "target_forwards", "seconds"):
            if field not in d:
                raise TraceError(f"{where}: no {field} field, expected prompt, tokens, rounds, target_forwards and "
                                 f"seconds (not a kdtree_numba trace?)")
        for field in ("prompt", "tokens"):
            if not (isinstance(d[field], list) and all(is_int(x) and 0 <= x < 2 ** 31 for x in d[field])):
                raise bad(field, d[field], "a list of token ids")
        if not (is_int(d["target_forwards"]) and d["target_forwards"] >= 0):
            raise bad("target_forwards", d["target_forwards"], "an integer >= 0")
        if not (is_num(d["seconds"]) and 0 <= d["seconds"] < math.inf):
            raise bad("seconds", d["seconds"], "a number of seconds (finite, >= 0)")
        settings = d.get("settings", {})
        if not isinstance(settings, dict):
            raise bad("settings", settings, "an object")
        for key in ("model", "method", "drafter"):
            if key in settings and not isinstance(settings[key], str):
                raise bad(f"settings.{key}", settings[key], "a string")
        if not isinstance(d["rounds"], list):
            raise bad("rounds", d["rounds"], "a list of rounds")
        rounds = [RoundTrace.from_dict(r, f"{where}: rounds[{i}]") for i, r in enumerate(d["rounds"])]
        return cls(list(d["prompt"]), list(d["tokens"]), rounds, d["target_forwards"], float(d["seconds"]),
                   dict(settings))
