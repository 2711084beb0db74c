"""The target against HF transformers' DeepseekV3ForCausalLM in float64: logits and greedy tokens."""
import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.model import target as target_module

from . import hf_models as hf

pytestmark = pytest.mark.skipif(hf.torch is None, reason="needs the `ref` extra (torch + transformers)")
IDS = np.random.default_rng(0).integers(0, 96, 23)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """variant -> (checkpoint dir, float64 HF model), built once per module."""
    cache = {}

    def get(variant):
        if variant not in cache:
            path = tmp_path_factory.mktemp(variant)
            hf.make(variant).save_pretrained(path)
            cache[variant] = (path, hf.load_f64(path))
        return cache[variant]
    return get


@pytest.fixture(params=["absorbed", "decompressed"])
def prefill_form(request, monkeypatch):
    """The prefill's attention form: absorbed (as decode), or decompressed (per-head keys and values, the form
    prefill chunks of DECOMPRESSED_PREFILL_TOKENS or more take; here every chunk of >= 1 token does)."""
    monkeypatch.setattr(target_module, "DECOMPRESSED_PREFILL_TOKENS", 1 if request.param == "decompressed" else 10**9)
    return request.param


@pytest.mark.parametrize("variant", list(hf.VARIANTS))
def test_logits_match_transformers_numpy(saved, variant, numpy_backend, prefill_form):
    path, ref = saved(variant)
    got = kd.load_target(path).logits(IDS)
    want = hf.logits_f64(ref, IDS)
    assert np.abs(got - want).max() <= 1e-4
    assert want.std() > 0.1                                  # non-trivial logits


def test_logits_match_transformers_on_the_simulator(saved, kernel_backend):
    path, ref = saved("groups_bias")
    ids = IDS[:6]
    target = kd.load_target(path)
    assert target.backend == kd.backend.process_name
    assert np.abs(target.logits(ids) - hf.logits_f64(ref, ids)).max() <= 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("variant", ["plain", "yarn", "q_lora_null", "kimi_like", "dense2_shared2"])
def test_logits_match_transformers_on_the_gpu(saved, variant, prefill_form):
    path, ref = saved(variant)
    got = kd.load_target(path).logits(IDS)
    assert np.abs(got - hf.logits_f64(ref, IDS)).max() <= 1e-4


@pytest.mark.parametrize("variant", ["yarn", "kimi_like"])
def test_greedy_tokens_match_transformers_generate(saved, variant, numpy_backend):
    path, ref = saved(variant)
    prompt = IDS[:5]
    got = kd.generate(kd.load_target(path), prompt, 32).tokens
    assert got == hf.greedy_f64(ref, prompt, 32)


@pytest.mark.gpu
def test_greedy_tokens_match_transformers_generate_on_the_gpu(saved):
    path, ref = saved("kimi_like")
    assert kd.generate(kd.load_target(path), IDS[:5], 32).tokens == hf.greedy_f64(ref, IDS[:5], 32)


def test_save_load_round_trip_is_bit_identical(tmp_path, numpy_backend):
    target = kd.tiny_target(3, q_lora_rank=None, rope_scaling={"factor": 4.0, "original_max_position_embeddings": 64,
                                                               "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0,
                                                               "mscale_all_dim": 1.0, "truncate": True,
                                                               "attention_factor": None})
    target.save(tmp_path)
    again = kd.load_target(tmp_path)
    ids = IDS[:9] % 256
    np.testing.assert_array_equal(again.logits(ids), target.logits(ids))
    assert again.config == target.config


def test_saved_tiny_target_loads_in_transformers(tmp_path, numpy_backend):
    target = kd.tiny_target(4)
    target.save(tmp_path)
    ref = hf.load_f64(tmp_path)
    ids = IDS[:11] % 256
    assert np.abs(target.logits(ids) - hf.logits_f64(ref, ids)).max() <= 1e-4


def test_hidden_states_match_transformers(saved, numpy_backend):
    path, ref = saved("plain")
    target = kd.load_target(path)
    got = target.hidden_states(IDS[:7], [0, 2])
    with hf.torch.no_grad():
        hs = ref(hf.torch.tensor(IDS[:7])[None], output_hidden_states=True).hidden_states
    np.testing.assert_allclose(got[0], hs[1][0].numpy(), atol=1e-4)
    # the last HF entry is after the final norm; layer 2's residual stream is hidden_states[3] only pre-norm
    assert got[2].shape == (7, 32)
