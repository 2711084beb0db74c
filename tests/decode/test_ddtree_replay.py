"""Graph-replayed DDTree rounds (decode/ddtree_replay.py): the round's state lives on the device, and tokens and
traces equal the direct loop's (decode/ddtree.py) - tree, chain, sampled, stop tokens inside an accepted path,
the token limit - on the NumPy references, the simulated kernels and (gpu) the captured graphs."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.decode.trace import STAGES
from kdtree_numba.model import dflash


@pytest.fixture(scope="module")
def pair():
    with kd.backend.use("numpy"):
        target, drafter = kd.load_default()
    return target, drafter, target.tokenizer.encode("def add(a, b):\n    return")


def _same_rounds(a, b):
    """Same rounds; weights to rounding: the drafter observes a padded path of L + 1 rows where the direct loop
    observes the m accepted ones, and a BLAS GEMM's rounding may depend on the row count (float32 log-probs: drafter
    G's weights moved one of 64 by 6.7e-6, 1.6e-5 relative; tokens and parents are compared exactly)."""
    assert len(a.rounds) == len(b.rounds)
    for x, y in zip(a.rounds, b.rounds):
        assert (x.start, x.root, x.accepted, x.bonus) == (y.start, y.root, y.accepted, y.bonus)
        assert x.tree.tokens.tolist() == y.tree.tokens.tolist() and x.tree.parents.tolist() == y.tree.parents.tolist()
        np.testing.assert_allclose(x.tree.logw, y.tree.logw, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(x.draft_probs, y.draft_probs, rtol=1e-4, atol=1e-6)
        assert set(y.times) == set(STAGES) and all(t >= 0 for t in y.times.values())   # device clock stamps


@pytest.mark.parametrize("budget, chain, temperature, n", [(16, False, 0.0, 40), (64, False, 0.0, 17),
                                                           (0, False, 0.0, 5), (8, True, 0.0, 30),
                                                           (16, False, 0.9, 30)])
def test_replayed_rounds_equal_direct_rounds(pair, budget, chain, temperature, n, numpy_backend):
    target, drafter, ids = pair
    kw = dict(drafter=drafter, chain=chain, temperature=temperature, seed=3, **({} if chain else dict(budget=budget)))
    want = kd.generate(target, ids, n, **kw)
    got = kd.generate(target, ids, n, replay=True, **kw)
    assert got.tokens == want.tokens and len(got.tokens) == n
    assert got.tokens == kd.generate(target, ids, n, temperature=temperature, seed=3).tokens   # plain decoding's
    assert got.settings["replay"] == "direct (device-side state)"
    _same_rounds(want, got)


def test_replay_stops_inside_an_accepted_path(pair, numpy_backend):
    target, drafter, ids = pair
    full = kd.generate(target, ids, 40, drafter=drafter, budget=32)
    r = next(r for r in full.rounds if len(r.accepted) >= 3)          # a round that accepted >= 2 drafts
    stop = full.tokens[r.start - len(ids) + 1]                         # its first accepted draft token
    want = kd.generate(target, ids, 40, stop_tokens=[stop]).tokens    # plain decoding
    got = kd.generate(target, ids, 40, drafter=drafter, budget=32, stop_tokens=[stop], replay=True).tokens
    assert got == want and got[-1] == stop
    # the round launched ahead of the stop was wasted work; the kept program's next generation is not affected
    assert kd.generate(target, ids, 40, drafter=drafter, budget=32, replay=True).tokens == full.tokens


def test_replay_on_simulated_kernels(kernel_backend):
    """The device-side round on the process backend's kernels (the simulator: a 1-layer tiny target, a random
    DFlash drafter of depth 2, budget 3, one round)."""
    target = kd.tiny_target(0, num_hidden_layers=1) if kd.backend.name == "sim" else kd.tiny_target(0)
    drafter = dflash.random_drafter(target, block_size=3)
    n = 2 if kd.backend.name == "sim" else 40
    want = kd.generate(target, [3, 17, 99, 5], n, drafter=drafter, budget=3)
    got = kd.generate(target, [3, 17, 99, 5], n, drafter=drafter, budget=3, replay=True)
    assert got.tokens == want.tokens
    _same_rounds(want, got)


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_captured_rounds_equal_direct_rounds_on_the_gpu(temperature):
    """On cuda every stage is captured after one direct round and replayed: same tokens and trees as direct
    launches, across many rounds, with the default pair - and plain decoding's tokens (replayed too), sampled or
    not (draws keyed by position: sampling's module docstring)."""
    target, drafter = kd.load_default()
    ids = target.tokenizer.encode("def fib(n):")
    plain = kd.generate(target, ids, 96, temperature=temperature, seed=4, replay=True).tokens
    for budget, chain in [(64, False), (None, True)]:                   # the chain's length: the drafter's depth
        kw = dict(drafter=drafter, budget=budget, chain=chain, temperature=temperature, seed=4)
        want = kd.generate(target, ids, 96, **kw)
        got = kd.generate(target, ids, 96, replay=True, **kw)
        assert got.settings["replay"] == "cuda graphs"
        assert got.tokens == want.tokens == plain
        # stamps inside the graph: every round's verify took time, and the replayed rounds' stages fit in the wall
        # clock. Round 1 of a program's first generation runs directly before the clock starts (ddtree_replay.py):
        # its stamps span the host's compiles and gemm_choice's first timings of its shapes (tens of ms), so it
        # is left out of the sum.
        assert all(r.times["verify"] > 0 for r in got.rounds)
        assert 0 < sum(sum(r.times.values()) for r in got.rounds[1:]) < 1e3 * got.seconds
        _same_rounds(want, got)


def test_a_nan_draft_is_named_as_the_direct_loop_names_it(numpy_backend):
    """On the host backends a replayed round checks the draft as the direct loop does (on cuda a NaN draft row
    gives -1 ids, which no target choice ever matches)."""
    target, drafter = kd.load_default()
    drafter.w["norm.weight"] = np.full_like(drafter.w["norm.weight"], np.nan)          # every draft logit NaN
    ids = target.tokenizer.encode("def add(a, b):")
    for replay in (False, True):
        with pytest.raises(ValueError, match="drafter logits: row 0 contains NaN"):
            kd.generate(target, ids, 8, drafter=drafter, budget=4, replay=replay)


def test_programs_are_kept_between_generations_and_rebuilt_when_weights_change(numpy_backend):
    """A second generation with the same settings reuses the kept program (its buffers and, on cuda, graphs) and
    gives the same tokens from a fresh start; replacing a weight array the program captured builds a new one."""
    target = kd.tiny_target(0)
    drafter = dflash.random_drafter(target, block_size=4)
    prompt = [3, 17, 99, 5, 42]
    first = kd.generate(target, prompt, 12, drafter=drafter, budget=4, replay=True)
    kept = dict(drafter._programs)
    again = kd.generate(target, prompt, 12, drafter=drafter, budget=4, replay=True)
    assert again.tokens == first.tokens and len(again.rounds) == len(first.rounds)
    assert drafter._programs == kept and len(kept) == 1
    other = kd.generate(target, prompt[:3], 9, drafter=drafter, budget=4, replay=True)     # another prompt
    assert other.tokens == kd.generate(target, prompt[:3], 9, drafter=drafter, budget=4).tokens
    for temperature, seed in [(0.9, 3), (0.9, 2 ** 40 + 7), (0.0, 5)]:     # any sampler settings: the same program
        kw = dict(drafter=drafter, budget=4, temperature=temperature, seed=seed)
        assert kd.generate(target, prompt, 12, replay=True, **kw).tokens == kd.generate(target, prompt, 12,
                                                                                       **kw).tokens
    assert drafter._programs == kept
    target.w["lm_head"] = target.w["lm_head"].copy()                 # a new array: the old program is stale
    kd.generate(target, prompt, 12, drafter=drafter, budget=4, replay=True)
    (key, prog), = drafter._programs.items()
    assert prog is not kept[key]
    ar = kd.generate(target, prompt, 10, replay=True)
    assert kd.generate(target, prompt, 10, replay=True).tokens == ar.tokens and len(target._programs) == 1


@pytest.mark.parametrize("field, row, value, message", [
    ("result", 1, 12345, "replay: the device records of round 2 hold an impossible result"),   # tokens past V
    ("n_acc", 0, 99, "replay: the device records of round 1 disagree"),       # a count the result contradicts
])
def test_records_written_elsewhere_are_an_error(monkeypatch, numpy_backend, field, row, value, message):
    """The host reads each round's result from its device record; a replayed graph that wrote a record elsewhere
    (simulated: a row overwritten after the round) is refused by name, never garbage tokens or a garbage trace."""
    from kdtree_numba.decode import ddtree_replay

    target = kd.tiny_target(0)
    drafter = dflash.random_drafter(target, block_size=4)
    record = ddtree_replay._RoundState.record

    def misplaced(self, tree, lp, ids, i, *args, **kwargs):
        record(self, tree, lp, ids, i, *args, **kwargs)
        self.rec[field][row] = value

    monkeypatch.setattr(ddtree_replay._RoundState, "record", misplaced)
    with pytest.raises(RuntimeError, match=message):
        kd.generate(target, [3, 17, 99, 5], 10, drafter=drafter, budget=4, replay=True)


def test_rounds_are_launched_one_ahead_only_away_from_the_limit(monkeypatch, numpy_backend):
    """Round i + 1 is launched before round i's result is read, unless round i could reach the token limit: with
    no stop token, every round launched is a round of the generation (no wasted work at the end)."""
    from kdtree_numba.decode import ddtree_replay

    target = kd.tiny_target(0)
    drafter = dflash.random_drafter(target, block_size=4)
    launched = []
    rounds = ddtree_replay._RoundProgram.rounds

    def counted(self):
        for end in rounds(self):
            launched.append(end)
            yield end

    monkeypatch.setattr(ddtree_replay._RoundProgram, "rounds", counted)
    got = kd.generate(target, [3, 17, 99, 5], 30, drafter=drafter, budget=4, replay=True)
    assert got.tokens == kd.generate(target, [3, 17, 99, 5], 30, drafter=drafter, budget=4).tokens
    assert len(launched) == len(got.rounds) > 3


@pytest.mark.parametrize("n", [5, 17, 40])
def test_direct_loop_observes_the_committed_rows_and_nothing_after_the_last_round(pair, n, numpy_backend):
    """decode/ddtree.py feeds the drafter the prefill's rows, then each round's accepted path - except after the
    last round (no draft reads those rows, and a last path can run past max_new_tokens): every observed row is a
    row of the returned text, contiguous from 0, and there is one observe per draft."""
    target, drafter, ids = pair
    spans, drafts = [], []
    observe, draft = drafter.observe, drafter.draft

    def observe_rec(features, start):
        spans.append((start, features.shape[0]))
        return observe(features, start)

    def draft_rec(context, root):
        drafts.append(len(context))
        return draft(context, root)

    drafter.observe, drafter.draft = observe_rec, draft_rec
    try:
        g = kd.generate(target, ids, n, drafter=drafter, budget=16)
    finally:
        del drafter.observe, drafter.draft
    assert len(spans) == len(drafts) == len(g.rounds)                  # the prefill's + one per round but the last
    assert [s for s, _ in spans] == [0] + [s + k for s, k in spans[:-1]]
    assert spans[-1][0] + spans[-1][1] <= len(ids) + len(g.tokens) - 1    # the last root is never observed


@pytest.mark.parametrize("n, stop", [(1, False), (12, True)])
def test_the_first_token_alone(pair, n, stop, numpy_backend):
    """Round 1 is queued behind the prefill before the first token is read: a limit of one token launches no
    round, and a first token that is a stop token ends the generation there (round 1 was wasted work); the kept
    program's next generation is not affected."""
    target, drafter, ids = pair
    first = kd.generate(target, ids, 1).tokens[0]
    kw = dict(drafter=drafter, budget=16, stop_tokens=[first] if stop else ())
    got = kd.generate(target, ids, n, replay=True, **kw)
    assert got.tokens == [first] and got.target_forwards == 1 and len(got.rounds) == 0
    assert kd.generate(target, ids, 12, drafter=drafter, budget=16, replay=True).tokens == \
        kd.generate(target, ids, 12).tokens
