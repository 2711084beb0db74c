"""benchmarks/tree_surrogate.py: its round simulation is DDTree's (the engine's heap, the acceptance walk), the
Platt fit recovers known parameters, bad arguments are one line. (The measurement itself needs the corpus and
torch: docs/PERFORMANCE.md has its numbers.)"""
import os
import subprocess
import sys

import numpy as np
import pytest

BENCH = os.path.join(os.path.dirname(__file__), "..", "benchmarks")
sys.path.insert(0, BENCH)

import tree_surrogate as ts  # noqa: E402
from kdtree_numba.kernels.tree_accept import walk_ref  # noqa: E402
from kdtree_numba.kernels.tree_build import build_tree_ref  # noqa: E402


def _draft(rng, L=5, K=4, vocab=3):
    """Sorted log-probs [L, K] and ids drawn from a tiny vocabulary (so that paths often match)."""
    lp = np.sort(np.log(rng.dirichlet(np.ones(K), size=L)), axis=1)[:, ::-1].astype(np.float32)
    return np.ascontiguousarray(lp), rng.integers(0, vocab, (L, K)).astype(np.int32)


def test_accepted_length_is_the_walk_of_a_target_that_writes_the_labels():
    """The target's choice at a node of depth d is the text's token d + 1: the engine's walk then commits exactly
    accepted_length tokens (its path incl. the root, the bonus counted by the root)."""
    rng = np.random.default_rng(0)
    lengths = set()
    for _ in range(300):
        lp, ids = _draft(rng)
        budget = int(rng.integers(1, 12))
        labels = rng.integers(0, 3, 5)
        tree = build_tree_ref(lp, ids, budget)
        chosen = np.array([labels[0]] + [labels[d] if d < 5 else 0 for d in tree.depths], np.int64)
        path, _ = walk_ref(chosen, tree.tokens, tree.parents[1:], tree.n)
        assert ts.accepted_length(tree, labels) == len(path)
        lengths.add(len(path))
    assert len(lengths) >= 4                                             # the cases covered several lengths


def test_simulate_jumps_by_the_accepted_length():
    """A drafter whose top-1 is always the text's token: every round commits L + 1 tokens (budget >= L); one whose
    depth-1 guess is always wrong: 1 token a round."""
    L, K, A = 4, 2, 12
    labels = np.arange(A * L).reshape(A, L) % 7 + 1                     # [A, L]
    ids = np.zeros((A, L, K), np.int32)
    ids[:, :, 0] = labels
    scores = np.tile(np.log(np.array([0.9, 0.1], np.float32)), (A, L, 1))
    assert ts.simulate(scores, ids, labels, budget=L) == (3 * (L + 1), 3)              # rounds at anchors 0, 5, 10
    wrong = ids.copy()
    wrong[:, 0, :] = 0                                                 # no depth-1 candidate is right
    assert ts.simulate(scores, wrong, labels, budget=8) == (A, A)
    assert ts.tau(scores[None], ids[None], labels[None], [0], budget=L) == pytest.approx(L + 1)


def test_prefix_top1():
    ranks = np.array([[0, 0, 3, 0], [2, 0, 0, 0]])
    assert ts.prefix_top1(ranks).tolist() == [[True, True, True, False], [True, False, False, False]]


def test_by_offset_bands_the_chain_length_by_root_offset():
    ranks = np.zeros((2, 5, 3), np.int32)                                              # 2 texts, 5 anchors, L 3
    ranks[0, 0] = [0, 0, 3]                                                            # chain 3
    ranks[1, 0] = [1, 0, 0]                                                            # chain 1, depth 1 wrong
    ranks[:, 4] = [0, 2, 0]                                                            # chain 2
    bands = ts.by_offset(ranks, band=2)
    assert [b["offsets"] for b in bands] == [[0, 1], [2, 3], [4, 4]]
    assert bands[0]["chain"] == (3 + 4 + 1 + 4) / 4 and bands[0]["acc1"] == 0.75
    assert bands[1]["chain"] == 4 and bands[2]["chain"] == 2 and bands[2]["acc1"] == 1


def test_fit_platt_recovers_known_parameters():
    """Candidates right with probability sigmoid(2 logit(p) + 0.5): the fit finds (2, 0.5) at every depth, and the
    scores it gives are monotone in p (the heap's sibling order stays the rank order)."""
    rng = np.random.default_rng(1)
    N, A, L, K = 40, 50, 2, 8
    p = np.sort(rng.dirichlet(np.full(K, 0.5), size=(N, A, L)), axis=-1)[..., ::-1]
    lp = np.log(np.clip(p, 1e-6, 1)).astype(np.float32)
    q = 1 / (1 + np.exp(-(2 * ts._logit(p) + 0.5)))
    q = q / q.sum(-1, keepdims=True) * np.minimum(q.sum(-1, keepdims=True), 1)   # at most one right candidate
    u = rng.random((N, A, L, 1))
    ranks = np.where(u < q.sum(-1, keepdims=True), (u > np.cumsum(q, -1)).sum(-1, keepdims=True), K)[..., 0]
    ab = ts.fit_platt(lp, ranks)
    assert ab.shape == (L, 2) and np.allclose(ab[0], [2.0, 0.5], atol=0.3)
    s = ts.platt_scores(lp, ab)
    assert (np.diff(s, axis=-1) <= 1e-12).all()


def test_bad_arguments_are_one_line(tmp_path):
    script = os.path.join(BENCH, "tree_surrogate.py")
    for argv in (["--data", str(tmp_path)], ["--data", str(tmp_path), "--budgets", "0"]):
        r = subprocess.run([sys.executable, script, *argv], capture_output=True, text=True, timeout=300)
        assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_anchor_table_and_policies():
    """The small tree is the big one's first pops: it never commits more, and the mass is what the big tree adds;
    a policy's walk jumps by the chosen tree's tokens; the oracle takes the big tree exactly where it gains."""
    rng = np.random.default_rng(2)
    A, L, K = 30, 5, 4
    draws = [_draft(rng, L, K) for _ in range(A)]
    scores, ids = np.stack([d[0] for d in draws]), np.stack([d[1] for d in draws])
    labels = rng.integers(0, 3, (A, L))
    t = ts.anchor_table(scores, ids, labels, 3, 9)                                   # [A, 3]
    assert (t[:, 1] <= t[:, 0]).all() and (t[:, 1] < t[:, 0]).any()
    for a in range(A):
        logw = build_tree_ref(scores[a], ids[a], 9).logw
        assert t[a, 2] == pytest.approx(np.exp(logw[3:]).sum())
    assert ts.walk_policy(t, -np.inf)[:2] == ts.simulate(scores, ids, labels, 9)     # always big = DDTree-9
    assert ts.walk_policy(t, np.inf)[:2] == ts.simulate(scores, ids, labels, 3)      # always small = DDTree-3
    tok, rounds, bigs = ts.walk_policy(t, None)
    assert tok >= A and 0 < bigs < rounds                                           # the last round may overshoot
    table = np.array([[3, 1, .9], [2, 2, .1], [1, 1, .5]])
    assert ts.walk_policy(table, 0.5) == (3, 1, 1)                                   # the docstring's example
    assert ts.walk_policy(table, 0.95) == (3, 2, 0)                                  # small: 1 + 2 tokens


def test_adaptive_verify_model():
    """With free big rounds the big tree is as fast as its tau; the oracle never loses to always-big; the modelled
    speed is tau over the chain's, times the round-time ratio."""
    rng = np.random.default_rng(3)
    A, L, K = 40, 5, 4
    tables = []
    for _ in range(4):
        draws = [_draft(rng, L, K) for _ in range(A)]
        tables.append(ts.anchor_table(np.stack([d[0] for d in draws]), np.stack([d[1] for d in draws]),
                                      rng.integers(0, 3, (A, L)), 2, 8))
    r = ts.adaptive_verify(tables, [0, 2], [1, 3], chain_tau=1.5, round_ms=(1.0, 0.0, 0.0))
    assert r["big"][2] == pytest.approx(r["big"][0] / 1.5) and r["big"][1] == 1 and r["small"][1] == 0
    assert r["oracle"][0] == pytest.approx(r["big"][0])                              # the oracle loses no token
    costly = ts.adaptive_verify(tables, [0, 2], [1, 3], chain_tau=1.5, round_ms=(1.0, 0.0, 1.0))
    assert costly["big"][2] == pytest.approx(costly["big"][0] / 1.5 / 2)             # a big round costs twice
    assert costly["oracle"][2] >= costly["big"][2]


def test_round_ms_is_checked():
    assert ts.ms_list("0.6,0.01,0.05") == (0.6, 0.01, 0.05)
    for bad in ("0.6,0.01", "0,0.1,0.2", "a,b,c", "0.6,-1,0.05"):
        with pytest.raises(ts.argparse.ArgumentTypeError, match="CHAIN,E_SMALL,E_BIG"):
            ts.ms_list(bad)
