"""Training code smoke tests on CPU with tiny configs: target (HF + engine parity), the DFlash drafter's anchored
mask against its one-block reference, the weighted loss, save/load round trips, the CLI."""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kdtree_numba as kd  # noqa: E402
from kdtree_numba.train import dflash_torch as dfl  # noqa: E402
from kdtree_numba.train import docstring_prompts as dsp  # noqa: E402
from kdtree_numba.train import drafter_train as dt  # noqa: E402
from kdtree_numba.train import target_train as tt  # noqa: E402

V = 128
TINY_TARGET = dict(vocab_size=V, hidden_size=32, intermediate_size=64, moe_intermediate_size=24, num_hidden_layers=3,
                   num_attention_heads=4, num_key_value_heads=4, q_lora_rank=16, kv_lora_rank=16,
                   qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=8, max_position_embeddings=128)
TINY_DRAFTER = dict(layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=48)
SEQ = 48


def _fake_corpus(path):
    """tokens.npy: a repeated random 'file' (ids 3..V-1) + EOT 0 with 10 % noise; a byte-level BPE tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = np.random.default_rng(0)
    base = rng.integers(3, V, 61)
    stream = np.tile(np.concatenate([base, [0]]), 200)
    noise = rng.random(len(stream)) < 0.1
    stream[noise] = rng.integers(3, V, int(noise.sum()))
    os.makedirs(path, exist_ok=True)
    np.save(os.path.join(path, "tokens.npy"), stream.astype(np.uint16))
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["def f(x):\n    return x\n"] * 20, trainers.BpeTrainer(
        vocab_size=V, special_tokens=["<|endoftext|>", "<|mask|>", "<|pad|>"]))
    tok.save(os.path.join(path, "tokenizer.json"))
    return str(path)


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return _fake_corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def trained_target(data_dir, tmp_path_factory):
    out = str(tmp_path_factory.mktemp("target"))
    rec = tt.train_target(data_dir, out, steps=3, batch=2, seq=SEQ, config_overrides=TINY_TARGET, device="cpu",
                          log_every=1, val_every=2, val_windows=4)
    return out, rec


# ------------------------------------------------------------------------------------------------ target
def test_target_trains_and_saves_bf16(trained_target):
    out, rec = trained_target
    assert [s["step"] for s in rec["steps"]] == [1, 2, 3]
    assert all(np.isfinite(s["loss"]) for s in rec["steps"]) and np.isfinite(rec["val"][-1]["loss"])
    assert [v["step"] for v in rec["val"]] == [2, 3]
    log = json.load(open(os.path.join(out, "train_log.json")))
    assert set(log) >= {"config", "args", "steps", "val"}
    cfg = json.load(open(os.path.join(out, "config.json")))
    assert cfg["dtype"] == "bfloat16" and cfg["tie_word_embeddings"] is False
    assert os.path.exists(os.path.join(out, "tokenizer.json"))
    from safetensors import safe_open

    with safe_open(os.path.join(out, "model.safetensors"), "pt") as f:
        assert {f.get_tensor(k).dtype for k in f.keys()} == {torch.bfloat16}
        bias = f.get_tensor("model.layers.1.mlp.gate.e_score_correction_bias")
        assert torch.count_nonzero(bias) == 0                          # stays at HF's zeros


def test_target_loads_in_transformers_and_in_the_engine(trained_target, numpy_backend):
    out, _ = trained_target
    hf = transformers.DeepseekV3ForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    ids = np.random.default_rng(1).integers(0, V, 21)
    with torch.no_grad():
        want = hf(torch.tensor(ids)[None]).logits[0].numpy()                   # [T, V]
    got = kd.load_target(out).logits(ids)
    assert np.abs(got - want).max() <= 1e-3
    assert want.std() > 1e-3


def test_feature_hooks_are_hf_hidden_states_k_plus_1(trained_target):
    out, _ = trained_target
    model = dt.load_frozen_target(out, torch.device("cpu"))
    ids = torch.tensor(np.random.default_rng(2).integers(0, V, (2, 17)))
    feats = dt.TargetFeatures(model, (0, 1))
    got = feats(ids)                                                            # [2, 17, 2H]
    with torch.no_grad():
        hs = model(ids, output_hidden_states=True).hidden_states
    want = torch.cat([hs[1], hs[2]], dim=-1)
    assert torch.equal(got, want)
    with pytest.raises(ValueError):
        dt.TargetFeatures(model, (2,))                                          # the last layer is refused
    feats.remove()


def test_lr_schedule():
    lrs = [tt.lr_at(s, 100, 1.0) for s in range(100)]
    assert lrs[0] == pytest.approx(0.25) and lrs[3] == pytest.approx(1.0)       # 4 warm-up steps
    assert lrs[-1] == pytest.approx(0.1, abs=2e-3) and min(lrs[4:]) >= 0.1


# ------------------------------------------------------------------------------------------------ drafter
def _random_drafter(bs=4, seed=0):
    cfg = dfl.DFlashConfig(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, head_dim=8, vocab_size=V, block_size=bs, num_target_layers=4,
                           target_layer_ids=(0, 2))
    torch.manual_seed(seed)
    m = dfl.DFlashDraftModel(cfg, init_std=0.1)
    with torch.no_grad():
        for name, p in m.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    embed = torch.randn(V, 32)
    head = torch.randn(V, 32) * 0.2
    return m.eval(), embed, head


def test_drafter_state_dict_keys_and_shapes():
    m, _, _ = _random_drafter()
    sd = {k: tuple(v.shape) for k, v in m.state_dict().items()}
    want = {"fc.weight": (32, 64), "hidden_norm.weight": (32,), "norm.weight": (32,)}
    for i in range(2):
        p = f"layers.{i}."
        want.update({p + "self_attn.q_proj.weight": (32, 32), p + "self_attn.k_proj.weight": (16, 32),
                     p + "self_attn.v_proj.weight": (16, 32), p + "self_attn.o_proj.weight": (32, 32),
                     p + "self_attn.q_norm.weight": (8,), p + "self_attn.k_norm.weight": (8,),
                     p + "mlp.gate_proj.weight": (48, 32), p + "mlp.up_proj.weight": (48, 32),
                     p + "mlp.down_proj.weight": (32, 48), p + "input_layernorm.weight": (32,),
                     p + "post_attention_layernorm.weight": (32,)})
    assert sd == want


def test_anchored_training_forward_equals_block_logits():
    """Each anchor's logits in the batched masked pass == the one-block reference on ctx = features of j < a."""
    bs, S = 4, 24
    m, embed, head = _random_drafter(bs)
    g = torch.Generator().manual_seed(3)
    feat = torch.randn(2, S, 64, generator=g)                                   # [Bt, S, nF*H]
    ids = torch.randint(3, V, (2, S), generator=g)
    anchors = torch.tensor([[1, 7, 20], [5, 6, 13]])                            # [Bt, A], max S - bs
    with torch.no_grad():
        logits = m(feat, ids, anchors, embed, head)                             # [2, 3, bs-1, V]
        assert logits.shape == (2, 3, bs - 1, V)
        for b in range(2):
            for i, a in enumerate(anchors[b].tolist()):
                blk = torch.tensor([int(ids[b, a])] + [m.config.mask_token_id] * (bs - 1))
                ref = m.block_logits(feat[b, :a], torch.arange(a), blk, a + torch.arange(bs), embed, head)
                assert torch.allclose(logits[b, i], ref, atol=1e-5, rtol=0), (b, a)
        # features at or after the anchor must not matter; another block's tokens must not matter either
        feat2, ids2 = feat.clone(), ids.clone()
        feat2[0, 7:] += 5.0
        ids2[0, 20] = (ids2[0, 20] + 1) % V
        again = m(feat2, ids2, anchors, embed, head)
        assert torch.allclose(again[0, 1], logits[0, 1], atol=1e-6)
        assert not torch.allclose(again[0, 2], logits[0, 2], atol=1e-3)


def test_weighted_loss_matches_hand_computation():
    bs = 4
    w = dfl.position_weights(bs)                                                # gamma 2 for block 4
    np.testing.assert_allclose(w.numpy(), np.exp(-np.arange(3) / 2.0), rtol=1e-6)
    assert dfl.default_gamma(16) == 7.0 and dfl.default_gamma(8) == 4.0
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 3, bs - 1, 11, generator=g)
    labels = torch.randint(0, 11, (2, 3, bs - 1), generator=g)
    loss, correct = dfl.weighted_block_loss(logits, labels, w)
    x = logits.double().numpy()
    lse = np.log(np.exp(x).sum(-1))
    ce = lse - np.take_along_axis(x, labels.numpy()[..., None], -1)[..., 0]   # [2, 3, 3]
    ww = np.exp(-np.arange(3) / 2.0)
    assert float(loss) == pytest.approx((ce * ww).sum() / (ww.sum() * 6), rel=1e-6)
    assert torch.equal(correct, logits.argmax(-1) == labels)
    lab = dfl.block_labels(torch.arange(100, 120)[None], torch.tensor([[1, 9]]), bs)
    assert lab.tolist() == [[[102, 103, 104], [110, 111, 112]]]


def test_drafter_save_load_round_trip(tmp_path):
    m, embed, head = _random_drafter()
    with torch.no_grad():                                                       # bf16-exact weights
        for p in m.parameters():
            p.copy_(p.to(torch.bfloat16).float())
    m.save_pretrained(tmp_path)
    cfg = json.load(open(tmp_path / "config.json"))
    assert cfg["model_type"] == "qwen3" and cfg["architectures"] == ["DFlashDraftModel"]
    assert cfg["dflash_config"] == {"target_layer_ids": [0, 2], "mask_token_id": 1}
    assert cfg["rope_scaling"] is None and cfg["rope_parameters"]["rope_type"] == "default"
    again = dfl.DFlashDraftModel.from_pretrained(tmp_path)
    args = (torch.randn(9, 64), torch.arange(9), torch.tensor([5, 1, 1, 1]), torch.arange(9, 13), embed, head)
    assert torch.equal(m.block_logits(*args), again.block_logits(*args))


def test_drafter_trains_three_steps(trained_target, data_dir, tmp_path):
    tdir, _ = trained_target
    rec = dt.train_drafter(data_dir, tdir, str(tmp_path), steps=3, batch=2, seq=SEQ, anchors=6, block=4,
                           target_layers=(0, 1), regen=4, regen_prompt=8, regen_batch=8, log_every=1,
                           val_windows=2, device="cpu", **TINY_DRAFTER)
    assert [s["step"] for s in rec["steps"]] == [1, 2, 3] and all(np.isfinite(s["loss"]) for s in rec["steps"])
    assert rec["regen"]["train_sequences"] == 4 and rec["regen"]["val_sequences"] == 4
    val = rec["val"][-1]
    assert set(val) >= {"corpus", "regen"} and len(val["corpus"]["acc"]) == 3
    m = dfl.DFlashDraftModel.from_pretrained(tmp_path)
    assert m.config.block_size == 4 and m.config.target_layer_ids == (0, 1) and m.config.num_target_layers == 3
    log = json.load(open(tmp_path / "drafter_train_log.json"))
    assert log["regen"]["sequences"] == 8


def test_regenerated_text_is_the_targets_greedy_continuation(trained_target):
    tdir, _ = trained_target
    model = dt.load_frozen_target(tdir, torch.device("cpu"))
    prompts = np.random.default_rng(5).integers(3, V, (2, 6))
    seqs, info = dt.regenerate(model, prompts, 5, 2, torch.device("cpu"))
    assert seqs.shape == (2, 11) and (seqs[:, :6] == prompts).all()
    ids = torch.tensor(seqs[:1, :6])
    with torch.no_grad():
        for _ in range(5):                                                      # greedy by hand, no cache
            ids = torch.cat([ids, model(ids).logits[:, -1].argmax(-1, keepdim=True)], 1)
    assert ids[0].tolist() == seqs[0].tolist()


def test_row_sampler_keeps_sampled_rows_and_makes_greedy_rows_one_hot():
    scores = torch.tensor([[1.0, 3.0, 2.0], [1.0, 3.0, 2.0], [5.0, 5.0, 0.0]])
    got = dt.RowSampler(torch.tensor([False, True, False]))(None, scores)
    inf = float("-inf")
    assert got.tolist() == [[inf, 3.0, inf], [1.0, 3.0, 2.0], [5.0, inf, inf]]   # a tie: the first maximum


def test_regenerate_samples_the_rows_it_is_told_and_keeps_the_others_greedy(trained_target):
    """``sampled``: row 0 greedy (the plain greedy run's row), rows 1-3 sampled at T 1 - the same again for the
    same seed, other text for another seed, and not the greedy continuation (the tiny target's distribution is
    wide: 10 sampled tokens in a row all equal to the argmax would be a bug)."""
    tdir, _ = trained_target
    model = dt.load_frozen_target(tdir, torch.device("cpu"))
    prompts = np.random.default_rng(5).integers(3, V, (4, 6))
    cpu = torch.device("cpu")
    greedy, _ = dt.regenerate(model, prompts, 10, 4, cpu)
    mask = np.array([False, True, True, True])
    a, info = dt.regenerate(model, prompts, 10, 4, cpu, sampled=mask, seed=3)
    b, _ = dt.regenerate(model, prompts, 10, 4, cpu, sampled=mask, seed=3)
    c, _ = dt.regenerate(model, prompts, 10, 4, cpu, sampled=mask, seed=4)
    assert a.shape == greedy.shape == (4, 16) and (a[:, :6] == prompts).all()
    assert np.array_equal(a[0], greedy[0]) and np.array_equal(a, b) and info["sampled_sequences"] == 3
    assert not np.array_equal(a[1:, 6:], c[1:, 6:])
    assert all(not np.array_equal(a[i, 6:], greedy[i, 6:]) for i in (1, 2, 3))


def test_regen_sampled_rows_are_drawn_after_todays_prompts_and_validated_alone(trained_target, data_dir, tmp_path,
                                                                           monkeypatch):
    """--regen-sampled 0.5 of 8 train + 4 val prompts: the same prompts as without it (the rows are drawn from the
    Generator afterwards), 2 val and 4 train rows sampled; the log records the flag and the count, and the
    held-out sampled rows are validated on their own ("regen_sampled")."""
    tdir, _ = trained_target
    seen = _capture_prompts(monkeypatch, stop=False)
    rec = dt.train_drafter(data_dir, tdir, str(tmp_path), regen=8, seed=5, regen_sampled=0.5, **_REGEN_RUN)
    data, rng = tt.TokenData(data_dir), np.random.default_rng(5)
    want = np.concatenate([data.sample(rng, 4, 8, split="val"), data.sample(rng, 8, 8)])
    assert np.array_equal(seen["prompts"], want) and seen["seed"] == 5
    smp = seen["sampled"]
    assert smp.shape == (12,) and smp[:4].sum() == 2 and smp[4:].sum() == 4
    assert rec["args"]["regen_sampled"] == 0.5 and rec["regen"]["sampled_sequences"] == 6
    assert "regen_sampled" in rec["val"][-1] and "regen" in rec["val"][-1]
    with pytest.raises(ValueError, match=r"--regen-sampled 0.5: there is no regenerated text to sample"):
        dt.check_regen_sampled(0, 0.5)
    with pytest.raises(ValueError, match=r"--regen-sampled 2: expected a fraction"):
        dt.check_regen_sampled(8, 2)


class _Stop(Exception):
    """Raised by the fake regenerate once it has seen the prompts (the rest of a run is not needed)."""


def _capture_prompts(monkeypatch, stop=True) -> dict:
    """Record the prompts train_drafter regenerates from; then stop the run (``stop``) or regenerate for real."""
    seen, real = {}, dt.regenerate

    def spy(model, prompts, new_tokens, batch, device, max_seconds=0.0, keep_first=0, **kw):
        seen.update(prompts=np.array(prompts), keep_first=keep_first, **kw)
        if stop:
            raise _Stop
        return real(model, prompts, new_tokens, batch, device, max_seconds, keep_first, **kw)

    monkeypatch.setattr(dt, "regenerate", spy)
    return seen


def _docstring_corpus(path, copies=300):
    """tokens.npy: CODE (functions with and without docstrings) ``copies`` times + EOT; a byte-level BPE tokenizer
    of at most V ids trained on it (so the tiny target can read it)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    from tests.train.test_docstring_prompts import CODE

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator([CODE] * 5, trainers.BpeTrainer(vocab_size=V,
                                                            special_tokens=["<|endoftext|>", "<|mask|>", "<|pad|>"]))
    os.makedirs(path, exist_ok=True)
    tok.save(os.path.join(path, "tokenizer.json"))
    stream = np.array((tok.encode(CODE).ids + [0]) * copies, np.uint16)
    assert stream.max() < V
    np.save(os.path.join(path, "tokens.npy"), stream)
    return str(path), tok


_REGEN_RUN = dict(steps=1, batch=2, seq=SEQ, anchors=6, block=4, target_layers=(0, 1), regen_prompt=8, device="cpu",
                  attn="eager", experts="eager", **TINY_DRAFTER)


def test_regen_docstring_zero_regenerates_the_same_prompts_as_before(trained_target, data_dir, tmp_path,
                                                                      monkeypatch):
    """F = 0 (the default) draws exactly today's prompts: 4 val windows then 64 train windows from Generator(seed)."""
    tdir, _ = trained_target
    seen = _capture_prompts(monkeypatch)
    with pytest.raises(_Stop):
        dt.train_drafter(data_dir, tdir, str(tmp_path), regen=64, seed=5, **_REGEN_RUN)
    data, rng = tt.TokenData(data_dir), np.random.default_rng(5)
    want = np.concatenate([data.sample(rng, 4, 8, split="val"), data.sample(rng, 64, 8)])
    assert seen["keep_first"] == 4 and np.array_equal(seen["prompts"], want)


def test_regen_docstring_prompts_reach_the_regeneration(trained_target, tmp_path, monkeypatch):
    """F = 0.5 of 8 train + 4 val prompts: 2 held-out ones from the validation split's sites after 2 random val
    windows, 4 train ones shuffled in with 4 random windows; each ends with the closing quotes and the "\\n" id.
    The log records the fraction and the search; the held-out docstring rows are also validated on their own."""
    tdir, _ = trained_target
    d, tok = _docstring_corpus(tmp_path / "corpus")
    seen = _capture_prompts(monkeypatch, stop=False)
    rec = dt.train_drafter(d, tdir, str(tmp_path / "out"), regen=8, seed=2, regen_docstring=0.5, **_REGEN_RUN)
    data, rng = tt.TokenData(d), np.random.default_rng(2)
    doc_train, doc_val, _ = dsp.docstring_prompts(data.train, data.val, tok, rng, 4, 2, 8, 0.5)
    vp, tp = data.sample(rng, 2, 8, split="val"), data.sample(rng, 4, 8)
    want = np.concatenate([vp, doc_val, np.concatenate([tp, doc_train])[rng.permutation(8)]])
    assert seen["keep_first"] == 4 and np.array_equal(seen["prompts"], want)
    nl = tok.encode("\n").ids
    for p in np.concatenate([doc_val, doc_train]):
        assert p[-1:].tolist() == nl and tok.decode(p.tolist()).endswith(('"""\n', "'''\n"))
    log = json.load(open(tmp_path / "out" / "drafter_train_log.json"))
    assert log["args"]["regen_docstring"] == 0.5 and rec["args"]["regen_docstring"] == 0.5
    doc = log["regen"]["docstring"]
    assert (doc["fraction"], doc["train_prompts"], doc["val_prompts"]) == (0.5, 4, 2)
    assert doc["train"]["valid"] == 4 and doc["train"]["candidates"] >= doc["train"]["checked"] >= 4
    assert doc["seconds"] >= 0 and doc["sample"]
    assert log["val"][-1]["regen_docstring"]["blocks"] == 2 * 6 and log["val"][-1]["regen"]["blocks"] == 4 * 6


def test_regen_docstring_refused_before_the_target_loads(data_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(dt, "load_frozen_target", lambda *a, **k: pytest.fail("the target was loaded"))
    with pytest.raises(ValueError, match=r"--regen-docstring 0.5: the train split has only 0 valid .*, 32 asked"):
        dt.train_drafter(data_dir, "T", str(tmp_path), regen=64, regen_prompt=8, seq=SEQ, regen_docstring=0.5)
    for bad in (-0.5, 1.01, float("nan")):
        with pytest.raises(ValueError, match=rf"--regen-docstring {bad!r}: expected a fraction in \[0, 1\]"):
            dt.train_drafter(data_dir, "T", str(tmp_path), regen=64, regen_prompt=8, seq=SEQ, regen_docstring=bad)


def test_draft_batches_mix_regenerated_text_and_corpus_windows(data_dir):
    """--regen-mix M: round(M Bt) rows of a batch come from the regenerated sequences (halves up), the rest are corpus
    windows; without regenerated text every row is a corpus window whatever M is."""
    data = tt.TokenData(data_dir)
    regen = np.full((5, SEQ), 7, np.int64) + np.arange(5)[:, None] * 1000               # rows no window can equal
    for mix, batch, n_regen in ((0.5, 8, 4), (0.75, 8, 6), (1.0, 3, 3), (0.25, 2, 1), (0.0, 4, 0)):
        b = dt.DraftBatches(data, regen, SEQ, mix)
        rows = b(np.random.default_rng(0), batch)
        is_regen = (rows >= 1000).any(1) | (rows == 7).all(1)
        assert rows.shape == (batch, SEQ) and b.regen_count(batch) == n_regen == int(is_regen.sum()), mix
        assert not is_regen[:batch - n_regen].any()                                   # corpus windows first
    none = dt.DraftBatches(data, np.zeros((0, SEQ), np.int64), SEQ, 1.0)
    assert none.regen_count(8) == 0 and none(np.random.default_rng(0), 8).max() < V


def test_drafter_init_starts_from_saved_weights_and_records_them(trained_target, data_dir, tmp_path):
    """--init DIR: training starts from DIR's weights (at lr ~0 one step leaves them unchanged), the log names them
    by sha256 and keeps the earlier run's arguments; the regenerated-text share follows --regen-mix."""
    import hashlib

    tdir, _ = trained_target
    first = tmp_path / "first"
    dt.train_drafter(data_dir, tdir, str(first), regen=2, seed=1, **_REGEN_RUN)
    rec = dt.train_drafter(data_dir, tdir, str(tmp_path / "again"), regen=2, seed=2, lr=1e-30, regen_mix=1.0,
                           regen_anchors="generated", init=str(first), **_REGEN_RUN)
    a = dfl.DFlashDraftModel.from_pretrained(first).state_dict()
    b = dfl.DFlashDraftModel.from_pretrained(tmp_path / "again").state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sha = hashlib.sha256((first / "model.safetensors").read_bytes()).hexdigest()
    log = json.load(open(tmp_path / "again" / "drafter_train_log.json"))
    assert log["init"]["sha256"] == sha == rec["init"]["sha256"] and log["init"]["dir"] == str(first)
    assert log["init"]["args"]["seed"] == 1 and log["init"]["init"] is None
    assert log["init"]["gpu"] == json.load(open(first / "drafter_train_log.json"))["versions"]["gpu"]
    assert log["args"]["init"] == str(first) and log["args"]["regen_mix"] == 1.0
    assert log["args"]["regen_anchors"] == "generated"
    assert json.load(open(first / "drafter_train_log.json"))["weights_sha256"] == sha

    # the shipped pair's layout: weights in PAIR/drafter, their log beside the folder, tied to them by sha256
    pair = tmp_path / "pair"
    (pair / "drafter").mkdir(parents=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(first / f, pair / "drafter" / f)
    shutil.copyfile(first / "drafter_train_log.json", pair / "drafter_train_log.json")
    cfg = dfl.DFlashConfig.from_dict(json.load(open(first / "config.json")))
    _, info = dt.load_init(str(pair / "drafter"), cfg)
    assert info["sha256"] == sha and info["args"]["seed"] == 1
    stale = dict(json.load(open(first / "drafter_train_log.json")), weights_sha256="0" * 64)
    json.dump(stale, open(pair / "drafter_train_log.json", "w"))          # another run's log: not these weights'
    _, info = dt.load_init(str(pair / "drafter"), cfg)
    assert info["sha256"] == sha and "args" not in info


def test_drafter_init_of_another_architecture_refused_before_regenerating(trained_target, data_dir, tmp_path,
                                                                          monkeypatch):
    tdir, _ = trained_target
    first = tmp_path / "first"
    dt.train_drafter(data_dir, tdir, str(first), regen=0, **_REGEN_RUN)
    monkeypatch.setattr(dt, "regenerate", lambda *a, **k: pytest.fail("regenerated before the check"))
    other = dict(_REGEN_RUN, layers=1)
    with pytest.raises(ValueError, match=rf"--init {first}: its num_hidden_layers is 2, this run's is 1"):
        dt.train_drafter(data_dir, tdir, str(tmp_path / "x"), regen=2, init=str(first), **other)
    with pytest.raises(ValueError, match=r"--init .*: no config.json there"):
        dt.train_drafter(data_dir, tdir, str(tmp_path / "x"), regen=2, init=str(tmp_path), **_REGEN_RUN)
    with pytest.raises(ValueError, match=r"--regen-mix 2: expected a fraction"):
        dt.train_drafter(data_dir, tdir, str(tmp_path / "x"), regen=2, regen_mix=2, **_REGEN_RUN)
    with pytest.raises(ValueError, match=r"--regen-mix 0 with --regen 2: the regenerated text would never"):
        dt.train_drafter(data_dir, tdir, str(tmp_path / "x"), regen=2, regen_mix=0, **_REGEN_RUN)
    assert not (tmp_path / "x").exists()


def test_anchor_sampling():
    a = dt.sample_anchors(np.random.default_rng(0), 3, 10, 40, 8)
    assert a.shape == (3, 10) and a.min() >= 1 and a.max() <= 32
    assert all(len(set(r)) == 10 for r in a.tolist())
    with pytest.raises(ValueError):
        dt.sample_anchors(np.random.default_rng(0), 1, 33, 40, 8)
    b = dt.sample_anchors(np.random.default_rng(0), 200, 4, 40, 8, lo=29)                # 29..32: every one
    assert (b == np.arange(29, 33)).all()
    with pytest.raises(ValueError, match="the 4 possible anchors .* from position 29"):
        dt.sample_anchors(np.random.default_rng(0), 1, 5, 40, 8, lo=29)


def test_regen_anchors_generated_keeps_regenerated_blocks_out_of_the_prompt(data_dir):
    """--regen-anchors generated: a regenerated row's anchors are >= the prompt length (its root and labels are all
    generated text), a corpus row's still start anywhere; "all" draws exactly what the single draw always did (the
    recipes of the shipped drafters reproduce)."""
    data = tt.TokenData(data_dir)
    regen = np.zeros((5, SEQ), np.int64)
    P = 20
    gen = dt.DraftBatches(data, regen, SEQ, 0.5, regen_from=dt.check_regen_anchors("generated", 5, P, SEQ, 4, 6))
    a = gen.anchors(np.random.default_rng(3), 8, 6, 4)                                  # [8, 6]
    assert a.shape == (8, 6) and a[4:].min() >= P and a.max() <= SEQ - 4
    assert a[:4].min() < P                                                              # 4 x 6 draws from 1..44
    old = dt.sample_anchors(np.random.default_rng(3), 8, 6, SEQ, 4)
    for batches in (dt.DraftBatches(data, regen, SEQ, 0.5), dt.DraftBatches(data, regen[:0], SEQ, 0.5, regen_from=P)):
        assert (batches.anchors(np.random.default_rng(3), 8, 6, 4) == old).all()
    assert dt.check_regen_anchors("all", 0, P, SEQ, 4, 6) == 1
    for args, msg in ((("sometimes", 5, P, SEQ, 4, 6), "--regen-anchors 'sometimes': expected one of all, generated"),
                      (("generated", 0, P, SEQ, 4, 6), "no regenerated text"),
                      (("generated", 5, 40, SEQ, 4, 6), "--anchors 6 > the 5 anchors of the generated part")):
        with pytest.raises(ValueError, match=msg):
            dt.check_regen_anchors(*args)


# ------------------------------------------------------------------------------------------------ CLI
def test_cli_bad_flag_exits_2_with_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "kdtree_numba.train", "target", "--data", str(tmp_path), "--out",
                        str(tmp_path), "--no-such-flag"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert len(r.stderr.strip().splitlines()) == 1 and "error" in r.stderr


@pytest.mark.parametrize("argv", [["target", "--data", "D", "--out", "O", "--steps", "0"],
                                  ["drafter", "--data", "D", "--target", "T", "--out", "O", "--target-layers", "x"],
                                  ["all", "--data", "MISSING", "--out", "O"], ["bogus"],
                                  ["drafter", "--data", "D", "--target", "T", "--out", "O", "--regen-docstring", "nan"],
                                  ["all", "--data", "D", "--out", "O", "--regen-docstring", "-0.1"],
                                  ["all", "--data", "D", "--out", "O", "--regen-docstring", "1.5"],
                                  ["all", "--data", "D", "--out", "O", "--regen-mix", "1.5"],
                                  ["all", "--data", "D", "--out", "O", "--regen-sampled", "-1"],
                                  ["corpus", "--out", "O", "--vocab", "10"],
                                  ["all", "--data", "D", "--out", "O", "--init", "X"]])
def test_cli_errors_in_process(argv, capsys):
    from kdtree_numba.train.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_cli_out_checked_before_any_work_and_nothing_left(tmp_path, capsys, monkeypatch):
    """--out is a file, or a folder the filesystem refuses: one line, exit 2, before the data is even read; a
    writable --out that does not exist yet is probed and removed again (the run creates it when it writes)."""
    import errno

    from kdtree_numba.train import __main__ as train_main

    afile = tmp_path / "afile"
    afile.write_text("x")
    for argv, msg in [(["target", "--data", "MISSING", "--out", str(afile)], f"--out: {afile} exists and is not a "
                                                                             f"folder"),
                      (["corpus", "--out", str(afile)], "exists and is not a folder")]:
        with pytest.raises(SystemExit) as e:
            train_main.main(argv)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and msg in err[0]
    new = tmp_path / "a" / "b"
    with pytest.raises(SystemExit):                      # --data is missing: that error, and no folder left behind
        train_main.main(["target", "--data", "MISSING", "--out", str(new)])
    assert "no tokens.npy" in capsys.readouterr().err and not (tmp_path / "a").exists()

    def refuse(path, exist_ok=False):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)

    monkeypatch.setattr(train_main.os, "makedirs", refuse)
    with pytest.raises(SystemExit) as e:
        train_main.main(["target", "--data", "MISSING", "--out", str(new)])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and f"--out: cannot create the folder {new} (Read-only file system)" in err[0]


@pytest.mark.slow
def test_cli_all_end_to_end(data_dir, tmp_path):
    from kdtree_numba.train.__main__ import main

    out = tmp_path / "run"
    rc = main(["all", "--data", data_dir, "--out", str(out), "--device", "cpu", "--seq", str(SEQ),
               "--target-steps", "2", "--target-batch", "2", "--drafter-steps", "2", "--drafter-batch", "2",
               "--anchors", "4", "--block", "4", "--target-layers", "0,1", "--regen", "2", "--regen-prompt", "8",
               "--config-json", json.dumps(TINY_TARGET), "--heads", "4", "--kv-heads", "2", "--head-dim", "8",
               "--intermediate", "48", "--val-windows", "2"])
    assert rc == 0
    assert (out / "target" / "config.json").exists() and (out / "drafter" / "model.safetensors").exists()
    summary = json.load(open(out / "run_summary.json"))
    assert summary["total_seconds"] > 0


def test_cli_defaults_mirror_the_training_modules():
    from kdtree_numba.train import __main__ as cli

    for k in ("steps", "batch", "seq", "lr", "seed", "val_every"):
        assert cli.TARGET[k] == tt.DEFAULTS[k], k
    for k in ("seq", "seed", "steps", "batch", "anchors", "block", "layers", "lr", "regen", "regen_prompt",
              "regen_batch", "regen_max_seconds", "regen_docstring", "regen_mix", "regen_anchors", "val_every"):
        assert cli.DRAFTER[k] == dt.DEFAULTS[k], k
    assert (cli.DRAFTER["seq"], cli.DRAFTER["seed"]) == (cli.TARGET["seq"], cli.TARGET["seed"])    # one --seq, --seed
    assert tuple(int(x) for x in cli.DRAFTER["target_layers"].split(",")) == dt.DEFAULTS["target_layers"]
    assert cli.TARGET_LAYERS == tt.DEFAULT_TARGET_CONFIG["num_hidden_layers"]


def test_cli_refuses_target_layers_beyond_the_target_before_training(data_dir, capsys):
    from kdtree_numba.train.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["all", "--data", data_dir, "--out", "O", "--config-json", '{"num_hidden_layers": 3}'])  # 1,2,3
    assert e.value.code == 2 and "--target-layers" in capsys.readouterr().err


def test_cli_refuses_a_bad_init_mix_or_anchors_before_training(data_dir, trained_target, tmp_path, capsys, monkeypatch):
    """--init of another architecture or without weights, --regen-mix without regenerated text or 0 with it,
    --regen-anchors generated without regenerated text or with too short a generated part: one line, exit 2,
    nothing loaded or trained."""
    from kdtree_numba.train.__main__ import main

    monkeypatch.setattr(dt, "load_frozen_target", lambda *a, **k: pytest.fail("the target was loaded"))
    tdir, _ = trained_target
    d = tmp_path / "d"
    d.mkdir()
    (d / "config.json").write_text(json.dumps(dfl.DFlashConfig(
        hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
        head_dim=8, vocab_size=V, block_size=4, num_target_layers=3, target_layer_ids=(0, 1),
        max_position_embeddings=128).to_dict()))
    base = ["drafter", "--data", data_dir, "--target", tdir, "--out", str(tmp_path / "o"), "--target-layers", "0,1",
            "--block", "4", "--heads", "4", "--kv-heads", "2", "--head-dim", "8", "--intermediate", "48"]
    for extra, msg in ((["--init", str(d)], "its num_hidden_layers is 1, this run's is 2"),
                       (["--init", str(d), "--layers", "1"], "no model.safetensors there"),
                       (["--init", str(tmp_path / "none")], "no config.json there"),
                       (["--regen", "0", "--regen-mix", "0.5"], "no regenerated text to mix in"),
                       (["--regen-mix", "0"], "would never be trained on"),
                       (["--regen", "0", "--regen-anchors", "generated"], "--regen-anchors generated: there is no "
                                                                           "regenerated text"),
                       (["--regen-anchors", "generated", "--seq", "64", "--regen-prompt", "40", "--anchors", "30"],
                        "--anchors 30 > the 21 anchors of the generated part"),
                       (["--regen-anchors", "middle"], "invalid choice: 'middle'"),
                       (["--regen", "0", "--regen-sampled", "0.5"], "--regen-sampled 0.5: there is no regenerated "
                                                                     "text to sample"),
                       (["--regen", "0", "--regen-prompt", "32"], "--regen-prompt 32: there is no regenerated text"),
                       (["--regen", "0", "--regen-max-seconds", "0"], "--regen-max-seconds 0: there is no "
                                                                       "regenerated text"),
                       (["--regen", "0", "--regen-docstring", "0.4"], "--regen-docstring 0.4: there is no "
                                                                       "regenerated text")):
        with pytest.raises(SystemExit) as e:
            main(base + extra)
        err = capsys.readouterr().err.strip().splitlines()
        assert e.value.code == 2 and len(err) == 1 and msg in err[0], (extra, err)


def test_cli_refuses_a_target_config_before_training(data_dir, capsys, monkeypatch):
    """--config-json is read as the engine reads a checkpoint's config, before anything trains: a -1-layer model,
    a misspelt field, too few positions for --seq, a vocabulary below the corpus's ids - one line, exit 2."""
    from kdtree_numba.train.__main__ import main

    monkeypatch.setattr(tt, "train_target", lambda *a, **k: pytest.fail("the target was trained"))
    for cfg, msg in (({"num_hidden_layers": -1}, "--config-json: num_hidden_layers: got -1, expected a positive"),
                     ({"hiden_size": 64}, "--config-json: unknown field 'hiden_size'"),
                     ({"max_position_embeddings": 4}, f"max_position_embeddings 4 < --seq {SEQ}"),
                     ({"vocab_size": 3}, "--config-json: vocab_size 3 does not hold the corpus")):
        for cmd in ("target", "all"):
            with pytest.raises(SystemExit) as e:
                main([cmd, "--data", data_dir, "--out", "O", "--seq", str(SEQ), "--config-json", json.dumps(cfg)])
            err = capsys.readouterr().err.strip().splitlines()
            assert e.value.code == 2 and len(err) == 1 and msg in err[0], (cfg, err)


def test_cli_refuses_too_few_docstring_sites_before_training(data_dir, trained_target, capsys, monkeypatch):
    """The fake corpus has no docstrings: --regen-docstring exits 2 with one line, before anything trains."""
    from kdtree_numba.train.__main__ import main

    monkeypatch.setattr(tt, "train_target", lambda *a, **k: pytest.fail("the target was trained"))
    tdir, _ = trained_target
    for argv in (["drafter", "--target", tdir, "--target-layers", "0,1"], ["all"]):
        with pytest.raises(SystemExit) as e:
            main(argv + ["--data", data_dir, "--out", "O", "--regen-docstring", "0.25"])
        err = capsys.readouterr().err.strip()
        assert e.value.code == 2 and len(err.splitlines()) == 1
        assert "--regen-docstring 0.25: the train split has only 0 valid docstring sites" in err and "512 asked" in err


def test_cli_corpus_calls_corpus_build(tmp_path, monkeypatch, capsys):
    from kdtree_numba.train import corpus
    from kdtree_numba.train.__main__ import main

    seen = {}

    def fake_build(out_dir, cache_dir=None, vocab_size=4096):
        seen.update(out_dir=out_dir, cache_dir=cache_dir, vocab_size=vocab_size)
        return {"tokens": 123, "files": ["a"]}

    monkeypatch.setattr(corpus, "build", fake_build)
    assert main(["corpus", "--out", str(tmp_path), "--cache", "C", "--vocab", "512"]) == 0
    assert seen == {"out_dir": str(tmp_path), "cache_dir": "C", "vocab_size": 512}
    assert '"tokens": 123' in capsys.readouterr().out
