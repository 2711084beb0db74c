"""#16: random mutations of a valid tiny checkpoint either load to the identical model (same state_dict) or raise a
ValueError that names the checkpoint; never another exception type, never a different model.

Mutated: header bytes (length prefix, JSON text, padding), header entries (dtype, shape, data_offsets, whole
entries, metadata, names), config.json fields (wrong types, NaN/inf, negative, zero, huge, nested junk, YaRN
dicts) and the shard index's weight_map. Deterministic (derandomize) and quick on the NumPy backend."""
import json
import os
import shutil
import struct
import tempfile
import warnings

import numpy as np
import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

import kdtree_numba as kd  # noqa: E402

from .helpers import INDEX, read_raw, same_state, save_sharded, tiny, write_raw  # noqa: E402

FUZZ = settings(max_examples=250, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
IDS = [3, 1, 4, 1, 5, 9]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    root = tmp_path_factory.mktemp("fuzz")
    with kd.backend.use("numpy"):
        t = tiny(6, n_routed_experts=4, num_experts_per_tok=2)
        t.save(root / "single")
        save_sharded(t, root / "sharded")
        return root, t.state_dict(), t.logits(IDS)


def check(path, ref):
    """The fuzz oracle: the same model, or a ValueError naming the checkpoint."""
    with kd.backend.use("numpy"), warnings.catch_warnings():
        warnings.simplefilter("ignore")                     # overflow in a fuzzed rope_theta etc. is numerics
        try:
            target = kd.load_target(path)
        except ValueError as e:
            assert str(path) in str(e) and len(str(e)) > len(str(path)) + 8, f"unnamed error: {e}"
            return "refused"
        except Exception as e:                              # any other type is a bug
            raise AssertionError(f"{type(e).__name__} instead of a ValueError: {e}") from e
        assert same_state(target.state_dict(), ref), "a mutated checkpoint loaded as a different model"
        assert target.logits(IDS).shape == (len(IDS), target.config.vocab_size)   # and it runs
        return "loaded"


def copy_of(base, layout):
    tmp = tempfile.mkdtemp(prefix="kd-fuzz-")
    dst = os.path.join(tmp, "ckpt")
    shutil.copytree(base[0] / layout, dst)
    return tmp, dst


# ------------------------------------------------------------------------------------------------ strategies
junk = st.recursive(
    st.none() | st.booleans() | st.integers(-2 ** 63, 2 ** 64) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6)
small_ints = st.integers(-3, 3) | st.sampled_from([0, 1, 2, 4, 8, 16, 32, 64, 2 ** 31, 2 ** 62, -2 ** 62])
numbers = small_ints | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -0.0, 1e-300, 1e300])
value = junk | numbers | st.sampled_from(["", "64", "silu", "yarn", [64, 64], [], {}])


def yarn():
    return st.fixed_dictionaries(
        {"rope_type": st.sampled_from(["yarn", "default", "linear", 3])},
        optional={"rope_theta": numbers, "factor": numbers, "original_max_position_embeddings": numbers | value,
                  "beta_fast": numbers, "beta_slow": numbers, "mscale": numbers, "mscale_all_dim": numbers,
                  "truncate": value, "attention_factor": numbers})


# ------------------------------------------------------------------------------------------------ header bytes
@FUZZ
@given(data=st.data())
def test_header_byte_mutations(base, data):
    tmp, path = copy_of(base, data.draw(st.sampled_from(["single", "sharded"])))
    try:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        f = os.path.join(path, data.draw(st.sampled_from(files)))
        blob = bytearray(open(f, "rb").read())
        n = struct.unpack("<Q", blob[:8])[0]
        for _ in range(data.draw(st.integers(1, 3))):
            pos = data.draw(st.integers(0, 8 + n - 1))                # the length prefix and the header only
            blob[pos] = data.draw(st.integers(0, 255))
        if data.draw(st.booleans()):
            del blob[data.draw(st.integers(8 + n, len(blob) - 1)):]   # sometimes also truncate the data
        open(f, "wb").write(bytes(blob))
        check(path, base[1])
    finally:
        shutil.rmtree(tmp)


# ------------------------------------------------------------------------------------------------ header entries
@FUZZ
@given(data=st.data())
def test_header_field_mutations(base, data):
    tmp, path = copy_of(base, "single")
    try:
        f = os.path.join(path, "model.safetensors")
        header, raw = read_raw(f)
        keys = sorted(k for k in header if k != "__metadata__")
        key = data.draw(st.sampled_from(keys))
        entry = header[key]
        lo, hi = entry["data_offsets"]
        other = header[data.draw(st.sampled_from(keys))]["data_offsets"]
        kind = data.draw(st.sampled_from(["dtype", "shape", "offsets", "entry", "drop_field", "extra_field",
                                          "metadata", "rename", "remove", "pad"]))
        if kind == "dtype":
            entry["dtype"] = data.draw(st.sampled_from(["F32", "F16", "BF16", "F64", "I32", "I64", "U8", "BOOL",
                                                        "F8_E4M3", "f32", "F4", ""]) | value)
        elif kind == "shape":
            entry["shape"] = data.draw(st.lists(small_ints, max_size=4) | st.just(entry["shape"][::-1])
                                       | st.just(entry["shape"] + [1]) | value)
        elif kind == "offsets":
            d = data.draw(small_ints)
            entry["data_offsets"] = data.draw(st.sampled_from([[lo + d, hi + d], [lo, hi + d], [lo + d, hi],
                                                               [hi, lo], list(other), [lo], [lo, hi, hi],
                                                               [-lo - 1, hi - lo - lo - 1], [str(lo), hi]])
                                              | st.lists(small_ints, min_size=2, max_size=2) | value)
        elif kind == "entry":
            header[key] = data.draw(value)
        elif kind == "drop_field":
            entry.pop(data.draw(st.sampled_from(["dtype", "shape", "data_offsets"])))
        elif kind == "extra_field":
            entry[data.draw(st.text(min_size=1, max_size=5))] = data.draw(value)
        elif kind == "metadata":
            header["__metadata__"] = data.draw(value | st.dictionaries(st.text(max_size=3), st.text(max_size=3)))
        elif kind == "rename":
            header[data.draw(st.sampled_from(keys + ["model.layers.7.mlp.up_proj.weight", "lm_head.bias", "",
                                                     "model.layers.0.self_attn.rotary_emb.inv_freq"]))] = \
                header.pop(key)
        elif kind == "remove":
            header.pop(key)
        write_raw(f, header, raw, pad=8 * data.draw(st.integers(0, 2)) if kind == "pad" else 0)
        check(path, base[1])
    finally:
        shutil.rmtree(tmp)


# ------------------------------------------------------------------------------------------------ config.json
CONFIG_FIELDS = ["vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
                 "num_attention_heads", "num_key_value_heads", "n_shared_experts", "n_routed_experts",
                 "routed_scaling_factor", "kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "v_head_dim",
                 "qk_nope_head_dim", "n_group", "topk_group", "num_experts_per_tok", "first_k_dense_replace",
                 "norm_topk_prob", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_interleave",
                 "attention_bias", "tie_word_embeddings", "moe_layer_freq", "num_nextn_predict_layers",
                 "bos_token_id", "eos_token_id", "model_type", "architectures", "rope_parameters", "rope_scaling",
                 "rope_theta", "text_config", "quantization_config", "topk_method", "scoring_func"]


@FUZZ
@given(data=st.data())
def test_config_field_mutations(base, data):
    tmp, path = copy_of(base, data.draw(st.sampled_from(["single", "sharded"])))
    try:
        p = os.path.join(path, "config.json")
        cfg = json.load(open(p))
        for _ in range(data.draw(st.integers(1, 2))):
            field = data.draw(st.sampled_from(CONFIG_FIELDS))
            how = data.draw(st.sampled_from(["value", "number", "delete", "yarn", "quant"]))
            if how == "delete":
                cfg.pop(field, None)
            elif how == "yarn":
                cfg[data.draw(st.sampled_from(["rope_parameters", "rope_scaling"]))] = data.draw(yarn())
            elif how == "quant":
                cfg["quantization_config"] = data.draw(st.fixed_dictionaries(
                    {"quant_method": st.sampled_from(["fp8", "compressed-tensors", "awq", None]) | value},
                    optional={"weight_block_size": value | st.lists(small_ints, max_size=3), "fmt": value,
                              "format": value, "config_groups": value | st.dictionaries(
                                  st.text(max_size=2), st.fixed_dictionaries({"weights": value | st.dictionaries(
                                      st.sampled_from(["num_bits", "symmetric", "group_size"]), value)}))}))
            else:
                cfg[field] = data.draw(numbers if how == "number" else value)
        with open(p, "w") as f:
            json.dump(cfg, f)                                   # NaN / Infinity as Python's json writes them
        check(path, base[1])
    finally:
        shutil.rmtree(tmp)


# ------------------------------------------------------------------------------------------------ the shard index
@FUZZ
@given(data=st.data())
def test_index_mutations(base, data):
    tmp, path = copy_of(base, "sharded")
    try:
        p = os.path.join(path, INDEX)
        index = json.load(open(p))
        wmap = index["weight_map"]
        keys, shards = sorted(wmap), sorted(set(wmap.values()))
        shutil.copy(os.path.join(path, shards[0]), os.path.join(tmp, "outside.safetensors"))
        kind = data.draw(st.sampled_from(["value", "drop", "add", "map", "root", "swap"]))
        if kind == "value":
            wmap[data.draw(st.sampled_from(keys))] = data.draw(
                st.sampled_from(shards + ["../outside.safetensors", os.path.join(tmp, "outside.safetensors"),
                                          "config.json", "missing.safetensors", "./" + shards[0], "", ".", "..",
                                          shards[0] + "/", "sub/" + shards[0]]) | value)
        elif kind == "drop":
            wmap.pop(data.draw(st.sampled_from(keys)))
        elif kind == "add":
            wmap[data.draw(st.sampled_from(["lm_head.bias", "model.layers.9.mlp.up_proj.weight", ""]) | st.text(
                max_size=8))] = data.draw(st.sampled_from(shards) | value)
        elif kind == "map":
            index["weight_map"] = data.draw(value)
        elif kind == "root":
            index = data.draw(value)
        elif kind == "swap":                                    # every key of one shard pointed at the other
            a, b = shards[0], shards[-1]
            for k in keys:
                if wmap[k] == a:
                    wmap[k] = b
        with open(p, "w") as f:
            json.dump(index, f)
        check(path, base[1])
    finally:
        shutil.rmtree(tmp)


def test_the_unmutated_checkpoints_load(base):
    for layout in ("single", "sharded"):
        assert check(base[0] / layout, base[1]) == "loaded"
    with kd.backend.use("numpy"):
        np.testing.assert_array_equal(kd.load_target(base[0] / "single").logits(IDS), base[2])
