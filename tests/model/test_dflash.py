"""The DFlash drafter in the engine: its logits against the torch training model, its incremental draft cache
against a fresh draft, DDTree with it against plain decoding, and every checkpoint that does not fit refused."""
import json

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.model.drafters import concat_features

torch = pytest.importorskip("torch")
dflash_torch = pytest.importorskip("kdtree_numba.train.dflash_torch")

PROMPT = [3, 17, 99, 5, 42, 7, 11]


def torch_drafter(target, seed=0, **kw):
    """A random torch DFlash model for ``target`` with non-trivial norms (training init starts them at 1)."""
    cfg = dflash_torch.config_for_target(target.config, **{"num_hidden_layers": 2, "num_attention_heads": 4,
                                                           "num_key_value_heads": 2, "head_dim": 16,
                                                           "intermediate_size": 96, "block_size": 5,
                                                           "target_layer_ids": (0, 1), "mask_token_id": 2, **kw})
    torch.manual_seed(seed)
    model = dflash_torch.DFlashDraftModel(cfg, init_std=0.1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.2 * torch.randn_like(p))
    return model.float().eval()


def torch_logits(model, target, context, root):
    """The torch model's draft for ``context + [root]`` from the engine target's features (the same features HF
    gives: test_hf_parity checks the target itself)."""
    layers = model.config.target_layer_ids
    with kd.backend.use(target.backend):
        hid = target.hidden_states(context, layers)
    feat = np.concatenate([hid[k] for k in layers], axis=1)                       # [C, nF*H]
    C, B = len(context), model.config.block_size
    ids = [root] + [model.config.mask_token_id] * (B - 1)
    w = target.state_dict()
    with torch.no_grad():
        out = model.block_logits(torch.from_numpy(feat), np.arange(C), ids, np.arange(C, C + B),
                                 torch.from_numpy(w["model.embed_tokens.weight"]),
                                 torch.from_numpy(w["lm_head.weight"]))
    return out.numpy()


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with kd.backend.use("numpy"):
        target = kd.tiny_target(0)
    model = torch_drafter(target)
    path = tmp_path_factory.mktemp("drafter")
    model.save_pretrained(path, dtype=torch.float32)
    return target, model, path


def test_engine_logits_equal_the_torch_model_numpy(pair, numpy_backend):
    target, model, path = pair
    drafter = kd.load_drafter(path, target)
    assert drafter.depth == model.config.block_size - 1 and drafter.feature_layers == (0, 1)
    got = drafter.draft_logits(PROMPT, 13)
    want = torch_logits(model, target, PROMPT, 13)
    assert got.shape == (4, target.config.vocab_size) and got.dtype == np.float32
    assert want.std() > 0.5                                   # a non-trivial draft
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_engine_logits_equal_the_torch_model_kernels(pair, kernel_backend):
    """The same on the simulator (or the GPU): tiny shapes, every stage a kernel."""
    _, model, path = pair
    target = kd.tiny_target(0)                               # the same weights, on the kernel backend
    got = kd.load_drafter(path, target).draft_logits(PROMPT[:4], 13)
    want = torch_logits(model, target, PROMPT[:4], 13)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("backend_fixture", ["numpy_backend", "kernel_backend"])
def test_folded_norms_draft_what_the_norm_launches_draft(pair, backend_fixture, request, monkeypatch):
    """FOLD_NORMS (hidden_norm, input_layernorm and post_attention_layernorm folded into the projections after them,
    the row scale applied by draft_kv and swiglu): the same draft up to float rounding, with four of the block's
    five RMSNorm launches and the observe's one gone."""
    from kdtree_numba.kernels import rmsnorm
    from kdtree_numba.model import dflash

    request.getfixturevalue(backend_fixture)
    _, model, path = pair
    target = kd.tiny_target(0)                               # on the process backend (kernels: sim or cuda)
    if backend_fixture == "numpy_backend":
        with kd.backend.use("numpy"):
            target = kd.tiny_target(0)
    calls, plain = [], rmsnorm.rmsnorm
    monkeypatch.setattr(rmsnorm, "rmsnorm", lambda *a, **k: calls.append(1) or plain(*a, **k))
    got = {}
    for fold in (False, True):
        monkeypatch.setattr(dflash, "FOLD_NORMS", fold)
        calls.clear()
        got[fold] = kd.load_drafter(path, target).draft_logits(PROMPT[:4], 13)
        got[fold, "norms"] = len(calls)
    assert got[False, "norms"] - got[True, "norms"] == 2 * 2 + 1         # two layers x 2, the observe's one
    np.testing.assert_allclose(got[True], got[False], rtol=1e-5, atol=1e-5 * np.abs(got[False]).max())
    want = torch_logits(model, target, PROMPT[:4], 13)
    np.testing.assert_allclose(got[True], want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


def test_bf16_checkpoint_loads(pair, tmp_path, numpy_backend):
    target, model, _ = pair
    model.save_pretrained(tmp_path, dtype=torch.bfloat16)
    got = kd.load_drafter(tmp_path, target).draft_logits(PROMPT, 13)
    want = torch_logits(dflash_torch.DFlashDraftModel.from_pretrained(tmp_path), target, PROMPT, 13)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())


@pytest.mark.parametrize("budget", [0, 3, 16, 64])
def test_greedy_ddtree_and_chain_equal_autoregressive(pair, budget, numpy_backend):
    target, _, path = pair
    drafter = kd.load_drafter(path, target)
    ref = kd.generate(target, PROMPT, 40).tokens
    assert kd.generate(target, PROMPT, 40, drafter=drafter, budget=budget).tokens == ref
    assert kd.generate(target, PROMPT, 40, drafter=drafter, chain=True).tokens == ref


def test_draft_cache_after_rounds_equals_a_fresh_draft(pair, numpy_backend):
    """Context rows fed from the verify forward (accepted tree nodes) equal those of a causal prefill: the draft
    after some DDTree rounds equals a fresh draft over the same committed tokens."""
    target, _, path = pair
    drafter = kd.load_drafter(path, target)
    res = kd.generate(target, PROMPT, 25, drafter=drafter, budget=16)
    last = res.rounds[-2]                                   # the last round's path is not observed (no draft follows)
    committed = PROMPT + res.tokens
    context = committed[:last.start + len(last.accepted)]                      # what the drafter has observed
    assert drafter.length == len(context) and len(res.rounds) >= 3
    root = committed[len(context)]
    incremental = np.asarray(kd.backend.to_host(drafter.draft(np.asarray(context), root)))
    fresh = kd.load_drafter(path, target).draft_logits(context, root)
    np.testing.assert_allclose(incremental, fresh, rtol=1e-4, atol=1e-4 * np.abs(fresh).max())


# ------------------------------------------------------------------------------------------------ bad checkpoints
def _edit(path, tmp_path, change):
    raw = json.loads((path / "config.json").read_text())
    change(raw)
    out = tmp_path / "bad"
    out.mkdir()
    (out / "config.json").write_text(json.dumps(raw))
    (out / "model.safetensors").write_bytes((path / "model.safetensors").read_bytes())
    return out


@pytest.mark.parametrize("change, msg", [
    (lambda r: r.update(hidden_size=48), "hidden_size: the drafter has 48, the target has 64"),
    (lambda r: r.update(vocab_size=300), "vocab_size: the drafter has 300, the target has 256"),
    (lambda r: r.update(num_target_layers=5), "num_target_layers: the drafter has 5, the target has 3"),
    (lambda r: r["dflash_config"].update(target_layer_ids=[0, 3]), r"layer 3 is outside \[0, num_target_layers = 3\)"),
    (lambda r: r["dflash_config"].update(mask_token_id=256), "mask_token_id: 256 is outside the target's vocabulary"),
    (lambda r: r.update(num_key_value_heads=3), "num_key_value_heads: got 3, expected a divisor of"),
    (lambda r: r.update(block_size=1), "block_size: got 1, expected an integer >= 2"),
    (lambda r: r.update(head_dim="16"), "head_dim: got '16'"),
    (lambda r: r.update(model_type="llama"), "expected 'qwen3' / \\['DFlashDraftModel'\\]"),
    (lambda r: r.update(num_hidden_layers=3), "layers.2.self_attn.q_proj.weight: missing"),
    (lambda r: r.update(intermediate_size=97), r"layers.0.mlp.gate_proj.weight: expected shape \(97, 64\), got \(96, 64\)"),
    (lambda r: r.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 0.0,
                                         "original_max_position_embeddings": 64}), "rope_scaling: factor 0.0"),
    (lambda r: r.update(hidden_act="gelu"), "hidden_act: got 'gelu', expected 'silu'"),
    (lambda r: r.update(attention_bias=True), "attention_bias: got True, expected False"),
    (lambda r: r.update(max_position_embeddings=10 ** 12), r"max_position_embeddings: got 1000000000000, expected at "
                                                           r"most 2\*\*31 - 1"),
])
def test_a_drafter_that_does_not_fit_is_refused(pair, tmp_path, change, msg, numpy_backend):
    target, _, path = pair
    bad = _edit(path, tmp_path, change)
    with pytest.raises(ValueError, match=msg) as e:
        kd.load_drafter(bad, target)
    assert str(bad) in str(e.value)                                      # every message names where it read


def test_yarn_rope_parses(pair, tmp_path, numpy_backend):
    """A YaRN drafter (z-lab's Kimi-K2.5 drafter uses factor 64) loads; its rope differs from the plain one."""
    target, _, path = pair
    yarn = _edit(path, tmp_path, lambda r: (r.pop("rope_parameters", None), r.update(
        rope_scaling={"type": "yarn", "factor": 64.0, "original_max_position_embeddings": 4})))
    d = kd.load_drafter(yarn, target)
    assert d.config.rope_scaling["factor"] == 64.0 and d.rope_amp > 1.0
    assert not np.allclose(d.draft_logits(PROMPT, 13), kd.load_drafter(path, target).draft_logits(PROMPT, 13))


def test_a_drafter_loaded_for_another_target_is_refused(pair, numpy_backend):
    target, _, path = pair
    drafter = kd.load_drafter(path, target)
    other = kd.tiny_target(0)
    with pytest.raises(ValueError, match="drafter: a dflash drafter reads the features of the target it was "
                                         "loaded for"):
        kd.generate(other, PROMPT, 4, drafter=drafter)


def test_default_target_saves_with_its_tokenizer(tmp_path, numpy_backend):
    target, _ = kd.load_default()
    target.save(tmp_path)
    again = kd.load_target(tmp_path)
    text = "def add(a, b):\n    return a + b\n"
    assert again.tokenizer.encode(text) == target.tokenizer.encode(text)
    assert again.tokenizer.decode(again.tokenizer.encode(text)) == text


def test_forward_hiddens_are_the_drafter_features_side_by_side(pair, numpy_backend):
    """A forward's hidden streams are column blocks of one [T, nH] array in the order asked: concat_features returns
    that array itself (no copy in a round), equal to the streams concatenated; another order is concatenated; a
    layer the model does not have is refused by name."""
    target = pair[0]
    ids, n, H = np.array(PROMPT, np.int32), target.config.num_hidden_layers, target.config.hidden_size
    run = lambda layers: target.forward(ids, target.new_cache(len(ids)), 0, hidden_layers=layers)[1]  # noqa: E731
    hid, one, zero = run((1, 0)), run((1,)), run((0,))
    np.testing.assert_array_equal(hid[1], one[1])
    np.testing.assert_array_equal(hid[0], zero[0])
    assert not np.array_equal(hid[0], hid[1])
    f = concat_features(hid, (1, 0))
    assert f is hid.stacked and f.shape == (len(ids), 2 * H)
    np.testing.assert_array_equal(f, np.concatenate([one[1], zero[0]], axis=1))
    np.testing.assert_array_equal(concat_features(hid, (0, 1)), np.concatenate([zero[0], one[1]], axis=1))
    for bad in (n, -1, 1.0):
        with pytest.raises(ValueError, match=rf"hidden_layers: layer {bad!r} is not a decoder layer index in "
                                             rf"\[0, {n}\)"):
            run((0, bad))
    with pytest.raises(ValueError, match=rf"^layers: layer {n} is not a decoder layer index in \[0, {n}\)"):
        target.hidden_states(PROMPT, (0, n))                    # the same check, naming hidden_states' argument


def test_device_state_drafts_what_host_ints_draft(pair, numpy_backend):
    """observe_at / draft_at - start and root as int32 [1] arrays, a captured round's way; the kernels add start to
    the row offsets for RoPE and B to start for the key count, so no launch makes positions first - give observe /
    draft's logits (draft_logits' path)."""
    target, model, path = pair
    want = kd.load_drafter(path, target).draft_logits(PROMPT, 13)
    d = kd.load_drafter(path, target)
    d.reserve(len(PROMPT) + 20)
    _, hid = target.forward(np.asarray(PROMPT, np.int32), target.new_cache(len(PROMPT)), 0,
                            hidden_layers=d.feature_layers, check_ids=False)
    start = np.zeros(1, np.int32)
    d.observe_at(concat_features(hid, d.feature_layers), start)
    start[0] = len(PROMPT)
    got = d.draft_at(np.full(1, 13, np.int32), start)
    np.testing.assert_array_equal(got, want)
    slot = d.root_slot()                                 # the caller keeps the slot current: nothing copied
    slot[0] = 13
    np.testing.assert_array_equal(d.draft_at(slot, start), want)
    assert kd.backend.same_start(slot, d.root_slot()) and not kd.backend.same_start(np.full(1, 13, np.int32), slot)


def test_root_slot_needs_reserve(pair, numpy_backend):
    target, _, path = pair
    with pytest.raises(RuntimeError, match="root_slot: call reserve first"):
        kd.load_drafter(path, target).root_slot()


def test_load_drafter_needs_the_target_it_reads(numpy_backend):
    """load_drafter(path, None) raised an AttributeError from inside the config check."""
    import os

    path = os.path.join(os.path.dirname(kd.__file__), "default_model", "drafter")
    with pytest.raises(ValueError, match="target: expected the kdtree_numba Target the drafter reads its features "
                                         "from, got NoneType"):
        kd.load_drafter(path, None)


def test_generate_refuses_positions_past_the_drafters_own_limit(pair, tmp_path, numpy_backend):
    """A drafter whose config allows fewer positions than the target's: generate names the drafter's limit."""
    target, _, path = pair
    d = kd.load_drafter(_edit(path, tmp_path, lambda r: r.update(max_position_embeddings=16)), target)
    assert target.config.max_position_embeddings > 16
    with pytest.raises(ValueError, match=r"exceeds the context limit of 16 \(the drafter's max_position_embeddings\)"):
        kd.generate(target, PROMPT[:4], 12, drafter=d, budget=4)


def test_tokenizer_decode_names_an_id_that_is_not_one(numpy_backend):
    """decode refuses a negative or fractional id by name (a raw OverflowError, or 1.5 read as 1); an id past the
    tokenizer's vocabulary (a padded model row) decodes to nothing, as the library does."""
    tok = kd.load_default()[0].tokenizer
    assert tok.decode(np.array([3, 4], np.int32)) == tok.decode([3, 4]) and tok.decode([10 ** 6]) == ""
    for bad, shown in (([5, -1], r"ids\[1\]: expected an integer >= 0, got -1"),
                       ([1.5], r"ids\[0\]: expected an integer, got 1.5"), ([True], r"ids\[0\]: .* got True")):
        with pytest.raises(ValueError, match=shown):
            tok.decode(bad)
