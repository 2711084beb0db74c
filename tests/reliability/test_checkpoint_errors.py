"""#16 items 3, 7 and 8 (model part): a checkpoint is trusted in nothing. Safetensors headers (offsets, sizes,
dtypes, JSON shape), config.json fields, quantization settings and the shard index are checked when the checkpoint
is loaded; each problem is a ValueError naming the file, the key or field, the value and what was expected.
Weights the config does not use are refused (only real MTP layers are skipped, with a warning), and state dicts
never alias a target's weights."""
import json
import os
import shutil

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.model import checkpoint as ck

from .helpers import INDEX, edit_config, read_raw, same_state, save_sharded, tiny, write_raw, write_tensors_raw

pytestmark = pytest.mark.usefixtures("numpy_backend")
NORM_A, NORM_B = "model.layers.0.input_layernorm.weight", "model.layers.0.post_attention_layernorm.weight"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    with kd.backend.use("numpy"):
        t = tiny(4)
        path = tmp_path_factory.mktemp("ok") / "ckpt"
        t.save(path)
        return t.state_dict(), path


@pytest.fixture
def ckpt(saved, tmp_path):
    """A fresh copy of the saved tiny checkpoint and its safetensors file."""
    path = tmp_path / "ckpt"
    shutil.copytree(saved[1], path)
    return path, str(path / "model.safetensors")


def refused(path, *needles, error=ValueError):
    """Loading raises ``error`` and its message names every needle."""
    with pytest.raises(error) as e:
        kd.load_target(path)
    msg = str(e.value)
    for n in needles:
        assert str(n) in msg, f"{n!r} not in {msg!r}"
    return msg


# ------------------------------------------------------------------------------------------ item 3: offsets, sizes
def _mutate_entry(st, key, **fields):
    header, data = read_raw(st)
    header[key].update(fields)
    write_raw(st, header, data)
    return header


def test_negative_offsets_are_refused(ckpt):
    """Offsets before the data start read header bytes as weights (they loaded silently before)."""
    path, st = ckpt
    header, _ = read_raw(st)
    lo, hi = header[NORM_A]["data_offsets"]
    _mutate_entry(st, NORM_A, data_offsets=[-16, hi - lo - 16])
    refused(path, st, NORM_A, "-16", "non-negative", error=ck.CheckpointError)


def test_overlapping_offsets_are_refused(ckpt):
    """Two same-shape tensors sharing bytes loaded silently before; now the overlap is named."""
    path, st = ckpt
    header, _ = read_raw(st)
    _mutate_entry(st, NORM_B, data_offsets=header[NORM_A]["data_offsets"])
    refused(path, st, "overlap", str(header[NORM_A]["data_offsets"][0]), error=ck.CheckpointError)


@pytest.mark.parametrize("how, needles", [
    ("past_end", ["end past the data", "truncated"]),
    ("reversed", ["begin after they end", "begin <= end"]),
    ("wrong_size", ["span", "expected"]),
    ("hole", ["unused"]),
])
def test_bad_offsets_are_named(ckpt, how, needles):
    path, st = ckpt
    header, data = read_raw(st)
    lo, hi = header[NORM_A]["data_offsets"]
    offs = {"past_end": [len(data) + 8, len(data) + 8 + hi - lo], "reversed": [hi, lo], "wrong_size": [lo, hi + 4],
            "hole": None}[how]
    if how == "hole":                               # the whole data moved 8 bytes on: bytes 0..8 belong to no tensor
        for info in header.values():
            if isinstance(info, dict) and "data_offsets" in info:
                info["data_offsets"] = [o + 8 for o in info["data_offsets"]]
        write_raw(st, header, b"\0" * 8 + data)
    else:
        _mutate_entry(st, NORM_A, data_offsets=offs)
    refused(path, st, *needles, error=ck.CheckpointError)


def test_header_length_into_the_padding_is_refused(ckpt):
    """A header length 8 bytes short still parses (the padding is spaces) but shifts every tensor 8 bytes: the
    bytes after the last tensor betray it."""
    path, st = ckpt
    header, data = read_raw(st)
    text = json.dumps(header, separators=(",", ":"))
    write_raw(st, None, data, header_text=text, pad=16)
    with open(st, "r+b") as f:
        n = int.from_bytes(f.read(8), "little")
        f.seek(0)
        f.write((n - 8).to_bytes(8, "little"))
    refused(path, st, "8 bytes follow the last tensor", error=ck.CheckpointError)


@pytest.mark.parametrize("n, needle", [(2 ** 40, "header length 1099511627776"), (1, "header length 1")])
def test_impossible_header_length(ckpt, n, needle):
    path, st = ckpt
    with open(st, "r+b") as f:
        f.write(n.to_bytes(8, "little"))
    refused(path, st, needle, "expected 2 ..", error=ck.CheckpointError)


def test_a_repeated_tensor_name_is_refused(ckpt):
    path, st = ckpt
    header, data = read_raw(st)
    text = json.dumps(header, separators=(",", ":"))
    dup = f'"{NORM_A}":{json.dumps(header[NORM_A], separators=(",", ":"))}'
    write_raw(st, None, data, header_text=text[:-1] + "," + dup + "}")
    refused(path, st, NORM_A, "appears twice", error=ck.CheckpointError)


# ------------------------------------------------------------------------------------------ item 7: malformed headers
@pytest.mark.parametrize("mutate, needles", [
    (lambda h: h[NORM_A].pop("data_offsets"), [NORM_A, "no data_offsets"]),
    (lambda h: h[NORM_A].update(shape="64"), [NORM_A, "shape '64'", "list of non-negative integers"]),
    (lambda h: h[NORM_A].update(shape=[float("nan")]), [NORM_A, "shape [nan]"]),
    (lambda h: h[NORM_A].update(shape=[True]), [NORM_A, "shape [True]"]),
    (lambda h: h[NORM_A].update(dtype=7), [NORM_A, "dtype 7", "expected one of"]),
    (lambda h: h[NORM_A].update(dtype="F4"), [NORM_A, "dtype 'F4'"]),
    (lambda h: h[NORM_A].update(data_offsets=[0, 1, 2]), [NORM_A, "data_offsets [0, 1, 2]", "[begin, end]"]),
    (lambda h: h[NORM_A].update(data_offsets="0..256"), [NORM_A, "data_offsets '0..256'"]),
    (lambda h: h.update({NORM_A: [1, 2]}), [NORM_A, "header entry is [1, 2]", "expected an object"]),
    (lambda h: h.update({"__metadata__": ["x"]}), ["__metadata__: got ['x']", "expected an object of strings"]),
])
def test_malformed_header_entries_are_named(ckpt, mutate, needles):
    path, st = ckpt
    header, data = read_raw(st)
    mutate(header)
    write_raw(st, header, data)
    refused(path, st, *needles, error=ck.CheckpointError)


@pytest.mark.parametrize("text, needle", [("[1, 2]", "got a JSON list, expected an object"),
                                          ('"abc"', "got a JSON str"),
                                          ("\xff\xfe{}", "not a safetensors file")])
def test_a_header_that_is_not_an_object(ckpt, text, needle):
    path, st = ckpt
    _, data = read_raw(st)
    write_raw(st, None, data, header_text=text)
    refused(path, st, needle, error=ck.CheckpointError)


# ------------------------------------------------------------------------------------------ item 7: config.json
NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize("change, field, value", [
    (lambda c: c.update(hidden_size="64"), "hidden_size", "'64'"),
    (lambda c: c.update(hidden_size=0), "hidden_size", "0"),
    (lambda c: c.update(vocab_size=-1), "vocab_size", "-1"),
    (lambda c: c.update(num_hidden_layers=True), "num_hidden_layers", "True"),
    (lambda c: c.update(num_attention_heads=4.0), "num_attention_heads", "4.0"),
    (lambda c: c.update(max_position_embeddings=0), "max_position_embeddings", "0"),
    (lambda c: c.update(moe_intermediate_size=[32]), "moe_intermediate_size", "[32]"),
    (lambda c: c.update(n_group=3), "n_group", "3"),
    (lambda c: c.update(n_group=0), "n_group", "0"),
    (lambda c: c.update(num_experts_per_tok=None, n_routed_experts=-8), "n_routed_experts", "-8"),
    (lambda c: c.update(rms_norm_eps="1e-6"), "rms_norm_eps", "'1e-6'"),
    (lambda c: c.update(rms_norm_eps=NAN), "rms_norm_eps", "nan"),
    (lambda c: c.update(routed_scaling_factor=NAN), "routed_scaling_factor", "nan"),
    (lambda c: c.update(routed_scaling_factor=-2.5), "routed_scaling_factor", "-2.5"),
    (lambda c: c.update(norm_topk_prob="yes"), "norm_topk_prob", "'yes'"),
    (lambda c: c.update(tie_word_embeddings=1), "tie_word_embeddings", "1"),
    (lambda c: c.update(eos_token_id="</s>"), "eos_token_id", "'</s>'"),
    (lambda c: c.update(eos_token_id=[1, 999]), "eos_token_id", "[1, 999]"),
    (lambda c: c.update(bos_token_id=64), "bos_token_id", "64"),
    (lambda c: c.update(architectures=5, model_type=None), "architectures", "5"),
    (lambda c: c.update(text_config="deepseek"), "text_config", "'deepseek'"),
    (lambda c: c.update(text_config=[1]), "text_config", "[1]"),
    (lambda c: c.update(rope_parameters=["yarn"]), "rope_parameters", "['yarn']"),
    (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": INF}), "rope_theta", "inf"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4,      # no factor: HF divides by it
                                         "original_max_position_embeddings": 0}), "original_max_position_embeddings",
     "0"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": NAN,
                                         "original_max_position_embeddings": 64}), "factor", "nan"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 0.0,
                                         "original_max_position_embeddings": 64}), "factor", "0.0"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0,
                                         "original_max_position_embeddings": "64"}),
     "original_max_position_embeddings", "'64'"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1.0, "factor": 4.0,
                                         "original_max_position_embeddings": 64}), "rope_theta", "1.0"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "beta_fast": -1,
                                         "original_max_position_embeddings": 64}), "beta_fast", "-1"),
    (lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "mscale": "1",
                                         "original_max_position_embeddings": 64}), "mscale", "'1'"),
    # the newer rope_parameters beside the older rope_scaling / rope_theta that say otherwise (the first won silently)
    (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e4}, rope_theta=0),
     "rope_theta", "0"),
    (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e4}, rope_theta=5e5),
     "rope_theta", "500000"),
    (lambda c: c.update(rope_parameters={"rope_type": "default", "rope_theta": 1e4},
                        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}),
     "rope_parameters and rope_scaling describe different RoPE", "yarn"),
    (lambda c: c.update(quantization_config="fp8"), "quantization_config", "'fp8'"),
    (lambda c: c.update(quantization_config={"quant_method": "fp8", "weight_block_size": [0, 128]}),
     "weight_block_size", "[0, 128]"),
    (lambda c: c.update(quantization_config={"quant_method": "compressed-tensors", "config_groups": [1]}),
     "config_groups", "[1]"),
    (lambda c: c.update(quantization_config={"quant_method": "compressed-tensors",
                                             "config_groups": {"g": {"weights": {"group_size": 0}}}}),
     "group_size", "0"),
    (lambda c: c.update(quantization_config={"quant_method": "compressed-tensors", "config_groups": {"g": 3}}),
     "config_groups.g", "3"),
])
def test_bad_config_values_are_named_at_load(ckpt, change, field, value):
    path, _ = ckpt
    edit_config(path, change)
    msg = refused(path, path / "config.json", field, value)
    assert "expected" in msg


def test_rope_in_both_forms_loads_when_they_agree(ckpt):
    """rope_parameters beside the same RoPE as rope_scaling + rope_theta (a config converted between transformers
    versions) is not a conflict."""
    path, _ = ckpt
    yarn = {"factor": 4.0, "original_max_position_embeddings": 64, "beta_fast": 32.0, "beta_slow": 1.0}
    edit_config(path, lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, **yarn},
                                         rope_scaling={"type": "yarn", **yarn}, rope_theta=1e4))
    cfg = kd.load_target(path).config
    assert cfg.rope_theta == 1e4 and cfg.rope_scaling["factor"] == 4.0
    edit_config(path, lambda c: c.pop("rope_theta"))                # the older form without its own theta
    assert kd.load_target(path).config.rope_theta == 1e4


@pytest.mark.parametrize("change, needle", [
    (lambda c: c.update(num_hidden_layers=2 ** 62), "model.layers.2.input_layernorm.weight: missing"),
    (lambda c: c.update(n_routed_experts=2 ** 62, n_group=1, topk_group=1), "experts.8.gate_proj.weight: missing"),
])
def test_a_config_claiming_huge_counts_is_refused_at_once(ckpt, change, needle):
    """The loader never enumerates 2**62 layers or experts before the files have shown they hold them."""
    path, _ = ckpt
    edit_config(path, change)
    refused(path, needle, "the config asks for", error=ck.CheckpointError)


def test_config_that_is_not_an_object(ckpt):
    path, _ = ckpt
    (path / "config.json").write_text("[1, 2]")
    refused(path, path / "config.json", "expected a JSON object")


# ------------------------------------------------------------------------------------------ item 7: quantized weights
KEY = "model.layers.1.mlp.experts.0.up_proj"          # [32, 64] in the tiny MoE layer


def _requantize(st, entries, drop):
    """Replace tensor ``drop`` of file ``st`` by raw ``entries``."""
    header, data = read_raw(st)
    header.pop("__metadata__", None)
    keep = [(k, v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]])
            for k, v in header.items() if k != drop]
    write_tensors_raw(st, keep + entries)


def test_zero_size_fp8_blocks_are_named(ckpt):
    path, st = ckpt
    codes = np.full((32, 64), 0x38, np.uint8).tobytes()                      # e4m3 1.0
    _requantize(st, [(KEY + ".weight", "F8_E4M3", [32, 64], codes),
                     (KEY + ".weight_scale_inv", "F32", [1, 1], np.ones(1, np.float32).tobytes())], KEY + ".weight")
    edit_config(path, lambda c: c.update(quantization_config={"quant_method": "fp8", "weight_block_size": [0, 128]}))
    refused(path, path / "config.json", "weight_block_size", "[0, 128]", "two positive integers")
    edit_config(path, lambda c: c.update(quantization_config={"quant_method": "fp8", "weight_block_size": [128, 128]}))
    assert np.all(kd.load_target(path).state_dict()[KEY + ".weight"] == 1.0)     # the same file loads when sane
    with pytest.raises(ck.CheckpointError, match=r"block: got \(0, 128\)"):
        ck.dequant_fp8(np.ones((4, 4), np.float32), np.ones((1, 1), np.float32), (0, 128))


INT4 = {"quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"g": {"weights": {"num_bits": 4, "symmetric": True, "group_size": 32}}}}


@pytest.mark.parametrize("scale_shape, wshape, needles", [
    ([32, 0], [32, 64], [KEY + ".weight_scale", "(32, 0)", "groups > 0"]),
    ([32, 2], [64], [KEY + ".weight_shape", "[64]", "two positive integers"]),
    ([32, 1], [32, 64], [KEY + ".weight_scale", "groups of 64 columns", "group_size 32"]),
])
def test_bad_int4_groups_are_named(ckpt, scale_shape, wshape, needles):
    path, st = ckpt
    packed = np.full((32, 8), 0x88888888 - 2 ** 32, np.int32).tobytes()       # every nibble 8: q = 0
    scale = np.ones(scale_shape, np.float32).tobytes()
    _requantize(st, [(KEY + ".weight_packed", "I32", [32, 8], packed),
                     (KEY + ".weight_scale", "F32", scale_shape, scale),
                     (KEY + ".weight_shape", "I32", [len(wshape)], np.array(wshape, np.int32).tobytes())],
                KEY + ".weight")
    edit_config(path, lambda c: c.update(quantization_config=INT4))
    refused(path, *needles, error=ck.CheckpointError)
    with pytest.raises(ck.CheckpointError, match="groups > 0"):
        ck.dequant_int4(np.zeros((2, 1), np.int32), np.zeros((2, 0), np.float32), [2, 8])


# ------------------------------------------------------------------------------------------ item 7: the shard index
@pytest.fixture
def sharded(saved, tmp_path):
    path = tmp_path / "sharded"
    with kd.backend.use("numpy"):
        save_sharded(kd.Target.from_state_dict(kd.load_target(saved[1]).config, saved[0]), path)
    return path


@pytest.mark.parametrize("value, needle", [(5, "got 5"), (["a.safetensors"], "got ['a.safetensors']"),
                                           ("../outside.safetensors", "'../outside.safetensors'"),
                                           ("ABS", "outside.safetensors"),
                                           ("sub/model-00001-of-00002.safetensors", "'sub/model-00001"),
                                           ("config.json", "'config.json'")])
def test_weight_map_values_must_be_shard_names_in_the_folder(sharded, value, needle):
    """A shard outside the folder (here a real file there) used to load; now any non-name is refused."""
    shutil.copy(sharded / "model-00001-of-00002.safetensors", sharded.parent / "outside.safetensors")
    os.makedirs(sharded / "sub", exist_ok=True)
    shutil.copy(sharded / "model-00001-of-00002.safetensors", sharded / "sub")
    if value == "ABS":
        value = str(sharded.parent / "outside.safetensors")
    index = json.loads((sharded / INDEX).read_text())
    key = next(k for k, f in index["weight_map"].items() if f == "model-00001-of-00002.safetensors")
    index["weight_map"][key] = value
    (sharded / INDEX).write_text(json.dumps(index))
    refused(sharded, sharded / INDEX, f"weight_map['{key}']", needle, "expected the name of a .safetensors file",
            error=ck.CheckpointError)


@pytest.mark.parametrize("doc, needle", [("[]", "got a JSON list"), ('{"weight_map": [1]}', "weight_map: got [1]"),
                                         ('{"weight_map": {}}', "weight_map: got {}"), ("{", "not valid JSON")])
def test_a_malformed_index_is_named(sharded, doc, needle):
    (sharded / INDEX).write_text(doc)
    refused(sharded, sharded / INDEX, needle)


# ------------------------------------------------------------------------------------------ item 8: silent changes
def test_a_config_with_fewer_layers_than_the_checkpoint_is_refused(tmp_path):
    path = tmp_path / "three"
    tiny(1, num_hidden_layers=3).save(path)
    edit_config(path, lambda c: c.update(num_hidden_layers=2))
    refused(path, "model.layers.2.", "layer 2 is past num_hidden_layers = 2", "not a multi-token-prediction layer",
            error=ck.CheckpointError)
    edit_config(path, lambda c: c.update(num_nextn_predict_layers=1))      # a plain decoder layer is no MTP layer
    refused(path, "model.layers.2.", "num_nextn_predict_layers = 1", error=ck.CheckpointError)


def test_real_mtp_layers_are_skipped_with_a_warning(tmp_path):
    """DeepSeek-V3 stores its multi-token-prediction layer as model.layers.{num_hidden_layers} with an eh_proj."""
    three, two = tiny(1, num_hidden_layers=3), None
    sd = three.state_dict()
    H = three.config.hidden_size
    rng = np.random.default_rng(0)
    mtp = {"model.layers.2.eh_proj.weight": rng.standard_normal((H, 2 * H)).astype(np.float32),
           "model.layers.2.enorm.weight": np.ones(H, np.float32), "model.layers.2.hnorm.weight": np.ones(H, np.float32),
           "model.layers.2.shared_head.norm.weight": np.ones(H, np.float32)}
    path = tmp_path / "mtp"
    os.makedirs(path)
    ck.save_safetensors(str(path / "model.safetensors"), {**sd, **mtp})
    cfg = three.config.to_hf_dict()
    cfg.update(num_hidden_layers=2, num_nextn_predict_layers=1)
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.warns(ck.SkippedWeightsWarning, match=r"skipped the multi-token-prediction layer\(s\) \[2\]"):
        two = kd.load_target(path)
    assert two.config.num_hidden_layers == 2 and two.config.num_nextn_predict_layers == 1
    assert same_state(two.state_dict(), {k: v for k, v in sd.items() if not k.startswith("model.layers.2.")})
    cfg.update(num_nextn_predict_layers=0)                                   # the config must say MTP
    (path / "config.json").write_text(json.dumps(cfg))
    refused(path, "model.layers.2.", "num_nextn_predict_layers = 0", error=ck.CheckpointError)


@pytest.mark.parametrize("backend_name", ["numpy", "process"])
def test_state_dicts_are_copies(backend_name):
    name = kd.backend.process_name if backend_name == "process" else "numpy"
    with kd.backend.use(name):
        t = tiny(5)
        ref = {k: v.copy() for k, v in t.state_dict().items()}
        sd = t.state_dict()
        for a in sd.values():
            a[...] = 0.0                                     # editing the returned dict ...
        assert same_state(t.state_dict(), ref)               # ... leaves the model as it was
        built = kd.Target.from_state_dict(t.config, ref)
        want = {k: v.copy() for k, v in built.state_dict().items()}
        for a in ref.values():
            a[...] = 1.0                                     # nor does the dict a target was built from
        assert same_state(built.state_dict(), want)
        if name == "numpy":                                  # (the simulator is too slow for a forward here)
            ids = [3, 1, 4, 1, 5]
            np.testing.assert_array_equal(built.logits(ids), t.logits(ids))


def test_unused_state_dict_keys_are_refused():
    t = tiny(1)
    sd = t.state_dict()
    sd["model.layers.5.mlp.gate_proj.weight"] = np.zeros((2, 2), np.float32)
    with pytest.raises(ck.CheckpointError, match=r"model.layers.5.mlp.gate_proj.weight: unexpected tensor"):
        kd.Target.from_state_dict(t.config, sd)
    with pytest.raises(ck.CheckpointError, match=r"state: model.layers.5.mlp.gate_proj.weight: unexpected"):
        ck.save_state_dict("/nonexistent/never-written", t.config, sd)
