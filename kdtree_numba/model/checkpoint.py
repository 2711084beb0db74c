"""HF-format checkpoints in and out: safetensors (single file or sharded), dequantization, the key layout.

Reading uses a small safetensors parser of its own (header JSON + raw little-endian data) so BF16 and FP8 tensors
decode without torch: BF16 -> fp32 by a 16-bit shift, F8_E4M3 through a 256-entry table.
Quantized checkpoints are dequantized to fp32 while loading:
- FP8 block (DeepSeek-V3, Kimi-K2-Instruct): ``X.weight`` F8_E4M3 + ``X.weight_scale_inv`` fp32
  ``[ceil(out/128), ceil(in/128)]``:  W[r, c] = fp8[r, c] * weight_scale_inv[r // 128, c // 128]
- compressed-tensors INT4 pack-quantized (Kimi K2-Thinking / K2.5 / K2.6, routed experts): ``X.weight_packed``
  int32 [out, in/8], ``X.weight_scale`` bf16 [out, in/g], ``X.weight_shape`` [out, in]:
  q = ((packed[r, c // 8] >> (4 * (c % 8))) & 0xF) - 8;  W[r, c] = q * weight_scale[r, c // g]
Everything is checked (missing, unexpected and mis-shaped keys) before a model is built: nothing half-loaded.
"""
from __future__ import annotations

import json
import os
import struct

import numpy as np

from ..config import ConfigError, TargetConfig


class CheckpointError(ValueError):
    """A checkpoint file or tensor is missing, malformed, mis-shaped or unsupported."""


# ------------------------------------------------------------------------------------------------ dtypes
def _fp8_e4m3_table() -> np.ndarray:
    """float32 value of every e4m3fn byte: 1 sign, 4 exponent (bias 7), 3 mantissa bits; 0x7F/0xFF are NaN."""
    b = np.arange(256)
    sign = np.where(b & 0x80, -1.0, 1.0)
    exp = (b >> 3) & 0xF
    man = b & 0x7
    val = np.where(exp == 0, man / 8.0 * 2.0 ** -6, (1 + man / 8.0) * 2.0 ** (exp - 7))
    val = np.where((exp == 15) & (man == 7), np.nan, val)
    return (sign * val).astype(np.float32)


_FP8 = _fp8_e4m3_table()
_PLAIN = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
          "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}
_SIZES = {"BF16": 2, "F8_E4M3": 1, **{k: np.dtype(v).itemsize for k, v in _PLAIN.items()}}


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even bf16 bit patterns (uint16) of a float32 array."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


class SafetensorsFile:
    """Read-only view of one .safetensors file (memory-mapped)."""

    def __init__(self, path: str):
        self.path = path
        try:
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) != 8:
                    raise CheckpointError(f"{path}: not a safetensors file (shorter than its 8-byte header)")
                (n,) = struct.unpack("<Q", head)
                if n > 100_000_000:
                    raise CheckpointError(f"{path}: not a safetensors file (header length {n})")
                header = json.loads(f.read(n))
        except FileNotFoundError:
            raise CheckpointError(f"{path}: file does not exist") from None
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CheckpointError(f"{path}: not a safetensors file (header is not JSON)") from None
        header.pop("__metadata__", None)
        self.header = header
        self.data_start = 8 + n
        size = os.path.getsize(path)
        for key, info in header.items():
            dt = info.get("dtype")
            if dt not in _SIZES:
                raise CheckpointError(f"{key}: unsupported safetensors dtype {dt!r} in {path}")
            lo, hi = info["data_offsets"]
            if hi - lo != int(np.prod(info["shape"], dtype=np.int64)) * _SIZES[dt] or self.data_start + hi > size:
                raise CheckpointError(f"{key}: data offsets {lo}..{hi} do not match shape {info['shape']} {dt} "
                                      f"in {path} (truncated file?)")
        self._map = np.memmap(path, dtype=np.uint8, mode="r") if size > self.data_start else np.zeros(0, np.uint8)

    def keys(self):
        return self.header.keys()

    def shape(self, key: str) -> tuple:
        return tuple(self.header[key]["shape"])

    def dtype(self, key: str) -> str:
        return self.header[key]["dtype"]

    def get(self, key: str) -> np.ndarray:
        """The tensor decoded to NumPy (BF16 and F8_E4M3 come back as float32)."""
        info = self.header[key]
        lo, hi = info["data_offsets"]
        raw = self._map[self.data_start + lo:self.data_start + hi]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "BF16":
            return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
        if dt == "F8_E4M3":
            return _FP8[raw].reshape(shape)
        return np.array(raw.view(_PLAIN[dt]).reshape(shape))


def save_safetensors(path: str, tensors: dict[str, np.ndarray]) -> None:
    """Write float32/int tensors as one safetensors file (atomically: a temp file renamed into place)."""
    header, chunks, offset = {}, [], 0
    names = {v: k for k, v in _PLAIN.items()}
    for key in sorted(tensors):
        a = np.ascontiguousarray(tensors[key])
        dt = names.get(a.dtype.type)
        if dt is None:
            raise CheckpointError(f"{key}: cannot save dtype {a.dtype}")
        header[key] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        chunks.append(a)
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    tmp = path + ".partial"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for a in chunks:
            f.write(a.tobytes())
    os.replace(tmp, path)


# ------------------------------------------------------------------------------------------------ key layout
def expected_shapes(cfg: TargetConfig) -> dict[str, tuple]:
    """Every tensor of the HF layout for ``cfg`` (without any ``language_model.`` prefix) -> its shape."""
    H, N, V = cfg.hidden_size, cfg.num_attention_heads, cfg.vocab_size
    P, R, Vd, Lkv = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.v_head_dim, cfg.kv_lora_rank
    shapes = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,)}
    if not cfg.tie_word_embeddings:
        shapes["lm_head.weight"] = (V, H)
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
        a = p + "self_attn."
        if cfg.q_lora_rank is None:
            shapes[a + "q_proj.weight"] = (N * (P + R), H)
        else:
            shapes[a + "q_a_proj.weight"] = (cfg.q_lora_rank, H)
            shapes[a + "q_a_layernorm.weight"] = (cfg.q_lora_rank,)
            shapes[a + "q_b_proj.weight"] = (N * (P + R), cfg.q_lora_rank)
        shapes[a + "kv_a_proj_with_mqa.weight"] = (Lkv + R, H)
        shapes[a + "kv_a_layernorm.weight"] = (Lkv,)
        shapes[a + "kv_b_proj.weight"] = (N * (P + Vd), Lkv)
        shapes[a + "o_proj.weight"] = (H, N * Vd)
        m = p + "mlp."
        if cfg.is_moe_layer(i):
            I, E = cfg.moe_intermediate_size, cfg.n_routed_experts
            shapes[m + "gate.weight"] = (E, H)
            shapes[m + "gate.e_score_correction_bias"] = (E,)
            for e in range(E):
                shapes[m + f"experts.{e}.gate_proj.weight"] = (I, H)
                shapes[m + f"experts.{e}.up_proj.weight"] = (I, H)
                shapes[m + f"experts.{e}.down_proj.weight"] = (H, I)
            if cfg.n_shared_experts:
                Is = I * cfg.n_shared_experts
                shapes[m + "shared_experts.gate_proj.weight"] = (Is, H)
                shapes[m + "shared_experts.up_proj.weight"] = (Is, H)
                shapes[m + "shared_experts.down_proj.weight"] = (H, Is)
        else:
            F = cfg.intermediate_size
            shapes[m + "gate_proj.weight"] = (F, H)
            shapes[m + "up_proj.weight"] = (F, H)
            shapes[m + "down_proj.weight"] = (H, F)
    return shapes


def _ignored(key: str, cfg: TargetConfig) -> bool:
    """Tensors the engine does not use: rotary caches and MTP (next-token-prediction) layers."""
    if key.endswith("rotary_emb.inv_freq"):
        return True
    parts = key.split(".")
    if len(parts) > 2 and parts[0] == "model" and parts[1] == "layers" and parts[2].isdigit():
        return int(parts[2]) >= cfg.num_hidden_layers
    return False


# ------------------------------------------------------------------------------------------------ loading
def read_config(path: str) -> tuple[TargetConfig, dict]:
    """(TargetConfig, the raw quantization_config or {}) of an HF directory."""
    if not os.path.isdir(path):
        raise CheckpointError(f"path: {path} is not a directory (expected an HF checkpoint directory)")
    cfile = os.path.join(path, "config.json")
    if not os.path.exists(cfile):
        raise CheckpointError(f"path: {path} has no config.json")
    cfg = TargetConfig.from_file(cfile)
    with open(cfile) as f:
        raw = json.load(f)
    quant = raw.get("quantization_config") or raw.get("text_config", {}).get("quantization_config") or {}
    return cfg, quant


def _weight_files(path: str) -> dict[str, str]:
    """tensor key -> file, from model.safetensors.index.json or the directory's .safetensors files."""
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            wmap = json.load(f).get("weight_map")
        if not isinstance(wmap, dict):
            raise CheckpointError(f"{index}: no weight_map")
        missing = sorted({f for f in wmap.values() if not os.path.exists(os.path.join(path, f))})
        if missing:
            raise CheckpointError(f"{index}: shard {missing[0]} does not exist")
        return {k: os.path.join(path, f) for k, f in wmap.items()}
    files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
    if not files:
        raise CheckpointError(f"path: {path} has no .safetensors files")
    out = {}
    for f in files:
        for k in SafetensorsFile(os.path.join(path, f)).keys():
            out[k] = os.path.join(path, f)
    return out


def _check_quant(quant: dict) -> str:
    method = quant.get("quant_method")
    if not quant or method is None:
        return "none"
    if method == "fp8":
        if quant.get("fmt", "e4m3") != "e4m3":
            raise CheckpointError(f"quantization_config.fmt: got {quant.get('fmt')!r}, expected 'e4m3'")
        return "fp8"
    if method == "compressed-tensors":
        if quant.get("format") not in ("pack-quantized", None):
            raise CheckpointError(f"quantization_config.format: got {quant.get('format')!r}, expected "
                                  f"'pack-quantized'")
        for g in (quant.get("config_groups") or {}).values():
            w = g.get("weights") or {}
            if w.get("num_bits", 4) != 4 or w.get("symmetric", True) is not True:
                raise CheckpointError(f"quantization_config.config_groups: only symmetric 4-bit weights are "
                                      f"supported, got num_bits={w.get('num_bits')} symmetric={w.get('symmetric')}")
        return "int4"
    raise CheckpointError(f"quantization_config.quant_method: got {method!r}, expected 'fp8', "
                          f"'compressed-tensors' or none")


def dequant_fp8(w8: np.ndarray, scale_inv: np.ndarray, block=(128, 128)) -> np.ndarray:
    """W[r, c] = fp8[r, c] * weight_scale_inv[r // 128, c // 128]."""
    rows, cols = w8.shape
    br, bc = block
    want = (-(-rows // br), -(-cols // bc))
    if scale_inv.shape != want:
        raise CheckpointError(f"weight_scale_inv: expected shape {want} for a {w8.shape} weight, got "
                              f"{scale_inv.shape}")
    full = np.repeat(np.repeat(scale_inv.astype(np.float32), br, axis=0), bc, axis=1)[:rows, :cols]
    return (w8.astype(np.float32) * full).astype(np.float32)


def dequant_int4(packed: np.ndarray, scale: np.ndarray, shape) -> np.ndarray:
    """q = ((packed[r, c//8] >> 4*(c%8)) & 0xF) - 8;  W[r, c] = q * weight_scale[r, c // group]."""
    rows, cols = (int(s) for s in np.asarray(shape).reshape(-1)[:2])
    if packed.shape != (rows, -(-cols // 8)):
        raise CheckpointError(f"weight_packed: expected shape {(rows, -(-cols // 8))} for weight_shape "
                              f"{[rows, cols]}, got {packed.shape}")
    if scale.ndim != 2 or scale.shape[0] != rows or cols % scale.shape[1]:
        raise CheckpointError(f"weight_scale: shape {scale.shape} does not divide weight_shape {[rows, cols]} "
                              f"into groups")
    group = cols // scale.shape[1]
    p = packed.astype(np.int64) & 0xFFFFFFFF                                    # [rows, cols/8]
    shifts = 4 * np.arange(8, dtype=np.int64)
    q = ((p[:, :, None] >> shifts) & 0xF).reshape(rows, -1)[:, :cols] - 8       # [rows, cols]
    return (q.astype(np.float32) * np.repeat(scale.astype(np.float32), group, axis=1)).astype(np.float32)


def load_state_dict(path: str) -> tuple[TargetConfig, dict[str, np.ndarray]]:
    """Read, dequantize and check every tensor of an HF DeepSeek-V3-family directory.

    Returns the config and ``{hf key (no prefix): float32 array}``; raises CheckpointError / ConfigError naming
    the key, field or value at the first problem, before anything is built."""
    cfg, quant = read_config(path)
    method = _check_quant(quant)
    block = tuple(quant.get("weight_block_size") or (128, 128))
    files = _weight_files(path)
    opened: dict[str, SafetensorsFile] = {}

    def stfile(full_key) -> SafetensorsFile:
        f = files[full_key]
        if f not in opened:
            opened[f] = SafetensorsFile(f)
        if full_key not in opened[f].header:
            raise CheckpointError(f"{full_key}: listed in the index but absent from {os.path.basename(f)}")
        return opened[f]

    def tensor(full_key):
        return stfile(full_key).get(full_key)

    prefix = cfg.weight_prefix
    expected = expected_shapes(cfg)
    # group the stored keys by the weight they make up
    bases: dict[str, dict[str, str]] = {}
    for full in files:
        if prefix and not full.startswith(prefix):
            continue                                          # vision tower etc. of a multimodal checkpoint
        key = full[len(prefix):]
        if _ignored(key, cfg):
            continue
        for suffix in ("weight_scale_inv", "weight_packed", "weight_scale", "weight_shape"):
            if key.endswith("." + suffix):
                bases.setdefault(key[: -len(suffix)] + "weight", {})[suffix] = full
                break
        else:
            bases.setdefault(key, {})["value"] = full

    state: dict[str, np.ndarray] = {}
    for key, parts in sorted(bases.items()):
        if key not in expected and ".shared_experts." in key and not cfg.n_shared_experts and "value" in parts \
                and 0 in stfile(parts["value"]).shape(parts["value"]):
            continue                                          # transformers saves 0-wide shared experts
        if key not in expected:
            raise CheckpointError(f"{prefix}{key}: unexpected tensor for this config (architecture mismatch?)")
        if "weight_packed" in parts:
            if method != "int4":
                raise CheckpointError(f"{prefix}{key}: INT4-packed tensor but quantization_config is {method!r}")
            for need in ("weight_scale", "weight_shape"):
                if need not in parts:
                    raise CheckpointError(f"{prefix}{key[:-6]}{need}: missing (needed to unpack weight_packed)")
            w = dequant_int4(tensor(parts["weight_packed"]), tensor(parts["weight_scale"]),
                             tensor(parts["weight_shape"]))
        elif "value" in parts:
            w = tensor(parts["value"])
            if "weight_scale_inv" in parts:
                if method != "fp8":
                    raise CheckpointError(f"{prefix}{key}: FP8 scales present but quantization_config is "
                                          f"{method!r}")
                w = dequant_fp8(w, tensor(parts["weight_scale_inv"]), block)
            elif stfile(parts["value"]).dtype(parts["value"]) == "F8_E4M3":
                raise CheckpointError(f"{prefix}{key[:-6]}weight_scale_inv: missing (needed for the FP8 weight)")
        else:
            raise CheckpointError(f"{prefix}{key}: scales without the tensor they scale")
        if tuple(w.shape) != expected[key]:
            raise CheckpointError(f"{prefix}{key}: expected shape {expected[key]}, got {tuple(w.shape)}")
        if not np.issubdtype(w.dtype, np.floating):
            raise CheckpointError(f"{prefix}{key}: expected a floating-point tensor, got {w.dtype}")
        state[key] = np.ascontiguousarray(w, dtype=np.float32)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f"{prefix}{missing[0]}: missing from the checkpoint ({len(missing)} tensors missing)")
    return cfg, state


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a directory's safetensors (index or files) as float32 (a drafter: no quantization)."""
    opened: dict[str, SafetensorsFile] = {}
    out = {}
    for key, f in sorted(_weight_files(path).items()):
        if f not in opened:
            opened[f] = SafetensorsFile(f)
        st = opened[f]
        if key not in st.header:
            raise CheckpointError(f"{key}: listed in the index but absent from {os.path.basename(f)}")
        if st.dtype(key) not in ("F32", "F16", "BF16", "F64"):
            raise CheckpointError(f"{key}: dtype {st.dtype(key)} in {f}, expected F32, BF16 or F16")
        out[key] = np.ascontiguousarray(st.get(key), dtype=np.float32)
    return out


def save_state_dict(path: str, cfg: TargetConfig, state: dict[str, np.ndarray]) -> None:
    """Write ``config.json`` + ``model.safetensors`` (fp32, HF key layout, no prefix) into ``path``."""
    os.makedirs(path, exist_ok=True)
    save_safetensors(os.path.join(path, "model.safetensors"), state)
    tmp = os.path.join(path, "config.json.partial")
    with open(tmp, "w") as f:
        json.dump(cfg.to_hf_dict(), f, indent=2)
    os.replace(tmp, os.path.join(path, "config.json"))


__all__ = ["CheckpointError", "ConfigError", "SafetensorsFile", "load_state_dict", "save_state_dict", "read_tensors",
           "expected_shapes", "dequant_fp8", "dequant_int4", "fp32_to_bf16_bits", "save_safetensors"]
