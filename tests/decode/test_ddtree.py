"""DDTree's output against plain decoding: greedy and sampled token for token (the same seed); and bad input."""
import math

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.decode.trace import STAGES
from kdtree_numba.kernels import tree_accept

CONFIGS = {
    "default": {},
    "kimi_like": dict(n_group=1, topk_group=1, q_lora_rank=None, rms_norm_eps=1e-5, rope_theta=50000.0,
                      rope_scaling={"factor": 32.0, "original_max_position_embeddings": 64, "beta_fast": 1.0,
                                    "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "truncate": True,
                                    "attention_factor": None}),
    "dense_wide_vocab": dict(first_k_dense_replace=2, num_hidden_layers=2, vocab_size=1000, n_shared_experts=0),
}
PROMPT = [3, 17, 99, 5, 42]


@pytest.fixture(scope="module")
def targets():
    with kd.backend.use("numpy"):
        return {name: kd.tiny_target(i, **kw) for i, (name, kw) in enumerate(CONFIGS.items())}


@pytest.fixture(scope="module")
def references(targets):
    with kd.backend.use("numpy"):
        return {name: kd.generate(t, PROMPT, 64).tokens for name, t in targets.items()}


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("budget", [0, 1, 4, 16, 64])
@pytest.mark.parametrize("drafter", ["oracle0", "oracle1", "oracle50", "random"])
def test_greedy_ddtree_equals_autoregressive(targets, references, config, budget, drafter, numpy_backend):
    target = targets[config]
    if drafter == "random":
        d = kd.RandomDrafter(target.config.vocab_size, depth=6, seed=1)
    else:
        d = kd.OracleDrafter(target, noise=float(drafter[6:]), seed=2, depth=6)
    res = kd.generate(target, PROMPT, 64, drafter=d, budget=budget)
    assert res.tokens == references[config]
    assert res.target_forwards == 1 + len(res.rounds)
    for r in res.rounds:                                  # the trace is self-consistent
        assert r.accepted[0] == 0 and r.tree.n <= budget
    emitted = [res.tokens[0]] + [t for r in res.rounds for t in r.accepted_tokens + [r.bonus]]
    assert emitted[:64] == res.tokens


@pytest.mark.parametrize("temperature", [0.6, 1.5])
@pytest.mark.parametrize("kw", [dict(budget=0), dict(budget=4), dict(budget=64), dict(chain=True)],
                         ids=["b0", "b4", "b64", "chain"])
def test_sampled_ddtree_equals_sampled_autoregressive(targets, temperature, kw, numpy_backend):
    """T > 0, same seed: DDTree and the chain emit plain decoding's tokens exactly, not only in distribution -
    every draw is keyed by the position it follows (sampling's module docstring), so a walked node draws what a
    decode step at its position draws. Noisy and random drafters shape the trees differently in every round."""
    t = targets["default"]
    for seed in (3, 11):
        want = kd.generate(t, PROMPT, 40, temperature=temperature, seed=seed).tokens
        for d in (kd.OracleDrafter(t, noise=1.0, seed=seed, depth=6), kd.RandomDrafter(t.config.vocab_size, 6, 4)):
            got = kd.generate(t, PROMPT, 40, drafter=d, temperature=temperature, seed=seed, **kw).tokens
            assert got == want, (seed, d.name)


def test_noise_zero_accepts_the_whole_greedy_chain_in_the_tree(targets, numpy_backend):
    """With noise 0 every round accepts every rank-0 node below the root that the tree holds: the most possible."""
    target = targets["default"]
    res = kd.generate(target, PROMPT, 48, drafter=kd.OracleDrafter(target, noise=0.0, depth=6), budget=64)
    for r in res.rounds:
        chain, node = [0], 0
        while True:                                       # follow the top-ranked child (the first one popped)
            kids = [j for j in range(1, r.tree.n + 1) if r.tree.parents[j] == node]
            if not kids:
                break
            node = kids[0]
            chain.append(node)
        assert r.accepted == chain
    assert res.acceptance_length > 4
    noisy = kd.generate(target, PROMPT, 48, drafter=kd.OracleDrafter(target, noise=2.0, depth=6), budget=64)
    assert noisy.acceptance_length < res.acceptance_length


def test_tree_beats_chain_and_budget_helps(targets, numpy_backend):
    t = targets["default"]
    mk = lambda: kd.OracleDrafter(t, noise=1.0, seed=3, depth=6)    # noqa: E731
    chain = kd.generate(t, PROMPT, 64, drafter=mk(), chain=True)
    small = kd.generate(t, PROMPT, 64, drafter=mk(), budget=4)
    big = kd.generate(t, PROMPT, 64, drafter=mk(), budget=128)
    assert chain.tokens == small.tokens == big.tokens
    assert big.acceptance_length > small.acceptance_length
    assert big.acceptance_length > chain.acceptance_length
    assert all(r.tree.n <= 6 for r in chain.rounds)


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty upper quantile of chi-square (z = 3.719: p = 1e-4)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def exact_three_token_probs(target, prompt, T):
    V = target.config.vocab_size

    def soft(x):
        p = np.exp((x - x.max()) / T)
        return p / p.sum()
    p = np.zeros((V, V, V))
    p1 = soft(target.logits(prompt)[-1].astype(np.float64))
    for a in range(V):
        la = target.logits(prompt + [a])
        p2 = soft(la[-1].astype(np.float64))
        for b in range(V):
            p3 = soft(target.logits(prompt + [a, b])[-1].astype(np.float64))
            p[a, b] = p1[a] * p2[b] * p3
    return p.ravel()


class SharedOracle(kd.Drafter):
    """``OracleDrafter(target, noise, seed, depth)``'s drafts without rerunning the target in every generation: an
    oracle's rows are the target's logits along its greedy continuation after ``context + [root]`` (a function of
    the context alone, computed once per context by one noise-free oracle and kept in ``rows``) plus this seed's
    noise, added as OracleDrafter adds it (``noise * row std * N(0, 1)`` from ``default_rng([seed, start])``).
    The rows equal a fresh oracle's up to float32 rounding (a context's logits computed in one chunk or token by
    token). The sampling test below runs thousands of 3-token generations over a 4-token vocabulary, which visit at
    most 20 (context, root) pairs: a fresh oracle per generation spent half of the test re-deriving their logits."""
    name = "oracle"

    def __init__(self, plain, rows, noise, seed):
        self.plain, self.rows, self.noise, self.seed = plain, rows, noise, seed
        self.depth, self.vocab_size = plain.depth, plain.vocab_size

    def draft(self, context, root):
        key = (tuple(int(x) for x in context), int(root))
        if key not in self.rows:
            self.rows[key] = np.asarray(self.plain.draft(context, root), np.float32)
        rows = self.rows[key]
        z = np.random.default_rng([self.seed, len(context)]).standard_normal(rows.shape).astype(np.float32)
        return rows + np.float32(self.noise) * rows.std(axis=1, keepdims=True) * z


@pytest.mark.slow
@pytest.mark.parametrize("method", ("ddtree", "autoregressive"))
def test_sampling_distribution_matches_autoregressive(method, numpy_backend):
    """T > 0: the first three tokens of DDTree and of plain sampling follow the target's exact distribution
    (chi-square goodness of fit, fixed seeds: deterministic).

    2500 generations per method, 64 cells (cells expected below 5 pooled): the critical value is chi-square's
    p = 1e-4 quantile (Wilson-Hilferty), so a correct sampler fails a given seed set with probability ~1e-4 per
    method. Each DDTree generation gets its own oracle draft (noise 1, seed s) as from ``OracleDrafter``;
    ``SharedOracle`` only shares the target's logits between generations (its rows checked against
    OracleDrafter's below; the 2500 generations emit the same tokens with either). Two layers (one dense, one
    MoE): the sampler sees only the logits, and with three the two methods took 81 s on a 2-core machine; this
    target spreads its mass wider (28 cells expected >= 5, against 25)."""
    target = kd.tiny_target(7, vocab_size=4, num_hidden_layers=2)
    prompt, T, runs = [1, 2, 3], 1.3, 2500
    expected = exact_three_token_probs(target, prompt, T) * runs
    keep = expected >= 5
    assert keep.sum() >= 20                                   # a spread distribution: most cells are tested
    plain, rows = kd.OracleDrafter(target, noise=0.0, depth=3), {}
    counts = np.zeros(64)
    for s in range(runs):
        d = SharedOracle(plain, rows, 1.0, s) if method == "ddtree" else None
        tree = {} if d is None else dict(budget=6)
        toks = kd.generate(target, prompt, 3, drafter=d, temperature=T, seed=s, **tree).tokens
        counts[toks[0] * 16 + toks[1] * 4 + toks[2]] += 1
    obs = np.append(counts[keep], counts[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    stat = float(((obs - exp) ** 2 / np.maximum(exp, 1e-9)).sum())
    assert stat < chi2_critical(len(obs) - 1), (method, stat)
    if method == "autoregressive":
        return
    assert len(rows) <= 4 + 16                                # first rounds' contexts + second rounds' at most
    for s, context, root in ((0, prompt, 2), (1, prompt + [0], 3), (2, prompt + [3, 1], 0)):
        want = kd.OracleDrafter(target, noise=1.0, seed=s, depth=3).draft(np.array(context), root)
        got = SharedOracle(plain, rows, 1.0, s).draft(np.array(context), root)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_sampling_is_reproducible_and_seed_dependent(targets, numpy_backend):
    t = targets["default"]
    run = lambda seed: kd.generate(t, PROMPT, 24, drafter=kd.OracleDrafter(t, noise=0.5, depth=4), budget=8,  # noqa
                                   temperature=0.9, seed=seed).tokens
    assert run(5) == run(5)
    assert run(5) != run(6)


def test_whole_generation_on_the_kernel_backend(kernel_backend):
    """DDTree end to end with every kernel on the process backend (the simulator in CI), vs the references."""
    with kd.backend.use("numpy"):
        ref_target = kd.tiny_target(1, num_hidden_layers=2, vocab_size=64, hidden_size=32, n_routed_experts=4,
                                    n_group=1, topk_group=1, num_attention_heads=2, kv_lora_rank=16, q_lora_rank=None)
        want = kd.generate(ref_target, [1, 2, 3], 7).tokens
    state = ref_target.state_dict()
    target = kd.Target.from_state_dict(ref_target.config, state)
    assert target.backend == kd.backend.process_name
    drafter = kd.OracleDrafter(ref_target, noise=0.3, depth=3)          # drafting on the references: fast
    res = kd.generate(target, [1, 2, 3], 7, drafter=drafter, budget=4)
    assert res.tokens == want
    assert res.rounds and all(set(r.times) == set(STAGES) for r in res.rounds)


def test_trace_round_trip(targets, numpy_backend, tmp_path):
    t = targets["default"]
    res = kd.generate(t, PROMPT, 20, drafter=kd.OracleDrafter(t, noise=0.5, depth=4), budget=8)
    again = kd.Generation.from_json(res.to_json(tmp_path / "trace.json"))
    assert again.tokens == res.tokens and len(again.rounds) == len(res.rounds)
    assert again.rounds[1].tree == res.rounds[1].tree and again.rounds[1].accepted == res.rounds[1].accepted
    assert all(0 < p <= 1 or math.isnan(p) for r in res.rounds for p in r.draft_probs)


class BadDrafter(kd.Drafter):
    def __init__(self, V, depth, shape=None, nan=False):
        self.vocab_size, self.depth, self.shape, self.nan = V, depth, shape, nan

    def draft(self, context, root):
        x = np.zeros(self.shape or (self.depth, self.vocab_size), np.float32)
        if self.nan:
            x[0, 0] = np.nan
        return x


@pytest.mark.parametrize("kwargs, msg", [
    (dict(budget=-1, drafter=kd.RandomDrafter(256, 4)), "budget: expected an integer >= 0"),
    (dict(budget=2.5, drafter=kd.RandomDrafter(256, 4)), "budget: expected an integer"),
    (dict(budget=True, drafter=kd.RandomDrafter(256, 4)), "budget: expected an integer"),
    (dict(budget=5000, drafter=kd.RandomDrafter(256, 4)), "budget: expected an integer <= 1024"),
    (dict(budget=8), r"budget: 8 does not apply without a drafter \(plain decoding builds no tree\)"),
    (dict(budget=8, drafter=kd.RandomDrafter(256, 4), chain=True), "budget: 8 does not apply with chain=True"),
    (dict(chain=True), "chain: chain=True drafts with a drafter, got drafter=None"),
    (dict(chain=1, drafter=kd.RandomDrafter(256, 4)), "chain: expected True or False, got 1"),
    (dict(prompt_ids="def f():"), r"prompt_ids: expected token ids, got a str \(encode text first"),
    (dict(temperature=-0.1), "temperature: expected a number >= 0"),
    (dict(temperature=float("nan")), "temperature: expected a number >= 0"),
    (dict(max_new_tokens=0), "max_new_tokens: expected an integer >= 1"),
    (dict(stop_tokens=5), r"stop_tokens: expected a collection of token ids \(e.g. \[0\] for one\), got 5"),
    (dict(stop_tokens="0"), "stop_tokens: expected a collection of token ids"),
    (dict(stop_tokens=np.array(1)), r"stop_tokens: expected a collection of token ids \(e.g. \[0\] for one\), "
                                    r"got array\(1\)"),
    (dict(stop_tokens={1: 2}), "stop_tokens: expected a collection of token ids"),
    (dict(progress=5, drafter=kd.RandomDrafter(256, 4)), r"progress: expected a function progress\(done, total\)"),
    (dict(prompt_ids=[]), "prompt_ids: expected at least one token"),
    (dict(prompt_ids=[1, 256]), "prompt_ids: token id 256 at index 1 is outside the vocabulary"),
    (dict(prompt_ids=[[1, 2]]), "prompt_ids: expected a 1-d sequence"),
    (dict(max_new_tokens=4092), "= 4097 exceeds the context limit of 4096"),
    (dict(drafter=BadDrafter(255, 4)), "drafter: vocabulary of 255 tokens does not match the target's 256"),
    (dict(drafter=BadDrafter(256, 0)), "drafter: depth 0 is not a positive integer"),
    (dict(drafter=BadDrafter(256, 4, shape=(3, 256))), r"drafter: returned draft logits of shape \(3, 256\), "
                                                        r"expected \(4, 256\)"),
    (dict(drafter=BadDrafter(256, 4, nan=True)), "drafter logits: row 0 contains NaN"),
    (dict(drafter="oracle"), "drafter: expected a kdtree_numba Drafter"),
])
def test_bad_arguments_raise_clear_errors(targets, kwargs, msg, numpy_backend):
    args = dict(prompt_ids=PROMPT, max_new_tokens=8)
    args.update(kwargs)
    with pytest.raises(ValueError, match=msg):
        kd.generate(targets["default"], **args)


def test_nan_target_logits_are_an_error(numpy_backend):
    t = kd.tiny_target(0)
    t.w["lm_head"][5, 0] = np.nan
    with pytest.raises(ValueError, match="NaN logits"):
        kd.generate(t, PROMPT, 4)
    with pytest.raises(ValueError, match="NaN logits"):
        kd.generate(t, PROMPT, 4, drafter=kd.RandomDrafter(256, 3), budget=4)
    assert tree_accept.walk_ref([-1, 2], [2], [0], 1) == (None, None)


def test_generate_runs_on_the_targets_backend():
    """A target built under use("numpy") decodes on the references even in a sim/cuda process."""
    seen = []

    class Spy(kd.RandomDrafter):
        def draft(self, context, root):
            seen.append(kd.backend.name)
            return super().draft(context, root)

    with kd.backend.use("numpy"):
        t = kd.tiny_target(2)
    kd.generate(t, PROMPT, 6, drafter=Spy(256, 3), budget=4)
    assert seen and set(seen) == {"numpy"}


@pytest.mark.parametrize("chain", [False, True])
def test_stop_token_inside_an_accepted_path_stops_like_plain_decoding(targets, chain, numpy_backend):
    """A stop token accepted mid-path (not only as the bonus) ends generation right after it, as plain decoding
    does. With noise 0 the oracle's whole chain is accepted, so stop tokens land inside accepted paths."""
    t = targets["default"]
    ref = kd.generate(t, PROMPT, 40).tokens
    for pos in (0, 1, 3, 4, 9, 20):
        stop = ref[pos]
        plain = kd.generate(t, PROMPT, 40, stop_tokens=[stop])
        assert plain.tokens == ref[:ref.index(stop) + 1]
        res = kd.generate(t, PROMPT, 40, drafter=kd.OracleDrafter(t, noise=0.0, depth=6), stop_tokens=[stop],
                          chain=chain, **({} if chain else dict(budget=8)))
        assert res.tokens == plain.tokens, (pos, stop)


def test_sampled_generation_ends_at_its_first_stop_token(targets, numpy_backend):
    """At T > 0 too: the output ends with the first stop token it contains, or runs to max_new_tokens without
    one - and, draws being keyed by position, it is plain decoding's sampled output cut there."""
    t = targets["default"]
    for seed in range(6):
        sample = kd.generate(t, PROMPT, 40, drafter=kd.OracleDrafter(t, noise=0.0, depth=6), budget=8,
                             temperature=0.8, seed=seed).tokens
        stop = sample[7]
        res = kd.generate(t, PROMPT, 40, drafter=kd.OracleDrafter(t, noise=0.0, depth=6), budget=8,
                          temperature=0.8, seed=seed, stop_tokens=[stop])
        assert res.tokens == sample[:sample.index(stop) + 1]
        assert res.tokens == kd.generate(t, PROMPT, 40, temperature=0.8, seed=seed, stop_tokens=[stop]).tokens


def test_stop_token_on_the_kernel_backend(kernel_backend):
    """The same on the simulator (or the GPU): tiny target, one stop token that lands inside an accepted path.

    One round is enough (the simulator runs every kernel of a round: about 20 s each): the first round
    accepts 3 drafts, the stop token is the second, so the third and the bonus must be dropped."""
    t = kd.tiny_target(5, num_hidden_layers=2, vocab_size=64)
    ref_t = t.with_backend("numpy") if kd.backend.name == "sim" else t       # the reference and the oracle
    prompt = [3, 17, 29]
    ref = kd.generate(ref_t, prompt, 10).tokens
    stop = ref[2]
    res = kd.generate(t, prompt, 10, drafter=kd.OracleDrafter(ref_t, noise=0.0, depth=3), budget=6,
                      stop_tokens=[stop])
    assert res.tokens == ref[:ref.index(stop) + 1]
    assert len(res.rounds) == 1 and stop in res.rounds[0].accepted_tokens[:-1]     # inside the path, not its end


def test_draft_logits_and_the_drafters_checks(targets, numpy_backend):
    """draft_logits refuses a draft past the target's positions (generate did, the standalone form did not), a
    drafter without a target checks its own ids, and an oracle needs a Target."""
    t = targets["default"]
    orc = kd.OracleDrafter(t, depth=3)
    limit = t.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"context_ids: {limit - 3} tokens \+ the root \+ draft depth 3 = "
                                         rf"{limit + 1} positions exceed the context limit of {limit}"):
        orc.draft_logits([1] * (limit - 3), 2)
    rd = kd.RandomDrafter(256, 4)
    assert rd.draft_logits([1, 2], 3).shape == (4, 256)
    for args, msg in ((([1, 2], -1), "root: expected an integer >= 0, got -1"),
                      (([1, 2], 256), "root: expected an integer <= 255, got 256"),
                      (([[1, 2]], 3), r"context_ids: expected a 1-d sequence of token ids, got shape \(1, 2\)"),
                      (([1, 300], 3), "context_ids: token id 300 at index 1 is outside the vocabulary"),
                      (("abc", 3), "context_ids: expected token ids, got a str")):
        with pytest.raises(ValueError, match=msg):
            rd.draft_logits(*args)
    with pytest.raises(ValueError, match="target: expected a kdtree_numba Target .* got RandomDrafter"):
        kd.OracleDrafter(rd)


def test_a_tiny_temperature_samples_the_argmax_without_warnings(targets, numpy_backend):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = kd.generate(targets["default"], PROMPT, 4, temperature=1e-308, seed=3)
    assert res.tokens == kd.generate(targets["default"], PROMPT, 4).tokens


@pytest.mark.parametrize("depth", [5000, 100000])
def test_a_draft_deeper_than_the_context_is_refused_up_front(targets, depth, numpy_backend):
    """Tree positions reach start + depth: a depth past max_position_embeddings is refused before any work
    (depth 100000 used to hang building the oracle's continuation; 5000 ran the target past its positions)."""
    t = targets["default"]
    with pytest.raises(ValueError, match=r"draft depth \(\d+\) = \d+ exceeds the context limit of 4096"):
        kd.generate(t, PROMPT, 8, drafter=kd.RandomDrafter(t.config.vocab_size, depth=depth), budget=4)


def test_tau_counts_what_the_rounds_emitted(targets, numpy_backend):
    """A round's path may run past max_new_tokens (or a stop token): verified, but cut from the output. tau counts
    the tokens the rounds added - (len(tokens) - 1) / rounds - so a 2-token generation is never 'tau 7'."""
    t = targets["default"]
    drafter = kd.OracleDrafter(t, noise=0.0, depth=8)
    g = kd.generate(t, PROMPT, 2, drafter=drafter, chain=True)
    assert len(g.tokens) == 2 and len(g.rounds) == 1 and g.rounds[0].accept_length > 2
    assert g.acceptance_length == 1.0
    g = kd.generate(t, PROMPT, 40, drafter=drafter, budget=16)
    assert g.acceptance_length == (len(g.tokens) - 1) / len(g.rounds)
    assert sum(r.accept_length for r in g.rounds[:-1]) < len(g.tokens) - 1 <= sum(r.accept_length for r in g.rounds)
