"""Graph-replayed plain decoding (decode/replay.py): the step's state lives on the device, and the tokens equal
direct decoding's - greedy, sampled, with stop tokens, across the host-read chunk boundaries - on every backend.
The kernels' device-side scalars (attention start, sampler stream) equal their host-int launches."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba import backend
from kdtree_numba.decode.replay import autoregressive_replay
from kdtree_numba.kernels import mla_attention, sampling

PROMPT = [3, 17, 99, 5, 42]


@pytest.fixture(scope="module")
def tiny():
    with kd.backend.use("numpy"):
        return kd.tiny_target(0)


@pytest.mark.parametrize("n, sync_every", [(1, 16), (16, 16), (17, 16), (23, 4), (9, 1)])
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_replay_equals_direct_decoding(tiny, n, sync_every, temperature, numpy_backend):
    want = kd.generate(tiny, PROMPT, n, temperature=temperature, seed=5).tokens
    got = autoregressive_replay(tiny, np.array(PROMPT, np.int32), n, temperature, 5, sync_every=sync_every)
    assert got.tokens == want and got.target_forwards == n


@pytest.mark.parametrize("sync_every", [1, 3, 16])
def test_replay_stops_at_a_stop_token_inside_a_chunk(tiny, sync_every, numpy_backend):
    full = kd.generate(tiny, PROMPT, 30).tokens
    stop = full[6]
    want = kd.generate(tiny, PROMPT, 30, stop_tokens=[stop]).tokens
    got = autoregressive_replay(tiny, np.array(PROMPT, np.int32), 30, 0.0, 0, stop_tokens={stop},
                                sync_every=sync_every)
    assert got.tokens == want and got.tokens[-1] == stop and len(got.tokens) <= 7


def test_one_program_serves_every_temperature_and_seed(numpy_backend):
    """The sampler's settings live on the device: a kept program (on cuda: its graph) serves any temperature and
    seed, each generation equal to direct decoding."""
    target = kd.tiny_target(0)
    for temperature, seed in [(0.0, 0), (0.8, 1), (0.8, 2), (0.8, 2), (1.3, 2 ** 50), (0.0, 0)]:   # repeats: kept
        want = kd.generate(target, PROMPT, 12, temperature=temperature, seed=seed).tokens
        assert kd.generate(target, PROMPT, 12, temperature=temperature, seed=seed, replay=True).tokens == want
    assert len(target._programs) == 1


def test_replay_raises_on_nan_logits(tiny, numpy_backend):
    broken = kd.tiny_target(0)
    broken.w["lm_head"][3] = np.nan                       # every logit row gets one NaN
    with pytest.raises(ValueError, match="NaN logits"):
        kd.generate(broken, PROMPT, 5, replay=True)


def test_replay_arguments_are_validated(tiny, numpy_backend):
    with pytest.raises(ValueError, match="replay: expected True or False, got 1"):
        kd.generate(tiny, PROMPT, 4, replay=1)
    with pytest.raises(ValueError, match="replay: the random drafter reads the host context"):
        kd.generate(tiny, PROMPT, 4, drafter=kd.RandomDrafter(tiny.config.vocab_size, 3, 0), replay=True)
    with pytest.raises(ValueError, match="replay: the oracle drafter reads the host context"):
        kd.generate(tiny, PROMPT, 4, drafter=kd.OracleDrafter(tiny, depth=3), replay=True)


def test_device_side_start_and_stream_equal_host_ints(kernel_backend):
    """The attention kernel reads start from a device array and the sampler its stream: same results as ints
    (tiny shapes for the simulator)."""
    rng = np.random.default_rng(0)
    T, N, D, lkv, C = 2, 3, 12, 8, 11
    q = backend.asarray(rng.standard_normal((T, N, D), dtype=np.float32))
    cache = backend.asarray(rng.standard_normal((C, D), dtype=np.float32))
    start = 6
    want = backend.to_host(mla_attention.mla_attention(q, cache, start, 0.3, lkv))
    got = backend.to_host(mla_attention.mla_attention(q, cache, backend.full((1,), start, np.int32), 0.3, lkv))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)
    x = backend.asarray(rng.standard_normal((3, 50), dtype=np.float32))
    seed = 2 ** 33 + 11                                                  # both words of the key matter
    a = backend.to_host(sampling.choose_tokens(x, 0.7, seed, 9))
    b = backend.to_host(sampling.choose_tokens(x, 0.7, seed, backend.full((1,), 9, np.int32)))
    c = backend.to_host(sampling.choose_tokens(x, *sampling.settings(0.7, seed), backend.full((1,), 9, np.int32)))
    assert (a == b).all() and (a == c).all()
    assert (backend.to_host(sampling.choose_tokens(x, 0.7, 11, 9)) != a).any()
    t, s = sampling.settings(0.0, 0)
    sampling.settings(0.7, seed, out=(t, s))                             # overwritten in place (a kept program)
    assert (backend.to_host(sampling.choose_tokens(x, t, s, 9)) == a).all()


def test_sampler_settings_are_validated():
    with pytest.raises(ValueError, match="temperature: expected a number >= 0.0, got -1.0"):
        sampling.settings(-1.0, 0)
    with pytest.raises(ValueError, match="seed: expected an integer <= 18446744073709551615"):
        sampling.settings(0.5, 2 ** 64)
    x = backend.zeros((1, 4), np.float32)
    with pytest.raises(ValueError, match="seed: expected dtype uint32, got int32"):
        sampling.choose_tokens(x, 0.5, backend.zeros((2,), np.int32))
    with pytest.raises(ValueError, match=r"temperature: expected shape \(1\), got \(2,\)"):
        sampling.choose_tokens(x, backend.zeros((2,), np.float64), 0)


def test_replay_on_simulated_kernels(tiny, kernel_backend):
    """The whole device-side step on the process backend's kernels (the simulator: 3 tokens of a tiny model)."""
    target = kd.tiny_target(0, num_hidden_layers=1) if kd.backend.name == "sim" else kd.tiny_target(0)
    n = 3 if kd.backend.name == "sim" else 32
    want = kd.generate(target, PROMPT, n).tokens
    assert kd.generate(target, PROMPT, n, replay=True).tokens == want


@pytest.mark.gpu
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_captured_graph_equals_direct_launches_on_the_gpu(temperature):
    """On cuda the step is captured once and replayed: same tokens as direct launches (tiny and the default pair,
    across several host-read chunks)."""
    target = kd.tiny_target(0)
    want = kd.generate(target, PROMPT, 70, temperature=temperature, seed=2).tokens
    got = kd.generate(target, PROMPT, 70, temperature=temperature, seed=2, replay=True)
    assert got.tokens == want and got.settings["replay"] == "cuda graph"
    other = dict(temperature=temperature + 0.5, seed=3)                  # the same graph, other sampler settings
    assert kd.generate(target, PROMPT, 70, replay=True, **other).tokens == kd.generate(target, PROMPT, 70,
                                                                                      **other).tokens
    assert len(target._programs) == 1
    pair, _ = kd.load_default()
    ids = pair.tokenizer.encode("def add(a, b):")
    assert kd.generate(pair, ids, 50, replay=True).tokens == kd.generate(pair, ids, 50).tokens
