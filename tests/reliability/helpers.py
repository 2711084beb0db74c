"""Shared by the reliability tests: tiny checkpoints on disk, raw safetensors editing, directory snapshots."""
import json
import os
import struct

import numpy as np

import kdtree_numba as kd
from kdtree_numba.model import checkpoint as ck

INDEX = "model.safetensors.index.json"


def tiny(seed=0, **kw):
    """A small random target (2 layers: one dense, one MoE) on the current backend."""
    return kd.tiny_target(seed, **{"num_hidden_layers": 2, "vocab_size": 64, **kw})


def same_state(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def snapshot(d) -> dict:
    """{relative path: bytes} of every file under ``d`` (directories as '/'-ended names)."""
    out = {}
    for root, dirs, files in os.walk(d):
        for x in dirs:
            out[os.path.relpath(os.path.join(root, x), d) + "/"] = b""
        for f in files:
            p = os.path.join(root, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def save_sharded(target, path, n=2):
    """target as transformers writes a sharded checkpoint: config.json + index + n shards."""
    os.makedirs(path, exist_ok=True)
    sd = target.state_dict()
    keys = sorted(sd)
    wmap = {}
    for i in range(n):
        name = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
        part = {k: sd[k] for k in keys[i::n]}
        ck.save_safetensors(os.path.join(path, name), part)
        wmap.update({k: name for k in part})
    with open(os.path.join(path, INDEX), "w") as f:
        json.dump({"metadata": {"total_size": sum(a.nbytes for a in sd.values())}, "weight_map": wmap}, f)
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(target.config.to_hf_dict(), f)
    return path


def read_raw(path):
    """(header dict incl. __metadata__, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def write_raw(path, header, data: bytes, header_text: str | None = None, pad: int = 0):
    """A safetensors file from a header (dict, or its exact JSON text) and data bytes."""
    text = (header_text if header_text is not None else json.dumps(header, separators=(",", ":"))).encode()
    text += b" " * ((-len(text) % 8) + pad)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data)


def write_tensors_raw(path, entries):
    """A safetensors file from ``[(key, dtype name, shape, raw bytes)]`` (any dtype, e.g. F8_E4M3)."""
    header, chunks, off = {}, [], 0
    for key, dt, shape, raw in entries:
        header[key] = {"dtype": dt, "shape": list(shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    write_raw(path, header, b"".join(chunks))


def edit_config(path, change):
    p = os.path.join(path, "config.json")
    with open(p) as f:
        raw = json.load(f)
    change(raw)
    with open(p, "w") as f:
        json.dump(raw, f)
