"""What a generation returns: the new tokens, one RoundTrace per DDTree round, counts and stage times.

JSON round trip (``to_json`` / ``Generation.from_json``) backs ``--trace out.json`` and the ``trees`` command.
"""
from __future__ import annotations

import dataclasses
import json
import math

import numpy as np

from ..kernels.tree_build import Tree

STAGES = ("draft", "build", "verify", "accept", "compact")


@dataclasses.dataclass
class RoundTrace:
    """One DDTree round.

    start: committed tokens before the round (the root sits at position ``start``); root: the root token;
    tree: the draft tree (pop order); accepted: accepted node indices, root (0) first, ascending;
    bonus: the target's token after the last accepted node; draft_probs[d-1]: the draft's probability of the token
    the target chose at depth d = 1 .. len(accepted) (NaN when that token was outside the drafter's top-K);
    times: milliseconds per stage (draft / build / verify / accept / compact)."""
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
    def from_dict(cls, d: dict) -> "RoundTrace":
        tree = Tree(np.array(d["tokens"], np.int32), np.array(d["depths"], np.int32),
                    np.array(d["parents"], np.int32), np.array(d["logw"], np.float64))
        return cls(int(d["start"]), int(d["root"]), tree, [int(x) for x in d["accepted"]], int(d["bonus"]),
                   [float("nan") if p is None else float(p) for p in d["draft_probs"]],
                   {k: float(v) for k, v in d["times"].items()})


@dataclasses.dataclass
class Generation:
    """Result of ``kd.generate``. ``tokens``: the new tokens only; ``target_forwards``: target passes including the
    prefill; ``rounds``: DDTree rounds (empty for autoregressive decoding); ``seconds``: wall time after prefill."""
    prompt: list[int]
    tokens: list[int]
    rounds: list[RoundTrace]
    target_forwards: int
    seconds: float
    settings: dict = dataclasses.field(default_factory=dict)

    @property
    def acceptance_length(self) -> float:
        """tau: mean tokens committed per round (NaN for autoregressive decoding)."""
        return float(np.mean([r.accept_length for r in self.rounds])) if self.rounds else float("nan")

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
            with open(path, "w") as f:
                f.write(text)
        return text

    @classmethod
    def from_json(cls, text_or_path: str) -> "Generation":
        text = text_or_path
        if not text_or_path.lstrip().startswith("{"):
            with open(text_or_path) as f:
                text = f.read()
        try:
            d = json.loads(text)
            return cls([int(x) for x in d["prompt"]], [int(x) for x in d["tokens"]],
                       [RoundTrace.from_dict(r) for r in d["rounds"]], int(d["target_forwards"]),
                       float(d["seconds"]), dict(d.get("settings", {})))
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"trace: not a kdtree_numba trace ({type(e).__name__}: {e})") from None
