"""The padded, replayed prefill (decode/prefill_replay.py): the bucket rule, the padded forward against a direct
prefill (logits of the last prompt row, the prompt rows' features and cache rows), generations whose prompts share
a bucket, no cache row past the prompt ever read (NaN there), and the direct fallback - on the NumPy references;
the captured graph itself: the gpu-marked test at the end (and every replayed generation of the other gpu
tests)."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.decode import prefill_replay
from kdtree_numba.decode.prefill_replay import PREFILL_MAX, PREFILL_MIN, Prefill, bucket


@pytest.fixture(scope="module")
def tiny():
    with kd.backend.use("numpy"):
        return kd.tiny_target(0)


def test_bucket_is_the_next_power_of_two_within_the_capturable_range(tiny):
    assert [bucket(tiny, n) for n in (1, 5, PREFILL_MIN, PREFILL_MIN + 1, 109, PREFILL_MAX)] == \
        [PREFILL_MIN, PREFILL_MIN, PREFILL_MIN, 2 * PREFILL_MIN, 128, PREFILL_MAX]
    assert bucket(tiny, PREFILL_MAX + 1) is None
    cfg = tiny.config
    assert cfg.n_routed_experts > 0
    rows_ok = kd.kernels.moe_grouped_gemm.CUBLAS_ROWS // cfg.num_experts_per_tok   # the grouped GEMM's range
    assert bucket(tiny, rows_ok) == rows_ok and bucket(tiny, rows_ok + 1) is None


def test_padded_prefill_equals_a_direct_prefill(tiny, numpy_backend):
    """Logits of the last prompt row, every prompt row's hidden features and cache rows: the same as a direct
    prefill of the prompt alone (to rounding: BLAS may sum a 16-row product otherwise than a 9-row one)."""
    prompt = np.array([3, 17, 99, 5, 42, 7, 11, 60, 2], np.int32)                      # 9 tokens -> 16 rows
    n, layers = len(prompt), (0, 1)
    direct_cache = tiny.new_cache(256)
    want, want_hid = tiny.forward(prompt, direct_cache, 0, hidden_layers=layers, logits_to_keep=1)
    got = {}
    cache = tiny.new_cache(256)
    pre = Prefill(tiny, cache, layers, lambda lg, hid, last: got.update(logits=lg.copy(), hid=hid, last=last))
    pre(prompt)
    assert list(pre.buckets) == [16]
    assert int(kd.backend.to_host(got["last"])[0]) == n - 1                            # the row's position
    np.testing.assert_allclose(got["logits"], want, rtol=1e-5, atol=1e-5)                # [1, V]
    for k in layers:
        assert got["hid"][k].shape[0] == 16                                            # every row run
        np.testing.assert_allclose(got["hid"][k][:n], want_hid[k], rtol=1e-5, atol=1e-5)
    for i in range(tiny.config.num_hidden_layers):
        np.testing.assert_allclose(cache.layer(i)[:n], direct_cache.layer(i)[:n], rtol=1e-5, atol=1e-5)


def test_logits_at_picks_device_rows_and_excludes_logits_to_keep(tiny, numpy_backend):
    ids = np.array([3, 17, 99, 5], np.int32)
    full, _ = tiny.forward(ids, tiny.new_cache(16), 0)                                  # [4, V]
    rows, _ = tiny.forward(ids, tiny.new_cache(16), 0, logits_at=np.array([2, 0], np.int32))
    np.testing.assert_allclose(rows, full[[2, 0]], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="logits_at: give logits_at or logits_to_keep"):
        tiny.forward(ids, tiny.new_cache(16), 0, logits_at=np.array([3], np.int32), logits_to_keep=1)
    with pytest.raises(ValueError, match="logits_at: expected dtype int32, got int64"):
        tiny.forward(ids, tiny.new_cache(16), 0, logits_at=np.array([3]))


def test_prompts_sharing_a_bucket_decode_as_directly(tiny, numpy_backend):
    """One kept program, one bucket: a long prompt, then a shorter one (its pad rows and cache rows past it still
    hold the long prompt's), then the long one again - each generation equal to direct decoding."""
    target = kd.tiny_target(0)
    long, short = [3, 17, 99, 5, 42, 7, 11, 60, 2, 8, 19, 23], [9, 4, 31, 2, 5, 6, 7, 8, 10]
    assert bucket(target, len(long)) == bucket(target, len(short)) == 16
    for prompt in (long, short, long):
        want = kd.generate(target, prompt, 10).tokens
        assert kd.generate(target, prompt, 10, replay=True).tokens == want
    (prog,) = target._programs.values()
    assert list(prog.prefill.buckets) == [16]


def test_ddtree_prompts_sharing_a_bucket_decode_as_directly(numpy_backend):
    """The drafter observes the pad rows' features too (scratch past the prompt): a short prompt after a long
    one in the same bucket still drafts from its own context - tokens and accepted lengths equal the direct
    loop's."""
    target, drafter = kd.load_default()
    tok = target.tokenizer
    for text in ('def add(a, b):\n    """Add two numbers."""\n    return', "def add(a, b):\n    return a +"):
        ids = tok.encode(text)                                                          # 15, 11 tokens
        want = kd.generate(target, ids, 12, drafter=drafter, budget=8)
        got = kd.generate(target, ids, 12, drafter=drafter, budget=8, replay=True)
        assert got.tokens == want.tokens
        assert [r.accepted for r in got.rounds] == [r.accepted for r in want.rounds]
    assert {b for p in drafter._programs.values() for b in p.prefill.buckets} == {16}


def test_rows_past_the_prompt_are_never_read(monkeypatch, numpy_backend):
    """The module docstring's claim, tested: after each prefill every cache row past the prompt (the pad rows'
    and all later ones) of the target and of the drafter is NaN - a read of any of them before it is written would
    spread NaN into the logits (NaN logits raise). Plain decoding and DDTree still give the direct tokens."""
    target, drafter = kd.load_default()
    ids = target.tokenizer.encode("def add(a, b):\n    return a +")                        # 11 tokens -> 16 rows
    want_ar = kd.generate(target, ids, 12).tokens
    want_dd = kd.generate(target, ids, 12, drafter=drafter, budget=8).tokens
    run = Prefill.__call__

    def then_poison(self, prompt):
        run(self, prompt)
        n = len(prompt)
        for i in range(target.config.num_hidden_layers):
            self.cache.layer(i)[n:] = np.nan                                            # [capacity - n, Lkv+R]
        if drafter._k is not None:
            drafter._k[:, n:], drafter._v[:, n:] = np.nan, np.nan

    monkeypatch.setattr(Prefill, "__call__", then_poison)
    assert kd.generate(target, ids, 12, replay=True).tokens == want_ar
    assert kd.generate(target, ids, 12, drafter=drafter, budget=8, replay=True).tokens == want_dd


def test_a_prompt_past_the_largest_bucket_prefills_directly(tiny, numpy_backend, monkeypatch):
    monkeypatch.setattr(prefill_replay, "PREFILL_MAX", PREFILL_MIN)
    target = kd.tiny_target(0)
    prompt = list(range(3, 3 + PREFILL_MIN + 5))                                     # one bucket too long
    want = kd.generate(target, prompt, 6).tokens
    assert kd.generate(target, prompt, 6, replay=True).tokens == want
    (prog,) = target._programs.values()
    assert prog.prefill.buckets == {}


@pytest.mark.gpu
def test_captured_prefill_equals_direct_prefill_on_the_gpu():
    """On cuda a bucket's first prefill runs directly, is captured, and later prefills replay the graph: plain
    decoding and DDTree from prompts of one bucket (the long one, a shorter one, the long one again) give the
    tokens of direct launches."""
    target, drafter = kd.load_default()
    tok = target.tokenizer
    long = tok.encode('def add(a, b):\n    """Add two numbers."""\n    return')                  # 15 tokens
    short = tok.encode("def add(a, b):\n    return a +")                                # 11
    assert bucket(target, len(long)) == bucket(target, len(short)) == 16
    for ids in (long, short, long):
        assert kd.generate(target, ids, 40, replay=True).tokens == kd.generate(target, ids, 40).tokens
        kw = dict(drafter=drafter, budget=16)
        assert kd.generate(target, ids, 40, replay=True, **kw).tokens == kd.generate(target, ids, 40, **kw).tokens
    (prog,) = target._programs.values()
    assert prog.prefill.buckets[16].run != prog.prefill.buckets[16].forward             # the graph's replay
