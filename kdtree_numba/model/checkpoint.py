"""HF-format checkpoints in and out: safetensors (single file or sharded), dequantization, the key layout.

Reading uses a small safetensors parser of its own (header JSON + raw little-endian data) so BF16 and FP8 tensors
decode without torch: BF16 -> fp32 by a 16-bit shift, F8_E4M3 through a 256-entry table. A header is trusted in
nothing: its length, JSON, entries (dtype, shape, data_offsets) and the layout of the data (every byte belongs to
exactly one tensor, as the reference implementation requires) are checked before any tensor is read.
Quantized checkpoints are dequantized to fp32 while loading:
- FP8 block (DeepSeek-V3, Kimi-K2-Instruct): ``X.weight`` F8_E4M3 + ``X.weight_scale_inv`` fp32
  ``[ceil(out/128), ceil(in/128)]``:  W[r, c] = fp8[r, c] * weight_scale_inv[r // 128, c // 128]
- compressed-tensors INT4 pack-quantized (Kimi K2-Thinking / K2.5 / K2.6, routed experts): ``X.weight_packed``
  int32 [out, in/8], ``X.weight_scale`` bf16 [out, in/g], ``X.weight_shape`` [out, in]:
  q = ((packed[r, c // 8] >> (4 * (c % 8))) & 0xF) - 8;  W[r, c] = q * weight_scale[r, c // g]
Everything is checked (missing, unexpected and mis-shaped keys) before a model is built: nothing half-loaded.
Every error is a ``CheckpointError`` / ``ConfigError`` (both ``ValueError``) naming the file, the key or field, the
value and what was expected.

Which files hold the weights: ``model.safetensors`` when present (as transformers decides), else the shards of
``model.safetensors.index.json``, else every ``*.safetensors`` of the directory; a directory holding both
``model.safetensors`` and an index that does not list it is refused (one of them is stale).

Saving is atomic (``save_dir``): every file is written into a fresh directory beside the target and only then
moved in; ``config.json`` leaves first and comes back last, so at no moment does the directory load as a mix of
old and new. A save that fails leaves the old checkpoint byte-identical and nothing behind; a save replaces only
what it supersedes (the files it writes, a stale index and that index's shards) and keeps every other file.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import shutil
import struct
import warnings

import numpy as np

from ..atomic_file import write_atomic
from ..config import ConfigError, TargetConfig, is_int, read_json, short_repr
from . import hf_keys

WEIGHTS_NAME = "model.safetensors"
INDEX_NAME = "model.safetensors.index.json"
CONFIG_NAME = "config.json"
#: the reference implementation's limit on a header's length
MAX_HEADER = 100_000_000


class CheckpointError(ValueError):
    """A checkpoint file or tensor is missing, malformed, mis-shaped or unsupported."""


class SkippedWeightsWarning(UserWarning):
    """A checkpoint holds weights the engine does not run (DeepSeek-V3's multi-token-prediction layers); they were
    skipped - or its config.json names a quantization no tensor uses (weights converted to bf16 with the config's
    quantization_config left in place); the tensors were loaded as they are."""


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
_FLOAT_DTYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3")


def fp32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even bf16 bit patterns (uint16) of a float32 array."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


# ------------------------------------------------------------------------------------------------ safetensors
class _Repeated(Exception):
    def __init__(self, key):
        self.key = key


def _unique_pairs(pairs):
    """json object hook: a repeated name would silently keep only its last value."""
    out = {}
    for k, v in pairs:
        if k in out:
            raise _Repeated(k)
        out[k] = v
    return out


def _parse_header(path: str, blob: bytes) -> dict:
    """The header's tensor entries, each checked on its own (dtype known, shape and offsets non-negative
    integers, begin <= end, end - begin == bytes of dtype x shape)."""
    try:
        header = json.loads(blob.decode("utf-8"), object_pairs_hook=_unique_pairs)
    except UnicodeDecodeError as e:
        raise CheckpointError(f"{path}: not a safetensors file (header byte {e.start} is not UTF-8 JSON)") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not a safetensors file (header is not JSON: {e.msg} at byte {e.pos})") \
            from None
    except RecursionError:
        raise CheckpointError(f"{path}: not a safetensors file (header JSON nested too deeply)") from None
    except _Repeated as e:
        raise CheckpointError(f"{path}: header: the name {short_repr(e.key)} appears twice in one object, expected "
                              f"unique names") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: header: got a JSON {type(header).__name__}, expected an object of tensor "
                              f"entries")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise CheckpointError(f"{path}: __metadata__: got {short_repr(meta)}, expected an object of strings")
    for key, info in header.items():
        where = f"{path}: {key}"
        if not isinstance(info, dict):
            raise CheckpointError(f"{where}: header entry is {short_repr(info)}, expected an object with dtype, shape "
                                  f"and data_offsets")
        for field in ("dtype", "shape", "data_offsets"):
            if field not in info:
                raise CheckpointError(f"{where}: header entry has no {field}, expected dtype, shape and "
                                      f"data_offsets")
        dt, shape, offs = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dt, str) or dt not in _SIZES:
            raise CheckpointError(f"{where}: dtype {short_repr(dt)}, expected one of {', '.join(_SIZES)}")
        if not isinstance(shape, list) or not all(is_int(d) and d >= 0 for d in shape):
            raise CheckpointError(f"{where}: shape {short_repr(shape)}, expected a list of non-negative integers")
        if not (isinstance(offs, list) and len(offs) == 2 and all(is_int(o) and o >= 0 for o in offs)):
            raise CheckpointError(f"{where}: data_offsets {short_repr(offs)}, expected [begin, end]: two non-negative "
                                  f"integers")
        lo, hi = offs
        if lo > hi:
            raise CheckpointError(f"{where}: data_offsets [{lo}, {hi}] begin after they end, expected begin <= end")
        nbytes = _SIZES[dt] * math.prod(shape)
        if hi - lo != nbytes:
            raise CheckpointError(f"{where}: data_offsets [{lo}, {hi}] span {hi - lo} bytes, expected {nbytes} "
                                  f"(shape {shape} of {dt})")
    return header


def _check_layout(path: str, header: dict, data_len: int) -> None:
    """Every byte of the data belongs to exactly one tensor: sorted by offset, each tensor starts where the previous
    ends, the first at 0 and the last at the end of the file (the reference implementation's rule; it also catches
    a wrong header length, which would shift every tensor)."""
    spans = sorted((info["data_offsets"][0], info["data_offsets"][1], key) for key, info in header.items())
    for lo, hi, key in spans:
        if hi > data_len:
            raise CheckpointError(f"{path}: {key}: data_offsets [{lo}, {hi}] end past the data ({data_len} bytes "
                                  f"after the header), expected end <= {data_len} (truncated file?)")
    pos, prev = 0, None
    for lo, hi, key in spans:
        if lo < pos:
            raise CheckpointError(f"{path}: {key}: data_offsets [{lo}, {hi}] overlap {prev} (which ends at {pos}), "
                                  f"expected every tensor to start where the previous one ends")
        if lo > pos:
            raise CheckpointError(f"{path}: {key}: data_offsets [{lo}, {hi}] leave bytes {pos}..{lo} unused, "
                                  f"expected every tensor to start where the previous one ends")
        pos, prev = hi, key
    if pos != data_len:
        raise CheckpointError(f"{path}: {data_len - pos} bytes follow the last tensor ({prev or 'none'}), expected "
                              f"the data to end with it (a wrong header length or trailing garbage)")


class SafetensorsFile:
    """Read-only view of one .safetensors file (memory-mapped); the header is validated when it is opened."""

    def __init__(self, path: str):
        self.path = path = os.fspath(path)
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                head = f.read(8)
                if len(head) != 8:
                    raise CheckpointError(f"{path}: not a safetensors file ({len(head)} bytes, shorter than its "
                                          f"8-byte header length)")
                (n,) = struct.unpack("<Q", head)
                limit = min(MAX_HEADER, size - 8)
                if not 2 <= n <= limit:
                    raise CheckpointError(f"{path}: not a safetensors file (header length {n}, expected 2 .. "
                                          f"{limit} in a file of {size} bytes)")
                blob = f.read(n)
        except FileNotFoundError:
            raise CheckpointError(f"{path}: file does not exist") from None
        except IsADirectoryError:
            raise CheckpointError(f"{path}: a directory, expected a safetensors file") from None
        self.header = _parse_header(path, blob)
        self.data_start = 8 + n
        _check_layout(path, self.header, size - self.data_start)
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
    """Write float32/int tensors as one safetensors file (atomically: a temp file renamed into place; a failed write
    removes it)."""
    header, chunks, offset = {}, [], 0
    names = {v: k for k, v in _PLAIN.items()}
    for key in sorted(tensors):
        if not isinstance(key, str):
            raise CheckpointError(f"tensors: key {key!r} is not a string")
        a = np.ascontiguousarray(tensors[key])
        dt = names.get(a.dtype.type)
        if dt is None:
            raise CheckpointError(f"{key}: cannot save dtype {a.dtype}")
        header[key] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        chunks.append(a)
        offset += a.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)))
            f.write(blob)
            for a in chunks:
                f.write(a.reshape(-1).view(np.uint8))
            f.flush()
            os.fsync(f.fileno())
    write_atomic(path, write)


# ------------------------------------------------------------------------------------------------ atomic saves
def _plain_name(f) -> bool:
    """A file name inside the checkpoint directory (no path, nothing that leaves the folder)."""
    return (isinstance(f, str) and f not in ("", ".", "..") and "/" not in f and "\\" not in f and "\0" not in f
            and os.path.basename(f) == f)


def _fsync(path: str) -> None:
    flags = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) if os.path.isdir(path) else os.O_RDONLY
    try:
        fd = os.open(path, flags)
    except OSError:
        return                                   # a platform that cannot open directories: nothing to flush
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _staging_dir(path: str) -> str:
    """A fresh directory for a save of ``path``: beside it (same filesystem, so files move in by rename), or inside
    it when the parent is not writable or another filesystem is mounted at ``path``."""
    parent, base = os.path.dirname(path), os.path.basename(path)
    os.makedirs(parent, exist_ok=True)
    places = [parent]
    if os.path.isdir(path):
        try:
            same = os.stat(parent).st_dev == os.stat(path).st_dev
        except OSError:
            same = False
        places = [parent, path] if same else [path]
    for i, where in enumerate(places):
        tmp = os.path.join(where, f".{base}.saving-{os.getpid()}-{secrets.token_hex(4)}")
        try:
            os.mkdir(tmp)
            return tmp
        except PermissionError:
            if i == len(places) - 1:
                raise
    raise AssertionError("unreachable")


def _superseded(path: str, names) -> list[str]:
    """Files of ``path`` that a save writing ``names`` replaces: those names, a weight index and the shards it
    lists (the index would otherwise win over the new weights at load). Nothing else is touched."""
    out = {n for n in names if os.path.lexists(os.path.join(path, n))}
    index = os.path.join(path, INDEX_NAME)
    if os.path.lexists(index):
        out.add(INDEX_NAME)
        try:
            wmap = read_json(index, "index").get("weight_map")
        except Exception:                        # a broken index: it goes, its shards cannot be known
            wmap = None
        if isinstance(wmap, dict):
            out.update(f for f in wmap.values() if _plain_name(f) and f.endswith(".safetensors")
                       and os.path.isfile(os.path.join(path, f)))
    return sorted(out, key=lambda n: (n != CONFIG_NAME, n))          # config.json leaves first


def _commit(path: str, staging: str, names: list[str]) -> None:
    """Move the staged files into ``path``: superseded files go into the staging directory first (config.json
    first), new files come in (config.json last); any failure puts everything back."""
    backup = os.path.join(staging, ".replaced")
    os.mkdir(backup)
    moved, placed = [], []
    try:
        for n in _superseded(path, names):
            os.replace(os.path.join(path, n), os.path.join(backup, n))
            moved.append(n)
        for n in sorted(names, key=lambda n: (n == CONFIG_NAME, n)):
            os.replace(os.path.join(staging, n), os.path.join(path, n))
            placed.append(n)
    except BaseException:
        for n in reversed(placed):
            with contextlib.suppress(OSError):
                os.replace(os.path.join(path, n), os.path.join(staging, n))
        for n in reversed(moved):
            with contextlib.suppress(OSError):
                os.replace(os.path.join(backup, n), os.path.join(path, n))
        raise
    _fsync(path)


def save_dir(path, write) -> None:
    """Write a checkpoint directory atomically: ``write(staging)`` writes plain files into a fresh directory beside
    ``path``; only when it returned are they flushed and moved in (``_commit``). A new ``path`` appears whole
    (one rename). On any failure nothing of ``path`` has changed and the staging directory is gone."""
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise CheckpointError(f"path: expected a checkpoint directory path, got {path!r}")
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and not os.path.isdir(path):
        raise CheckpointError(f"path: {path} exists and is not a directory, expected a checkpoint directory")
    try:
        _save_into(path, write)
    except OSError as e:           # a read-only parent, a full disk, a long name: the same error, naming ``path``
        raise type(e)(e.errno, f"path: cannot save to {path}: {e.strerror or e}") from e


def _save_into(path: str, write) -> None:
    """save_dir's work for an absolute ``path`` (save_dir re-raises its OSErrors naming ``path``)."""
    staging = _staging_dir(path)
    try:
        write(staging)
        names = sorted(os.listdir(staging))
        for n in names:
            if not os.path.isfile(os.path.join(staging, n)):
                raise CheckpointError(f"save: {n} is not a plain file (a writer left a directory or link)")
            _fsync(os.path.join(staging, n))
        if not os.path.isdir(path):
            try:
                os.rename(staging, path)
                _fsync(os.path.dirname(path))
                return
            except OSError:
                if not os.path.isdir(path):   # someone made it meanwhile: move the files in instead
                    raise
        _commit(path, staging, names)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def write_json(path: str, obj) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)


# ------------------------------------------------------------------------------------------------ key layout
def expected_shapes(cfg: TargetConfig) -> dict[str, tuple]:
    """Every tensor of the HF layout for ``cfg`` (without any ``language_model.`` prefix) -> its shape."""
    return dict(_iter_expected(cfg))


def _iter_expected(cfg: TargetConfig):
    """(key, shape) of every tensor of the HF layout, top-level tensors first, then layer by layer (lazily)."""
    return hf_keys.iter_keys(cfg)


def expected_count(cfg: TargetConfig) -> int:
    """len(expected_shapes(cfg)), by arithmetic (a config can ask for 2**62 layers or experts: never enumerate
    those before the checkpoint has shown it holds them)."""
    attn = 2 + (1 if cfg.q_lora_rank is None else 3) + 4
    L = cfg.num_hidden_layers
    moe = L - min(cfg.first_k_dense_replace, L) if cfg.n_routed_experts > 0 else 0
    per_moe = 2 + 3 * cfg.n_routed_experts + (3 if cfg.n_shared_experts else 0)
    return 2 + (0 if cfg.tie_word_embeddings else 1) + L * attn + (L - moe) * 3 + moe * per_moe


def _check_plausible(cfg: TargetConfig, stored: set, prefix: str) -> None:
    """Refuse, naming a missing key, a config that asks for more tensors than the checkpoint holds, before
    ``expected_shapes`` enumerates them: walking the layout, each key found is a distinct stored tensor, so a
    missing one turns up within len(stored) + 1 steps however many layers or experts the config claims."""
    want = expected_count(cfg)
    if want <= len(stored):
        return
    for key, _ in _iter_expected(cfg):
        if prefix + key not in stored and prefix + key[:-len("weight")] + "weight_packed" not in stored:
            raise CheckpointError(f"{prefix}{key}: missing from the checkpoint (the config asks for {want} tensors, "
                                  f"the checkpoint holds {len(stored)})")


def _layer_of(key: str) -> int | None:
    """i of a ``model.layers.{i}.*`` key (None for other keys)."""
    parts = key.split(".")
    if len(parts) > 3 and parts[0] == "model" and parts[1] == "layers" and parts[2].isascii() and parts[2].isdigit():
        return int(parts[2])
    return None


# ------------------------------------------------------------------------------------------------ loading
def read_config(path: str) -> tuple[TargetConfig, dict]:
    """(TargetConfig, the raw quantization_config or {}) of an HF directory; errors name config.json."""
    if not os.path.isdir(path):
        raise CheckpointError(f"path: {path} is not a directory (expected an HF checkpoint directory)")
    cfile = os.path.join(path, CONFIG_NAME)
    if not os.path.exists(cfile):
        raise CheckpointError(f"path: {path} has no config.json")
    raw = read_json(cfile, "config")
    cfg = TargetConfig.from_dict(raw, source=cfile)
    text = raw.get("text_config")
    quant = raw.get("quantization_config") or (text.get("quantization_config") if isinstance(text, dict) else None)
    if quant is None:
        quant = {}
    if not isinstance(quant, dict):
        raise CheckpointError(f"{cfile}: quantization_config: got {short_repr(quant)}, expected an object or null")
    return cfg, quant


def _weight_files(path: str) -> dict[str, str]:
    """tensor key -> file: ``model.safetensors`` when present, else the shards of ``model.safetensors.index.json``,
    else every ``*.safetensors`` of the directory (a key in two files is refused)."""
    index = os.path.join(path, INDEX_NAME)
    single = os.path.join(path, WEIGHTS_NAME)
    if os.path.exists(index):
        raw = read_json(index, "index")
        if not isinstance(raw, dict):
            raise CheckpointError(f"{index}: got a JSON {type(raw).__name__}, expected an object with a weight_map")
        wmap = raw.get("weight_map")
        if not isinstance(wmap, dict) or not wmap:
            raise CheckpointError(f"{index}: weight_map: got {short_repr(wmap)}, expected an object mapping tensor "
                                  f"names to shard files")
        for k, f in wmap.items():
            if not (_plain_name(f) and f.endswith(".safetensors")):
                raise CheckpointError(f"{index}: weight_map[{short_repr(k)}]: got {short_repr(f, 300)}, expected the name "
                                      f"of a .safetensors file in {path} (no directories)")
        if os.path.exists(single) and WEIGHTS_NAME not in wmap.values():
            raise CheckpointError(f"{path}: holds both {WEIGHTS_NAME} and {INDEX_NAME}, which does not list it: "
                                  f"expected one or the other (one of them is stale; remove it)")
        missing = sorted({f for f in wmap.values() if not os.path.exists(os.path.join(path, f))})
        if missing:
            raise CheckpointError(f"{index}: weight_map: shard {missing[0]} does not exist in {path}")
        return {k: os.path.join(path, f) for k, f in wmap.items()}
    if os.path.exists(single):
        files = [WEIGHTS_NAME]
    else:
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors")
                       and os.path.isfile(os.path.join(path, f)))
    if not files:
        raise CheckpointError(f"path: {path} has no .safetensors files")
    out: dict[str, str] = {}
    for f in files:
        for k in SafetensorsFile(os.path.join(path, f)).keys():
            if k in out:
                raise CheckpointError(f"{os.path.join(path, f)}: {k}: also in {os.path.basename(out[k])}, expected "
                                      f"each tensor in one file (add a {INDEX_NAME} or remove the stale file)")
            out[k] = os.path.join(path, f)
    return out


def _check_quant(quant: dict, where: str) -> tuple[str, tuple | None, int | None]:
    """(method 'none' | 'fp8' | 'int4', FP8 block, INT4 group size or None) of a quantization_config."""
    def bad(field, value, expected):
        return CheckpointError(f"{where}: quantization_config.{field}: got {short_repr(value)}, expected {expected}")

    method = quant.get("quant_method")
    if not quant or method is None:
        return "none", None, None
    if method == "fp8":
        if quant.get("fmt", "e4m3") != "e4m3":
            raise bad("fmt", quant.get("fmt"), "'e4m3'")
        block = quant.get("weight_block_size")
        block = [128, 128] if block is None else block
        if not (isinstance(block, list) and len(block) == 2 and all(is_int(b) and b > 0 for b in block)):
            raise bad("weight_block_size", block, "[rows, cols]: two positive integers")
        return "fp8", tuple(block), None
    if method == "compressed-tensors":
        if quant.get("format") not in ("pack-quantized", None):
            raise bad("format", quant.get("format"), "'pack-quantized'")
        groups = quant.get("config_groups") or {}
        if not isinstance(groups, dict):
            raise bad("config_groups", groups, "an object of quantization groups")
        sizes = set()
        for name, g in groups.items():
            w = g.get("weights") if isinstance(g, dict) else None
            if not isinstance(g, dict) or not isinstance(w if w is not None else {}, dict):
                raise bad(f"config_groups.{name}", g, "an object with a 'weights' object")
            w = w or {}
            if w.get("num_bits", 4) != 4 or w.get("symmetric", True) is not True:
                raise bad(f"config_groups.{name}.weights", {"num_bits": w.get("num_bits"),
                                                           "symmetric": w.get("symmetric")},
                          "symmetric 4-bit weights (the only INT4 scheme supported)")
            gs = w.get("group_size")
            if gs is not None and not (is_int(gs) and gs > 0):
                raise bad(f"config_groups.{name}.weights.group_size", gs, "a positive integer or null")
            if gs is not None:
                sizes.add(gs)
        return "int4", None, (sizes.pop() if len(sizes) == 1 else None)
    raise bad("quant_method", method, "'fp8', 'compressed-tensors' or none")


def dequant_fp8(w8: np.ndarray, scale_inv: np.ndarray, block=(128, 128)) -> np.ndarray:
    """W[r, c] = fp8[r, c] * weight_scale_inv[r // 128, c // 128]."""
    if not (len(block) == 2 and all(is_int(b) and b > 0 for b in block)):
        raise CheckpointError(f"block: got {short_repr(block)}, expected [rows, cols]: two positive integers")
    if w8.ndim != 2:
        raise CheckpointError(f"weight: expected a 2-d FP8 weight, got shape {w8.shape}")
    rows, cols = w8.shape
    br, bc = block
    want = (-(-rows // br), -(-cols // bc))
    if scale_inv.shape != want:
        raise CheckpointError(f"weight_scale_inv: expected shape {want} for a {w8.shape} weight in blocks of "
                              f"{list(block)}, got {scale_inv.shape}")
    if not np.issubdtype(scale_inv.dtype, np.floating):
        raise CheckpointError(f"weight_scale_inv: expected floating-point scales, got {scale_inv.dtype}")
    full = np.repeat(np.repeat(scale_inv.astype(np.float32), br, axis=0), bc, axis=1)[:rows, :cols]
    return (w8.astype(np.float32) * full).astype(np.float32)


def dequant_int4(packed: np.ndarray, scale: np.ndarray, shape, group_size: int | None = None) -> np.ndarray:
    """q = ((packed[r, c//8] >> 4*(c%8)) & 0xF) - 8;  W[r, c] = q * weight_scale[r, c // group]."""
    shp = np.asarray(shape).reshape(-1)
    if shp.size != 2 or shp.dtype.kind not in "iu" or (shp <= 0).any():
        raise CheckpointError(f"weight_shape: got {short_repr(shp.tolist())}, expected [rows, cols]: two positive "
                              f"integers")
    rows, cols = int(shp[0]), int(shp[1])
    if packed.dtype != np.int32:
        raise CheckpointError(f"weight_packed: dtype {packed.dtype}, expected int32 (eight 4-bit values each)")
    if packed.shape != (rows, -(-cols // 8)):
        raise CheckpointError(f"weight_packed: expected shape {(rows, -(-cols // 8))} for weight_shape "
                              f"{[rows, cols]}, got {packed.shape}")
    if not np.issubdtype(scale.dtype, np.floating):
        raise CheckpointError(f"weight_scale: expected floating-point scales, got {scale.dtype}")
    if scale.ndim != 2 or scale.shape[0] != rows or scale.shape[1] == 0 or cols % scale.shape[1]:
        raise CheckpointError(f"weight_scale: shape {scale.shape}, expected [{rows}, groups] with groups > 0 "
                              f"dividing the {cols} columns of weight_shape")
    group = cols // scale.shape[1]
    if group_size is not None and group != group_size:
        raise CheckpointError(f"weight_scale: shape {scale.shape} makes groups of {group} columns, expected "
                              f"quantization_config's group_size {group_size}")
    p = packed.astype(np.int64) & 0xFFFFFFFF                                    # [rows, cols/8]
    shifts = 4 * np.arange(8, dtype=np.int64)
    q = ((p[:, :, None] >> shifts) & 0xF).reshape(rows, -1)[:, :cols] - 8       # [rows, cols]
    return (q.astype(np.float32) * np.repeat(scale.astype(np.float32), group, axis=1)).astype(np.float32)


def _named(path: str, fn, *args):
    """Run a loader; every error it raises names ``path`` (prefixed when the message does not already)."""
    try:
        return fn(*args)
    except (CheckpointError, ConfigError) as e:
        if path in str(e):
            raise
        raise type(e)(f"{path}: {e}") from None


def _dequant(base: str, fn, *args):
    """``fn(*args)`` with its errors ("weight_scale: ...") naming the full key (``base`` + "weight_scale")."""
    try:
        return fn(*args)
    except CheckpointError as e:
        raise CheckpointError(f"{base}{e}") from None


def load_state_dict(path: str) -> tuple[TargetConfig, dict[str, np.ndarray]]:
    """Read, dequantize and check every tensor of an HF DeepSeek-V3-family directory.

    Returns the config and ``{hf key (no prefix): float32 array}``; raises CheckpointError / ConfigError naming
    the file, the key or field and the value at the first problem, before anything is built. Layers past
    ``num_hidden_layers`` are refused, except DeepSeek-V3's multi-token-prediction layers (``num_nextn_predict_layers``
    of them, recognised by their ``eh_proj``), which are skipped with a ``SkippedWeightsWarning``."""
    path = os.fspath(path)
    return _named(path, _load_state_dict, path)


def _load_state_dict(path: str):
    cfg, quant = read_config(path)
    method, block, group_size = _check_quant(quant, os.path.join(path, CONFIG_NAME))
    files = _weight_files(path)
    opened: dict[str, SafetensorsFile] = {}

    def stfile(full_key) -> SafetensorsFile:
        f = files[full_key]
        if f not in opened:
            opened[f] = SafetensorsFile(f)
        if full_key not in opened[f].header:
            raise CheckpointError(f"{full_key}: listed in the index but absent from {f}")
        return opened[f]

    def tensor(full_key):
        return stfile(full_key).get(full_key)

    prefix = cfg.weight_prefix
    L = cfg.num_hidden_layers
    _check_plausible(cfg, set(files), prefix)
    expected = expected_shapes(cfg)
    # group the stored keys by the weight they make up; set aside layers past num_hidden_layers
    bases: dict[str, dict[str, str]] = {}
    beyond: dict[int, list[str]] = {}
    for full in files:
        if prefix and not full.startswith(prefix):
            continue                                          # vision tower etc. of a multimodal checkpoint
        key = full[len(prefix):]
        if key.endswith("rotary_emb.inv_freq"):
            continue                                          # a cache of the rope table, derived from the config
        layer = _layer_of(key)
        if layer is not None and layer >= L:
            beyond.setdefault(layer, []).append(full)
            continue
        for suffix in ("weight_scale_inv", "weight_packed", "weight_scale", "weight_shape"):
            if key.endswith("." + suffix):
                bases.setdefault(key[: -len(suffix)] + "weight", {})[suffix] = full
                break
        else:
            bases.setdefault(key, {})["value"] = full
    for layer, keys in sorted(beyond.items()):
        mtp = L <= layer < L + cfg.num_nextn_predict_layers and any(
            k[len(prefix):].startswith(f"model.layers.{layer}.eh_proj.") for k in keys)
        if not mtp:
            raise CheckpointError(
                f"{sorted(keys)[0]}: layer {layer} is past num_hidden_layers = {L} and is not a multi-token-"
                f"prediction layer (num_nextn_predict_layers = {cfg.num_nextn_predict_layers}; an MTP layer has an "
                f"eh_proj), expected no weights past the config's layers (does config.json match the checkpoint?)")
    if beyond:
        warnings.warn(f"{path}: skipped the multi-token-prediction layer(s) {sorted(beyond)} "
                      f"({sum(map(len, beyond.values()))} tensors): the engine does not run MTP",
                      SkippedWeightsWarning, stacklevel=4)

    state: dict[str, np.ndarray] = {}
    quantized = 0                                         # tensors stored fp8 / int4
    for key, parts in sorted(bases.items()):
        full = prefix + key
        if key not in expected and ".shared_experts." in key and not cfg.n_shared_experts and set(parts) == {"value"} \
                and 0 in stfile(parts["value"]).shape(parts["value"]):
            continue                                          # transformers saves 0-wide shared experts
        if key not in expected:
            raise CheckpointError(f"{full}: unexpected tensor for this config (architecture mismatch?)")
        base = full[:-len("weight")]
        if "weight_packed" in parts:
            if method != "int4":
                raise CheckpointError(f"{full}: INT4-packed tensor but quantization_config is {method!r}")
            stray = sorted(set(parts) - {"weight_packed", "weight_scale", "weight_shape"})
            if stray:
                raise CheckpointError(f"{base}{'weight' if stray[0] == 'value' else stray[0]}: unexpected "
                                      f"beside {base}weight_packed")
            for need in ("weight_scale", "weight_shape"):
                if need not in parts:
                    raise CheckpointError(f"{base}{need}: missing (needed to unpack weight_packed)")
            w = _dequant(base, dequant_int4, tensor(parts["weight_packed"]), tensor(parts["weight_scale"]),
                         tensor(parts["weight_shape"]), group_size)
            quantized += 1
        elif "value" in parts:
            stray = sorted(set(parts) - {"value", "weight_scale_inv"})
            if stray:
                raise CheckpointError(f"{base}{stray[0]}: unexpected beside {full} (no weight_packed)")
            w = tensor(parts["value"])
            dtype = stfile(parts["value"]).dtype(parts["value"])
            if "weight_scale_inv" in parts:
                if method != "fp8":
                    raise CheckpointError(f"{full}: FP8 scales present but quantization_config is {method!r}")
                if dtype != "F8_E4M3":
                    raise CheckpointError(f"{full}: dtype {dtype} with a weight_scale_inv, expected F8_E4M3")
                w = _dequant(base, dequant_fp8, w, tensor(parts["weight_scale_inv"]), block)
                quantized += 1
            elif dtype == "F8_E4M3":
                raise CheckpointError(f"{base}weight_scale_inv: missing (needed for the FP8 weight)")
        else:
            raise CheckpointError(f"{full}: missing, but its {sorted(parts)[0]} is present (scales without the "
                                  f"tensor they scale)")
        if tuple(w.shape) != expected[key]:
            raise CheckpointError(f"{full}: expected shape {expected[key]}, got {tuple(w.shape)}")
        if not np.issubdtype(w.dtype, np.floating):
            raise CheckpointError(f"{full}: expected a floating-point tensor, got {w.dtype}")
        state[key] = np.ascontiguousarray(w, dtype=np.float32)
    missing = sorted(set(expected) - set(state))
    if missing:
        raise CheckpointError(f"{prefix}{missing[0]}: missing from the checkpoint ({len(missing)} tensors missing)")
    if method != "none" and not quantized:
        warnings.warn(f"{path}: config.json's quantization_config says {method}, but no tensor is stored {method} "
                      f"(no weight_scale_inv / weight_packed): loaded the weights as they are",
                      SkippedWeightsWarning, stacklevel=4)
    return cfg, state


def read_tensors(path: str) -> dict[str, np.ndarray]:
    """Every tensor of a directory's safetensors (index or files) as float32 (a drafter: no quantization)."""
    path = os.fspath(path)
    return _named(path, _read_tensors, path)


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    opened: dict[str, SafetensorsFile] = {}
    out = {}
    for key, f in sorted(_weight_files(path).items()):
        if f not in opened:
            opened[f] = SafetensorsFile(f)
        st = opened[f]
        if key not in st.header:
            raise CheckpointError(f"{key}: listed in the index but absent from {f}")
        if st.dtype(key) not in ("F32", "F16", "BF16", "F64"):
            raise CheckpointError(f"{f}: {key}: dtype {st.dtype(key)}, expected F32, BF16 or F16")
        out[key] = np.ascontiguousarray(st.get(key), dtype=np.float32)
    return out


# ------------------------------------------------------------------------------------------------ saving
def save_state_dict(path: str, cfg: TargetConfig, state: dict[str, np.ndarray], extra=None) -> None:
    """Write ``config.json`` + ``model.safetensors`` (fp32, HF key layout, no prefix) into ``path``, atomically
    (``save_dir``); ``extra(staging)`` may write more files (a tokenizer) into the same commit. The state is
    checked against ``cfg`` first: a save never writes a checkpoint that would not load."""
    cfg = cfg.validate()
    want = expected_shapes(cfg)
    for key in sorted(state):
        if key not in want:
            raise CheckpointError(f"state: {key}: unexpected tensor for this config")
    for key, shape in want.items():
        if key not in state:
            raise CheckpointError(f"state: {key}: missing")
        if tuple(np.shape(state[key])) != shape:
            raise CheckpointError(f"state: {key}: expected shape {shape}, got {tuple(np.shape(state[key]))}")

    def write(staging):
        save_safetensors(os.path.join(staging, WEIGHTS_NAME), state)
        write_json(os.path.join(staging, CONFIG_NAME), cfg.to_hf_dict())
        if extra is not None:
            extra(staging)

    save_dir(path, write)


__all__ = ["CheckpointError", "ConfigError", "SkippedWeightsWarning", "SafetensorsFile", "load_state_dict",
           "save_state_dict", "save_dir", "read_tensors", "expected_shapes", "dequant_fp8", "dequant_int4",
           "fp32_to_bf16_bits", "save_safetensors"]
