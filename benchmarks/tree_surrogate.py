"""How good is DDTree's surrogate? Simulated acceptance of the shipped pair with other node scores - CPU, torch.

DDTree picks the ``budget`` prefixes with the largest surrogate weight, the sum of the drafter's per-depth
log-probabilities along the path (the product of its marginals). The acceptance of a tree only depends on whether
the target's greedy continuation is one of its paths, so on a fixed text it can be simulated round by round
without the target: the round's root at position a, the drafter's top-K of depths 1..L from the anchored-block
pass (the training forward, ``dflash_torch``), the tree built by the engine's reference heap
(``tree_build.build_tree_ref``), the accepted length = 1 + the deepest node on the text's path, the next round at
a + accepted. That is exactly what greedy DDTree decoding commits (the drafter's context is the committed text's
target features either way).

Text: held-out corpus prompts only (never HumanEval) - every site of the corpus VALIDATION split where a ``def``
signature is followed by its docstring (``train/docstring_prompts.py``: prompts that end like a HumanEval prompt),
``--prompt-tokens`` long, continued greedily by the target for ``--new-tokens``. The prompts are split in two
halves by index parity: scores with fitted parameters are fitted on the even half and reported on the odd half.

Scores compared at each budget (the ratio is against the surrogate on the same rounds):

    surrogate    lp[d][r] (the paper's tree)
    temperature  log_softmax(logits / T)[d][r], the T of the grid that is best on the fit half
    calibrated   log sigmoid(a_d logit(p) + b_d), p = exp(lp): a per-depth Platt fit of P(rank r at depth d is the
                 text's token | the text's depths < d were all the drafter's top-1) on the fit half - what a
                 path's acceptance probability is, if the depths were independent given a correct prefix
    K = B/2, B/4 the surrogate with fewer candidates per depth (the top-K stage sorts K = budget)

Also printed: the drafter's top-1 accuracy per depth, marginal and given a correct prefix, and its calibration
(mean p against how often the candidate is right) on the whole set; and by how far into the continuation a round's
root lies (``--new-tokens 448`` shows it best): the chain's accepted length if a round started at every position
of a band - the target's greedy text turns repetitive after ~100 tokens, so the first band is where the rounds
are (and where a drafter's training text should be; ``train drafter --regen-anchors``).

An adaptive verify (``--adaptive 15,32``, issue 13): every round builds the BIG tree, and verifies it whole only
when the surrogate mass of its nodes past the first SMALL (sum of their path probabilities: what the drafter
expects them to add) exceeds a threshold - else its first SMALL nodes, a SMALL + 1-row verify (15 nodes: the
chain's 16 rows, the shapes where cuBLAS's 16-row kernels run). Simulated exactly (each policy's own rounds),
the threshold fitted on the fit half, and modelled: a round costs the chain's round plus E_SMALL or E_BIG ms
(``--round-ms``; defaults 0.705, 0.019, 0.067: the wall time a round of the chain, DDTree-15 and DDTree-32 took
on an H100 - ab_replay's tokens/s on HumanEval/0-11 divided into their tau, prefill share included -
docs/PERFORMANCE.md, thirty-seventh session). Printed against the
chain: always SMALL, always BIG, adaptive, and the oracle that takes BIG exactly where it commits more.

    python benchmarks/tree_surrogate.py --data CORPUS_DIR [--drafter DIR] [--budgets 16,32,64] [--prompts N]
    python benchmarks/tree_surrogate.py --data CORPUS_DIR --budgets 32 --adaptive 15,32 [--round-ms 0.705,0.019,0.067]

CORPUS_DIR: ``python -m kdtree_numba.train corpus --out CORPUS_DIR`` (tokens.npy; the validation split is its
last 1 %). ~2 minutes on two CPU cores for the 134 sites of the shipped corpus. Writes
``$OUT/tree_surrogate.json`` (or ./bench_results/).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

os.environ.setdefault("KDTREE_BACKEND", "numpy")        # the tree build's reference; no GPU needed
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _common as C  # noqa: E402
from kdtree_numba.argtypes import OneLineParser, whole, whole_list  # noqa: E402
from kdtree_numba.kernels.tree_accept import walk_ref  # noqa: E402
from kdtree_numba.kernels.tree_build import build_tree_ref  # noqa: E402

TEMPERATURES = (0.6, 0.7, 0.8, 0.9, 1.0, 1.15, 1.3)


def ms_list(text: str) -> tuple:
    """--round-ms: three non-negative milliseconds. Example: "0.6,0.01,0.05" -> (0.6, 0.01, 0.05)."""
    try:
        v = tuple(float(x) for x in text.split(","))
    except ValueError:
        v = ()
    if len(v) != 3 or not all(np.isfinite(x) and x >= 0 for x in v) or v[0] == 0:
        raise argparse.ArgumentTypeError(f"expected CHAIN,E_SMALL,E_BIG in ms (three numbers >= 0, CHAIN > 0), "
                                         f"got {text!r}")
    return v


# ------------------------------------------------------------------------------------------------ simulation
def accepted_length(tree, labels) -> int:
    """Tokens a round commits when the target's continuation is ``labels [L]`` (labels[d - 1] at depth d): the
    engine's own walk (``tree_accept.walk_ref``) with the target choosing labels[d] after a node of depth d - its
    path incl. the root, the bonus counted by the root (1 + the deepest tree node on the text's path)."""
    L = len(labels)
    chosen = np.array([labels[0]] + [labels[d] if d < L else 0 for d in tree.depths], np.int64)   # [1 + n]
    # (a node of depth L has no children: its choice is only the bonus, which the count does not need)
    path, _ = walk_ref(chosen, tree.tokens, tree.parents[1:], tree.n)
    return len(path)


def simulate(scores, ids, labels, budget: int, K: int | None = None) -> tuple[int, int]:
    """Greedy DDTree over one text: rounds from anchor 0, each building the tree of ``scores[a] [L, K]`` (any
    per-(depth, rank) score, non-increasing along K) and jumping by its accepted length -> (tokens, rounds).

    scores, ids [A, L, K] for the anchors 0..A-1 of the text; labels [A, L] the text's next L tokens."""
    a = tokens = rounds = 0
    A = len(labels)
    while a < A:
        s, i = (scores[a], ids[a]) if K is None else (scores[a][:, :K], ids[a][:, :K])
        n = accepted_length(build_tree_ref(s, i, budget), labels[a])
        tokens, rounds, a = tokens + n, rounds + 1, a + n
    return tokens, rounds


def tau(scores, ids, labels, rows, budget: int, K: int | None = None) -> float:
    """Mean tokens a round over the texts ``rows`` (total tokens / total rounds, as the eval reports tau)."""
    t = r = 0
    for i in rows:
        a, b = simulate(scores[i], ids[i], labels[i], budget, K)
        t, r = t + a, r + b
    return t / r


def anchor_table(scores, ids, labels, small: int, big: int) -> np.ndarray:
    """For every anchor a of one text, a round rooted there: [A, 3] = (tokens it commits with the ``big``-node tree,
    with the ``small``-node tree, the surrogate mass of the big tree's nodes small + 1 .. big, sum of exp(logw)).
    The small tree is the big one's first ``small`` pops (best-first), so the mass is what the big tree adds."""
    out = np.zeros((len(labels), 3))
    for a in range(len(labels)):
        tree = build_tree_ref(scores[a], ids[a], big)
        out[a] = (accepted_length(tree, labels[a]), accepted_length(build_tree_ref(scores[a], ids[a], small),
                                                                    labels[a]), np.exp(tree.logw[small:]).sum())
    return out


def walk_policy(table, threshold: float | None) -> tuple[int, int, int]:
    """Greedy DDTree over one text whose rounds verify the big tree when its extra mass exceeds ``threshold``
    (None: only where the big tree commits more - the oracle), else the small one -> (tokens, rounds, big
    rounds). ``table`` from ``anchor_table``. Example: table [[3, 1, .9], [2, 2, .1], [1, 1, .5]] (A = 3),
    threshold 0.5 -> the big tree at anchor 0 (3 tokens), done: (3, 1, 1)."""
    a = tokens = rounds = bigs = 0
    while a < len(table):
        t_big, t_small, mass = table[a]
        big = t_big > t_small if threshold is None else mass > threshold
        n = int(t_big if big else t_small)
        tokens, rounds, bigs, a = tokens + n, rounds + 1, bigs + int(big), a + n
    return tokens, rounds, bigs


def adaptive_verify(tables, fit, held, chain_tau: float, round_ms) -> dict:
    """The adaptive verify's modelled speed against the chain on the texts ``held``: a round costs the chain's
    round_ms[0] plus round_ms[1] (the small tree) or round_ms[2] (the big one); speed = tau / round time. The mass
    threshold is the one of ``tables``' mass quantiles (5 % .. 95 %) that is fastest on the texts ``fit``.
    -> {policy: (tau, share of big rounds, speed / the chain's)} for "small", "big", "adaptive", "oracle"."""
    chain, e_small, e_big = round_ms

    def run(rows, threshold):
        t = r = b = 0
        for i in rows:
            x, y, z = walk_policy(tables[i], threshold)
            t, r, b = t + x, r + y, b + z
        share = b / r
        return t / r, share, (t / r) / chain_tau * chain / (chain + e_small + share * (e_big - e_small))

    masses = np.concatenate([tables[i][:, 2] for i in fit])
    best = max((float(np.quantile(masses, q)) for q in np.linspace(0.05, 0.95, 19)), key=lambda th: run(fit, th)[2])
    return {"small": run(held, np.inf), "big": run(held, -np.inf), "adaptive": run(held, best),
            "oracle": run(held, None), "threshold": best}


def prefix_top1(ranks) -> np.ndarray:
    """[..., L] bool: the text's tokens at depths < d were all the drafter's top-1 (True at depth 1)."""
    ok = np.cumprod(ranks == 0, axis=-1).astype(bool)
    return np.concatenate([np.ones_like(ok[..., :1]), ok[..., :-1]], axis=-1)


def by_offset(ranks, band: int = 32) -> list:
    """Per band of ``band`` anchors (root offsets into the continuation): the mean chain length 1 + the number of
    leading depths where the text's token is the drafter's top-1, and the depth-1 top-1 accuracy.

    ranks [N, A, L] -> [{"offsets": [lo, hi], "chain": float, "acc1": float}, ...]; e.g. ranks of one anchor
    [[[0, 0, 3]]] -> chain 3 (the bonus + two depths), acc1 1.0."""
    run = np.cumprod(ranks == 0, axis=-1).sum(-1)                                       # [N, A]
    return [{"offsets": [lo, min(lo + band, ranks.shape[1]) - 1], "chain": float(1 + run[:, lo:lo + band].mean()),
             "acc1": float((ranks[:, lo:lo + band, 0] == 0).mean())} for lo in range(0, ranks.shape[1], band)]


def _logit(p):
    p = np.clip(p, 1e-7, 1 - 1e-7)
    return np.log(p) - np.log1p(-p)


def fit_platt(lp, ranks, ranks_fit: int = 8, iters: int = 50) -> np.ndarray:
    """Per-depth (a_d, b_d) of P(candidate right | correct prefix) = sigmoid(a_d logit(p) + b_d) by Newton's
    method on the candidates of ranks < ``ranks_fit`` at every depth whose prefix was the top-1 chain.

    lp [N, A, L, K] log-probs, ranks [N, A, L] the text's rank (K: not in the top-K)  ->  [L, 2]."""
    L = lp.shape[2]
    p = np.exp(lp[..., :ranks_fit].astype(np.float64))                                 # [N, A, L, R]
    right = ranks[..., None] == np.arange(ranks_fit)
    use = np.broadcast_to(prefix_top1(ranks)[..., None], p.shape)
    out = np.zeros((L, 2))
    for d in range(L):
        x, y = _logit(p[:, :, d][use[:, :, d]]), right[:, :, d][use[:, :, d]].astype(np.float64)
        X = np.stack([x, np.ones_like(x)], 1)
        w = np.array([1.0, 0.0])
        for _ in range(iters):
            s = 1 / (1 + np.exp(-(X @ w)))
            H = (X * (s * (1 - s))[:, None]).T @ X + 1e-6 * np.eye(2)
            w -= np.linalg.solve(H, X.T @ (s - y))
        out[d] = w
    return out


def platt_scores(lp, ab) -> np.ndarray:
    """log sigmoid(a_d logit(exp(lp)) + b_d): lp [..., L, K], ab [L, 2] -> [..., L, K] (monotone in lp)."""
    z = ab[:, 0, None] * _logit(np.exp(lp.astype(np.float64))) + ab[:, 1, None]
    return -np.logaddexp(0.0, -z)


# ------------------------------------------------------------------------------------------------ data
def collect(data_dir: str, target_dir: str, drafter_dir: str, K: int, prompt_tokens: int, new_tokens: int,
            max_prompts: int | None, temperatures=TEMPERATURES) -> dict:
    """Held-out texts and the drafter's top-K at every anchor: lp [T, N, A, L, K] (one per temperature), ids
    [N, A, L, K], labels [N, A, L], ranks [N, A, L] (K when the text's token is not in the top-K)."""
    import torch

    from kdtree_numba.train import dflash_torch as dfl
    from kdtree_numba.train import docstring_prompts as dsp
    from kdtree_numba.train import drafter_train as dt
    from kdtree_numba.train import target_train as tt

    data = tt.TokenData(data_dir)
    tok = dsp.load_tokenizer(data_dir, target_dir)
    sites, _ = dsp.find_sites(data.val, tok, prompt_tokens)
    if max_prompts is not None:
        sites = sites[:max_prompts]
    if not len(sites):
        raise ValueError(f"--data {data_dir}: no docstring sites in the validation split for "
                         f"{prompt_tokens}-token prompts")
    prompts = dsp.prompts_at(data.val, sites, prompt_tokens, dsp.newline_id(tok))       # [N, P]
    dev = torch.device("cpu")
    target = dt.load_frozen_target(target_dir, dev)
    t0 = time.perf_counter()
    seqs, _ = dt.regenerate(target, prompts, new_tokens, 64, dev)                       # [N, P + new]
    t_regen = time.perf_counter() - t0
    drafter = dfl.DFlashDraftModel.from_pretrained(drafter_dir).eval()
    bs = drafter.config.block_size
    feats = dt.TargetFeatures(target, drafter.config.target_layer_ids)
    embed, head = target.model.embed_tokens.weight, target.lm_head.weight
    anchors = np.arange(prompt_tokens, seqs.shape[1] - bs + 1)                          # roots of the rounds
    N, A, L = len(seqs), len(anchors), bs - 1
    out = {"lp": np.zeros((len(temperatures), N, A, L, K), np.float32), "ids": np.zeros((N, A, L, K), np.int32),
           "labels": np.zeros((N, A, L), np.int32), "ranks": np.zeros((N, A, L), np.int32)}
    anc = torch.from_numpy(anchors[None])
    with torch.no_grad():
        for n in range(N):
            ids = torch.from_numpy(seqs[n:n + 1])
            logits = drafter(feats(ids), ids, anc, embed, head)[0].float()              # [A, L, V]
            labels = dfl.block_labels(ids, anc, bs)[0]                                  # [A, L]
            top = logits.topk(K, dim=-1)
            for j, T in enumerate(temperatures):
                out["lp"][j, n] = (top.values / T - torch.logsumexp(logits / T, -1, keepdim=True)).numpy()
            hit = top.indices == labels[..., None]
            out["ids"][n], out["labels"][n] = top.indices.numpy(), labels.numpy()
            out["ranks"][n] = torch.where(hit.any(-1), hit.int().argmax(-1), K).numpy()
    feats.remove()
    out.update(temperatures=list(temperatures), prompts=int(N), anchors=int(A), regen_seconds=t_regen,
               collect_seconds=time.perf_counter() - t0)
    return out


def accuracy_tables(lp, ranks) -> dict:
    """Per depth: top-1 accuracy and the mean top-1 p, marginal and given a top-1 prefix; calibration bins of p
    for the candidates of ranks < 8 given a top-1 prefix."""
    pre = prefix_top1(ranks)
    p1 = np.exp(lp[..., 0].astype(np.float64))
    depth = [{"depth": d + 1, "acc": float((ranks[..., d] == 0).mean()), "p_top1": float(p1[..., d].mean()),
              "acc_given_prefix": float((ranks[..., d][pre[..., d]] == 0).mean()),
              "p_top1_given_prefix": float(p1[..., d][pre[..., d]].mean()), "n_given_prefix": int(pre[..., d].sum())}
             for d in range(ranks.shape[-1])]
    p = np.exp(lp[..., :8].astype(np.float64))
    right = ranks[..., None] == np.arange(8)
    use = np.broadcast_to(pre[..., None], p.shape)
    bins = []
    for lo, hi in ((0, .02), (.02, .1), (.1, .35), (.35, .6), (.6, .85), (.85, .95), (.95, 1.01)):
        m = use & (p >= lo) & (p < hi)
        if m.any():
            bins.append({"p": [lo, min(hi, 1.0)], "mean_p": float(p[m].mean()), "right": float(right[m].mean()),
                         "n": int(m.sum())})
    return {"depth": depth, "calibration": bins}


# ------------------------------------------------------------------------------------------------ main
def main(argv=None) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    model = os.path.join(here, "kdtree_numba", "default_model")
    p = OneLineParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="corpus directory (tokens.npy, tokenizer.json)")
    p.add_argument("--target", default=os.path.join(model, "target"))
    p.add_argument("--drafter", default=os.path.join(model, "drafter"))
    p.add_argument("--budgets", type=whole_list(1), default=(16, 32, 64))
    p.add_argument("--prompts", type=whole(1), default=None, help="the first N sites only (default all)")
    p.add_argument("--prompt-tokens", type=whole(2), default=128)
    p.add_argument("--new-tokens", type=whole(17), default=128)
    p.add_argument("--adaptive", type=whole_list(1), metavar="SMALL,BIG", default=None,
                   help="also model a verify that takes the SMALL- or the BIG-node tree each round (both budgets)")
    p.add_argument("--round-ms", type=ms_list, metavar="CHAIN,E_SMALL,E_BIG", default=(0.705, 0.019, 0.067),
                   help="--adaptive's cost model: the chain's round and what a SMALL / BIG tree adds, in ms "
                        "(default 0.705,0.019,0.067: docs/PERFORMANCE.md, thirty-seventh session)")
    a = p.parse_args(argv)
    if a.adaptive is not None and (len(a.adaptive) != 2 or a.adaptive[0] >= a.adaptive[1]):
        p.error(f"--adaptive: expected two budgets SMALL,BIG with SMALL < BIG, got {a.adaptive}")
    for flag, path, need in (("--data", a.data, "tokens.npy"), ("--target", a.target, "config.json"),
                             ("--drafter", a.drafter, "model.safetensors")):
        if not os.path.isfile(os.path.join(path, need)):
            p.error(f"{flag} {path}: no {need} there")
    K = max(list(a.budgets) + list(a.adaptive or []))
    try:
        z = collect(a.data, a.target, a.drafter, K, a.prompt_tokens, a.new_tokens, a.prompts)
    except ValueError as e:
        p.error(str(e))
    temps, lp, ids, labels, ranks = z["temperatures"], z["lp"], z["ids"], z["labels"], z["ranks"]
    base = lp[temps.index(1.0)]
    N = z["prompts"]
    fit, held = range(0, N, 2), range(1, N, 2)
    print(f"{N} held-out texts (corpus validation split, docstring-ended prompts of {a.prompt_tokens} tokens + "
          f"{a.new_tokens} greedy tokens), {z['anchors']} anchors each; collected in {z['collect_seconds']:.0f} s")
    ab = fit_platt(base[list(fit)], ranks[list(fit)])
    results = C.RESULTS
    results.update({"budgets": {}, "platt": ab.tolist(), **{k: z[k] for k in ("prompts", "anchors", "temperatures")},
                    "accuracy": accuracy_tables(base, ranks), "by_offset": by_offset(ranks), "fit_rows": "even",
                    "report_rows": "odd"})
    rows = []
    for B in a.budgets:
        t0 = time.perf_counter()
        best_T = max(temps, key=lambda T: tau(lp[temps.index(T)], ids, labels, fit, B))
        r = {"surrogate": tau(base, ids, labels, held, B), "chain": tau(base, ids, labels, held, B, K=1),
             f"temperature {best_T:g}": tau(lp[temps.index(best_T)], ids, labels, held, B),
             "calibrated": tau(platt_scores(base, ab), ids, labels, held, B)}
        for k in (B // 2, B // 4):
            if k >= 1:
                r[f"K = {k}"] = tau(base, ids, labels, held, B, K=k)
        results["budgets"][B] = {"tau": r, "best_temperature": best_T, "seconds": time.perf_counter() - t0}
        rows += [[B, name, f"{v:.3f}", f"{v / r['surrogate']:.3f}x"] for name, v in r.items()]
    C.table("simulated DDTree acceptance by node score", ["budget", "score", "tau (held-out half)", "vs surrogate"],
            rows)
    if a.adaptive is not None:
        small, big = a.adaptive
        tables = [anchor_table(base[i], ids[i], labels[i], small, big) for i in range(N)]
        res = adaptive_verify(tables, fit, held, tau(base, ids, labels, held, big, K=1), a.round_ms)
        results["adaptive"] = {"small": small, "big": big, "round_ms": list(a.round_ms), **res}
        C.table(f"a verify of {small} or {big} nodes a round (mass threshold {res['threshold']:.4f}, fitted on the "
                f"fit half; round ms: chain {a.round_ms[0]}, + {a.round_ms[1]} / + {a.round_ms[2]})",
                ["policy", "tau (held-out half)", "share of big rounds", "modelled speed vs the chain"],
                [[k, f"{res[k][0]:.3f}", f"{res[k][1]:.2f}", f"{res[k][2]:.3f}x"]
                 for k in ("small", "big", "adaptive", "oracle")])
    dep = results["accuracy"]["depth"]
    C.table("the drafter's top-1 accuracy per depth (all texts)", ["depth"] + [str(x["depth"]) for x in dep],
            [["top-1 acc"] + [f"{x['acc']:.2f}" for x in dep],
             ["given a top-1 prefix"] + [f"{x['acc_given_prefix']:.2f}" for x in dep],
             ["mean p(top-1) given it"] + [f"{x['p_top1_given_prefix']:.2f}" for x in dep]])
    C.table("calibration given a top-1 prefix (ranks < 8)", ["p", "mean p", "right", "candidates"],
            [[f"{b['p'][0]:g}-{b['p'][1]:g}", f"{b['mean_p']:.3f}", f"{b['right']:.3f}", b["n"]]
             for b in results["accuracy"]["calibration"]])
    C.table("the chain's accepted length by the root's offset into the continuation (all texts)",
            ["root offset", "chain length if a round started there", "depth-1 top-1 acc"],
            [[f"{b['offsets'][0]}-{b['offsets'][1]}", f"{b['chain']:.2f}", f"{b['acc1']:.3f}"]
             for b in results["by_offset"]])
    C.save("tree_surrogate")
    return 0


if __name__ == "__main__":
    sys.exit(main())
