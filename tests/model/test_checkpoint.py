"""Checkpoint loading: quantized and bf16 weights, sharded and Kimi-K2.5 layouts, and every way a checkpoint can be
wrong (each error names the key, field or value; nothing is returned half-loaded)."""
import json
import os
import shutil

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.model import checkpoint as ck

from . import hf_models as hf

pytestmark = [pytest.mark.skipif(hf.torch is None, reason="needs the `ref` extra (torch + transformers)"),
              pytest.mark.usefixtures("numpy_backend")]
IDS = np.arange(3, 40, 3) % 96


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny")
    hf.make("plain", hidden_size=64, moe_intermediate_size=32).save_pretrained(path)
    return path


def rewrite(src, dst, transform, config_update=None):
    """Copy an HF dir, passing its tensors (torch) through ``transform(key, tensor) -> {key: tensor}``."""
    from safetensors.torch import load_file, save_file

    os.makedirs(dst, exist_ok=True)
    tensors = load_file(os.path.join(src, "model.safetensors"))
    out = {}
    for k, v in tensors.items():
        out.update(transform(k, v))
    save_file(out, os.path.join(dst, "model.safetensors"))
    cfg = json.load(open(os.path.join(src, "config.json")))
    if config_update:
        config_update(cfg)
    json.dump(cfg, open(os.path.join(dst, "config.json"), "w"))
    return dst


def assert_quantized_model_close(full_dir, quant_dir, deq):
    """The quantized checkpoint runs exactly the model of its dequantized weights, which stays close to the
    full-precision model (same greedy next tokens almost everywhere, correlated logits)."""
    cfg, state = ck.load_state_dict(str(full_dir))
    state.update(deq)
    got = kd.load_target(quant_dir).logits(IDS)
    np.testing.assert_array_equal(got, kd.Target.from_state_dict(cfg, state).logits(IDS))
    ref = kd.load_target(full_dir).logits(IDS)
    assert not np.array_equal(got, ref)
    assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.9


def is_linear(k, v):
    return k.endswith("proj.weight") and v.ndim == 2


def test_fp8_block_checkpoint_dequantizes_exactly(tiny_dir, tmp_path):
    torch = hf.torch
    deq = {}

    def fp8(k, v):
        if not is_linear(k, v):
            return {k: v}
        rows, cols = v.shape
        scale = torch.zeros((-(-rows // 128), -(-cols // 128)))
        q = torch.empty_like(v)
        for i in range(scale.shape[0]):
            for j in range(scale.shape[1]):
                blk = v[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
                scale[i, j] = blk.abs().max() / 448.0
                q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = blk / scale[i, j]
        w8 = q.to(torch.float8_e4m3fn)
        deq[k] = (w8.float() * scale.repeat_interleave(128, 0)[:rows].repeat_interleave(128, 1)[:, :cols]).numpy()
        return {k: w8, k + "_scale_inv": scale}

    path = rewrite(tiny_dir, tmp_path / "fp8", fp8, lambda c: c.update(quantization_config={
        "quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}))
    cfg, state = ck.load_state_dict(str(path))
    for k, w in deq.items():
        np.testing.assert_array_equal(state[k], w)                      # exact dequantization
    assert_quantized_model_close(tiny_dir, path, deq)


def test_int4_packed_experts_dequantize_exactly(tiny_dir, tmp_path):
    torch = hf.torch
    deq = {}

    def int4(k, v):
        if ".experts." not in k:
            return {k: v}
        rows, cols = v.shape
        g = v.reshape(rows, cols // 32, 32)
        scale = (g.abs().amax(-1) / 7.0).to(torch.bfloat16)                       # [rows, cols/32]
        q = torch.clamp(torch.round(g / scale.float()[..., None]), -8, 7).to(torch.int64).reshape(rows, cols)
        nib = (q + 8).reshape(rows, cols // 8, 8)
        packed = sum(nib[..., i] << (4 * i) for i in range(8))
        packed = torch.where(packed >= 2 ** 31, packed - 2 ** 32, packed).to(torch.int32)
        deq[k] = (q.float() * scale.float().repeat_interleave(32, 1)).numpy()
        base = k[:-len("weight")]
        return {base + "weight_packed": packed, base + "weight_scale": scale,
                base + "weight_shape": torch.tensor([rows, cols], dtype=torch.int32)}

    qc = {"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "symmetric": True,
                                                    "group_size": 32, "strategy": "group"}, "targets": ["Linear"]}}}
    path = rewrite(tiny_dir, tmp_path / "int4", int4, lambda c: c.update(quantization_config=qc))
    _, state = ck.load_state_dict(str(path))
    assert deq
    for k, w in deq.items():
        np.testing.assert_array_equal(state[k], w)
    assert_quantized_model_close(tiny_dir, path, deq)


def test_bf16_checkpoint_upcasts(tiny_dir, tmp_path):
    torch = hf.torch
    path = rewrite(tiny_dir, tmp_path / "bf16", lambda k, v: {k: v.to(torch.bfloat16)})
    _, state = ck.load_state_dict(str(path))
    from safetensors.torch import load_file
    raw = load_file(os.path.join(tiny_dir, "model.safetensors"))
    k = "model.layers.0.self_attn.kv_b_proj.weight"
    np.testing.assert_array_equal(state[k], raw[k].to(torch.bfloat16).float().numpy())
    np.testing.assert_array_equal(ck.fp32_to_bf16_bits(raw[k].numpy()),
                                  raw[k].to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16))


def test_sharded_checkpoint(tmp_path):
    model = hf.make("plain")
    model.save_pretrained(tmp_path, max_shard_size="20KB")
    assert os.path.exists(tmp_path / "model.safetensors.index.json")
    got = kd.load_target(tmp_path).logits(IDS)
    assert np.abs(got - hf.logits_f64(hf.load_f64(tmp_path), IDS)).max() <= 1e-4


def test_kimi_k25_layout_nested_config_and_prefixed_keys(tiny_dir, tmp_path):
    def nest(cfg):
        text = dict(cfg)
        cfg.clear()
        cfg.update(model_type="kimi_k25", architectures=["KimiK25ForConditionalGeneration"], text_config=text,
                   vision_config={"hidden_size": 8})

    torch = hf.torch

    def prefix(k, v):
        return {"language_model." + k: v, "vision_tower.patch_embed.weight": torch.zeros(2, 2)}

    path = rewrite(tiny_dir, tmp_path / "k25", prefix, nest)
    target = kd.load_target(path)
    assert target.config.weight_prefix == "language_model."
    np.testing.assert_array_equal(target.logits(IDS), kd.load_target(tiny_dir).logits(IDS))


def test_hub_style_config_with_rope_scaling(tiny_dir, tmp_path):
    def hub(cfg):
        cfg.pop("rope_parameters")
        cfg.update(rope_theta=10000.0, rope_scaling={"type": "yarn", "factor": 4.0,
                                                     "original_max_position_embeddings": 128, "beta_fast": 32,
                                                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0})

    path = rewrite(tiny_dir, tmp_path / "hub", lambda k, v: {k: v}, hub)
    cfg = kd.load_target(path).config
    assert cfg.rope_scaling["factor"] == 4.0 and cfg.rope_theta == 10000.0
    assert cfg.softmax_scale == pytest.approx(20 ** -0.5 * (0.1 * np.log(4.0) + 1) ** 2)


# ------------------------------------------------------------------------------------------------ bad checkpoints
def broken(tiny_dir, tmp_path, transform=lambda k, v: {k: v}, config_update=None):
    return rewrite(tiny_dir, tmp_path / "broken", transform, config_update)


@pytest.mark.parametrize("transform, msg", [
    (lambda k, v: {} if k == "model.layers.1.mlp.experts.3.up_proj.weight" else {k: v},
     r"model.layers.1.mlp.experts.3.up_proj.weight: missing"),
    (lambda k, v: {k: v, "model.layers.0.mlp.bogus.weight": v.clone()} if k == "model.norm.weight" else {k: v},
     r"model.layers.0.mlp.bogus.weight: unexpected tensor"),
    (lambda k, v: {k: v[:-1]} if k == "model.layers.2.self_attn.kv_b_proj.weight" else {k: v},
     r"kv_b_proj.weight: expected shape \(96, 16\), got \(95, 16\)"),
])
def test_bad_tensors_name_the_key(tiny_dir, tmp_path, transform, msg):
    path = broken(tiny_dir, tmp_path, transform)
    with pytest.raises(ck.CheckpointError, match=msg):
        kd.load_target(path)


@pytest.mark.parametrize("update, msg", [
    (lambda c: c.update(model_type="llama", architectures=["LlamaForCausalLM"]), "model_type: got 'llama'"),
    # model_type says DeepSeek-V3 but the classes or the head size say otherwise: refused, not loaded as V3
    (lambda c: c.update(architectures=["LlamaForCausalLM"]), "architectures: got \\['LlamaForCausalLM'\\]"),
    (lambda c: c.update(head_dim=c["qk_rope_head_dim"] + 2), "head_dim: got"),
    (lambda c: c.update(quantization_config={"quant_method": "awq"}), "quant_method: got 'awq'"),
    (lambda c: c.update(num_experts_per_tok=9), "num_experts_per_tok: got 9"),
    (lambda c: c.update(n_group=3), "n_group: got 3"),
    (lambda c: c.update(topk_group=5), "topk_group: got 5"),
    (lambda c: c.update(qk_rope_head_dim=7), "qk_rope_head_dim: got 7"),
    (lambda c: c.update(hidden_act="gelu"), "hidden_act: got 'gelu'"),
    (lambda c: c.update(rope_parameters={"rope_type": "longrope", "rope_theta": 1e4}), "rope_scaling.type"),
])
def test_bad_configs_name_the_field(tiny_dir, tmp_path, update, msg):
    path = broken(tiny_dir, tmp_path, config_update=update)
    with pytest.raises(ValueError, match=msg):
        kd.load_target(path)


def test_missing_paths_and_files(tmp_path, tiny_dir):
    with pytest.raises(ck.CheckpointError, match="is not a directory"):
        kd.load_target(tmp_path / "nope")
    with pytest.raises(ck.CheckpointError, match="has no config.json"):
        kd.load_target(tmp_path)
    d = tmp_path / "noweights"
    d.mkdir()
    shutil.copy(tiny_dir / "config.json", d / "config.json")
    with pytest.raises(ck.CheckpointError, match="no .safetensors files"):
        kd.load_target(d)
    (d / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{abc}")
    with pytest.raises(ck.CheckpointError, match="not a safetensors file"):
        kd.load_target(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="config: .* is not valid JSON"):
        kd.load_target(d)


def test_truncated_safetensors(tiny_dir, tmp_path):
    d = tmp_path / "trunc"
    shutil.copytree(tiny_dir, d)
    data = (d / "model.safetensors").read_bytes()
    (d / "model.safetensors").write_bytes(data[:len(data) - 100])
    with pytest.raises(ck.CheckpointError, match="truncated file"):
        kd.load_target(d)


def test_a_quantization_config_no_tensor_uses_warns_and_loads(tiny_dir, tmp_path):
    """bf16 / fp32 weights beside a leftover fp8 quantization_config (a conversion that kept the config's field):
    the weights load as they are, with a warning naming the mismatch - and the logits are the unquantized model's."""
    path = broken(tiny_dir, tmp_path, config_update=lambda c: c.update(
        quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}))
    with pytest.warns(ck.SkippedWeightsWarning, match="quantization_config says fp8, but no tensor is stored fp8"):
        target = kd.load_target(path)
    np.testing.assert_array_equal(target.logits(IDS), kd.load_target(tiny_dir).logits(IDS))
