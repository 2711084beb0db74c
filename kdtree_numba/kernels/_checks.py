"""Argument checks shared by the stage launchers: every error names the argument, what it got and what was expected.

Launchers call these before any launch, so bad input never reaches a kernel.
"""
from __future__ import annotations

import numbers

import numpy as np

from .. import backend


def array(x, arg: str, dtype=None, ndim: int | None = None, shape: tuple | None = None, kinds: str | None = None,
          strided: bool = False):
    """Return ``x`` as an array of the current backend after checking it.

    dtype: exact dtype required; kinds: allowed dtype kinds instead (e.g. "iu" for any integer);
    shape: entries may be None (any size). Host arrays are moved to the device on the cuda backend;
    non-contiguous arrays are refused rather than silently copied, unless ``strided`` (a kernel that indexes
    every axis itself, e.g. RoPE writing a slice of a wider row).
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{arg}: expected an array, got {type(x).__name__}")
    if dtype is not None and np.dtype(x.dtype) != np.dtype(dtype):
        raise ValueError(f"{arg}: expected dtype {np.dtype(dtype).name}, got {np.dtype(x.dtype).name}")
    if kinds is not None and np.dtype(x.dtype).kind not in kinds:
        want = {"iu": "an integer dtype", "f": "a floating dtype"}.get(kinds, f"dtype kind in {kinds!r}")
        raise ValueError(f"{arg}: expected {want}, got {np.dtype(x.dtype).name}")
    if ndim is not None and x.ndim != ndim:
        raise ValueError(f"{arg}: expected {ndim} dimensions, got shape {tuple(x.shape)}")
    if shape is not None:
        if len(shape) != x.ndim or any(s is not None and s != d for s, d in zip(shape, x.shape)):
            want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
            raise ValueError(f"{arg}: expected shape {want}, got {tuple(x.shape)}")
    flags = getattr(x, "flags", None)
    if flags is not None and not flags["C_CONTIGUOUS"]:
        if not strided:
            raise ValueError(f"{arg}: expected a C-contiguous array, got strides {tuple(x.strides)}")
        if backend.is_device(x) == (backend.name == "cuda"):
            return x                                  # already where the kernel reads it: a view, not a copy
    return backend.asarray(x)


def out_array(out, arg: str, shape: tuple, dtype, strided: bool = False):
    """A fresh output array, or the caller's ``out`` after checking its shape and dtype (``strided``: as
    ``array``)."""
    if out is None:
        return backend.empty(shape, dtype)
    if backend.name == "cuda" and not backend.is_device(out):
        raise ValueError(f"{arg}: expected a device (CuPy) array on the cuda backend, got {type(out).__name__}")
    return array(out, arg, dtype=dtype, shape=shape, strided=strided)


def linear_operands(x, w, out, accumulate: bool):
    """The operands of ``out (+)= x @ w.T`` checked (the skinny and wide GEMMs' launchers): x [M, K] and w [N, K]
    float32 (rows may be strided), out [M, N] (allocated when None; an array is required with ``accumulate``).
    Returns (x, w, out)."""
    x = array(x, "x", dtype=np.float32, ndim=2, strided=True)
    w = array(w, "w", dtype=np.float32, ndim=2, shape=(None, x.shape[1]), strided=True)
    if accumulate and out is None:
        raise ValueError("out: accumulate=True adds onto out, expected an array, got None")
    return x, w, out_array(out, "out", (x.shape[0], w.shape[0]), np.float32, strided=True)


def integer(value, arg: str, lo: int | None = None, hi: int | None = None) -> int:
    """A Python int within [lo, hi] (bools and floats are refused)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{arg}: expected an integer, got {value!r}")
    value = int(value)
    if lo is not None and value < lo:
        raise ValueError(f"{arg}: expected an integer >= {lo}, got {value}")
    if hi is not None and value > hi:
        raise ValueError(f"{arg}: expected an integer <= {hi}, got {value}")
    return value


def real(value, arg: str, lo: float | None = None, lo_open: bool = False) -> float:
    """A finite float, optionally >= lo (or > lo when lo_open)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{arg}: expected a number, got {value!r}")
    value = float(value)
    if not np.isfinite(value):
        raise ValueError(f"{arg}: expected a finite number, got {value}")
    if lo is not None and (value <= lo if lo_open else value < lo):
        raise ValueError(f"{arg}: expected a number {'>' if lo_open else '>='} {lo}, got {value}")
    return value


_ZERO: dict = {}          # backend name -> a [1] int32 zero array (the device part of a host scalar)


def device_int(value, arg: str, lo: int = 0) -> tuple:
    """A launch scalar that may live on the device: ``(host_part, device_part)`` with value = host + device[0].

    An int (>= lo) gives ``(value, zero)``; a backend int32 array of shape [1] gives ``(0, value)``, read by the
    kernel itself - so a CUDA-graph replay sees the value the previous step left there (decode/replay.py), with
    no host read; a pair ``(array, int)`` gives ``(int, array)``: the device value plus a host offset, added by the
    kernel (no launch to add them first). The device part is not range-checked (that would be a host read): its
    producer guarantees it.
    Example: ``device_int(7, "start") -> (7, [0])``; ``device_int(pos_dev, "start") -> (0, pos_dev)``;
    ``device_int((pos_dev, 16), "n_keys") -> (16, pos_dev)``."""
    if isinstance(value, tuple):
        if len(value) != 2 or not hasattr(value[0], "shape"):
            raise TypeError(f"{arg}: expected an int, a device int32 [1] array or (array, int), got {value!r}")
        array(value[0], arg, dtype=np.int32, shape=(1,))
        return integer(value[1], arg), value[0]
    if hasattr(value, "shape"):
        array(value, arg, dtype=np.int32, shape=(1,))
        return 0, value
    value = integer(value, arg, lo=lo)
    if backend.name not in _ZERO:
        _ZERO[backend.name] = backend.zeros((1,), np.int32)
    return value, _ZERO[backend.name]


def host_int(value) -> int:
    """The value of a ``device_int`` argument on the host (a device read for a device array: references only)."""
    if isinstance(value, tuple):
        return host_int(value[0]) + int(value[1])
    return int(backend.to_host(value)[0]) if hasattr(value, "shape") else int(value)


def on_device(value) -> bool:
    """Whether a ``device_int`` argument has a device part (an array, or an (array, int) pair)."""
    return hasattr(value, "shape") or isinstance(value, tuple)
