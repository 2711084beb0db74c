"""Token choice at the target's logits: argmax (T = 0) or a seeded sample (T > 0), one token per row.

    T = 0:  token = argmax_v x[v]                                       (lowest id on ties)
    T > 0:  token = argmax_v ((x[v] - max x) / T + g[v]),   g[v] = -log(-log(u)),   u = hash(seed, stream, row, v)
a sample from softmax(x / T) by the Gumbel-max trick (the shift by the row max keeps every score in [-inf, 0], so
a vanishing T cannot overflow), with u in (0, 1) from Philox4x32-10, a counter-based generator: no RNG state, so a
run is reproducible from its seed, every (token, row, stream) counter gets an independent draw, and the reference
computes the same u (``uniforms_ref``). A row holding NaN gives token -1, which the decode loop turns into an error.
Rows are independent draws (counter row = the row) unless ``row_streams`` is given: then row r draws from stream
``stream + row_streams[r]`` (counter row 0). Decoding keys every draw by *position*: a row of logits computed at
the token in position p draws from stream p - a plain decode step's one row (stream = the fed token's position),
a DDTree verify's node rows (stream = the root's position, row_streams = the nodes' depths), the prefill's last
row (stream = n - 1). So plain decoding, the DFlash chain and DDTree, direct or replayed, draw the same noise for
the same position, and emit the same tokens at every temperature, not only at T = 0 (tree_accept's docstring).
Mapping: one block per row (``_choose_kernel``); threads stride over the vocabulary keeping their best (score,
index) - at T > 0 after a strided max and a block max (primitives.smem_max) for the row max - then a block
arg-max of the (value, index) pairs (primitives.smem_argmax: lower index on ties). Blocks of a power of two.
Rows longer than ``CHUNK`` columns are split: one block per row walked a 163840-wide row in 291 us (ncu, H200, 9 %
of a Kimi-shaped decode step). Then blocks (row, chunk) find each chunk's max (``_chunk_max_kernel``, T > 0 only),
each chunk's winner against the row max taken from those (``_chunk_best_kernel``: the same scores bit for bit, as
max is exact in any order), and one block per row picks among the chunk winners (``_choose_parts_kernel``, lower
index on ties, so the token is the one-block kernel's).
Shapes: logits [M, V] float32 -> tokens [M] int32; seed < 2^64, stream <= 2^32 - 1 (an int, or a device int32 [1]
array for CUDA-graph replay). For a captured program that serves any request, temperature and seed may live on the
device too (``settings(T, seed)``: float64 [1] and uint32 [2] = (low, high) words), so one graph serves every
temperature and seed; the kernel computes the same bits either way (T = T_host + T_dev[0], key = host ^ device).
Example: choose_tokens([[0, 2, 2, -1]], 0.0) -> [1];  at T > 0 the kernel's token equals choose_tokens_ref's;
choose_tokens(x [3, V], 0.7, 5, stream=40, row_streams=[0, 1, 1]) draws row 0 from stream 40 and rows 1 and 2
both from stream 41 (the same uniforms: two nodes at depth 1 of a tree rooted at position 40).
"""
from __future__ import annotations

import math

import numpy as np
from numba import cuda, float64, int32, int64, uint64

from .. import backend
from . import _checks
from .primitives import argmax_beats, smem_argmax, smem_max

MAX_THREADS = 512          # the shared reduction buffers' size (launches use at most 256 threads)
CHUNK = 4096               # columns per block when a row is split (Kimi's 163840: 40 blocks a row)
M32 = 0xFFFFFFFF
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)


# ------------------------------------------------------------------------------------------------ references
def philox_ref(c0, c1, c2, c3, k0: int, k1: int):
    """Philox4x32-10 (Salmon et al. 2011, as in cuRAND): first output word of counter (c0..c3) under key (k0, k1).
    Counters may be uint64 arrays holding 32-bit values; every product fits in 64 bits."""
    c0, c1, c2, c3 = (np.asarray(c, np.uint64) for c in (c0, c1, c2, c3))
    k0, k1 = np.uint64(k0), np.uint64(k1)
    m0, m1, mask = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1]), np.uint64(M32)
    for _ in range(10):
        p0, p1 = m0 * c0, m1 * c2
        c0, c1, c2, c3 = (p1 >> np.uint64(32)) ^ c1 ^ k0, p1 & mask, (p0 >> np.uint64(32)) ^ c3 ^ k1, p0 & mask
        k0, k1 = (k0 + np.uint64(PHILOX_W[0])) & mask, (k1 + np.uint64(PHILOX_W[1])) & mask
    return c0


def uniforms_ref(seed: int, stream: int, row: int, n: int) -> np.ndarray:
    """The sampler's u in (0, 1) for tokens 0..n-1 of one row (float64); identical to the kernel's:
    u = (philox(counter = (token, row, stream, 0), key = seed) + 0.5) / 2^32."""
    v = np.arange(n, dtype=np.uint64)
    z = np.zeros(n, np.uint64)
    h = philox_ref(v, z + np.uint64(row & M32), z + np.uint64(stream & M32), z, seed & M32, (seed >> 32) & M32)
    return (h.astype(np.float64) + 0.5) / 4294967296.0


def choose_tokens_ref(logits, temperature: float, seed: int = 0, stream: int = 0, row_streams=None):
    """T == 0: argmax (first max); T > 0: Gumbel-max sample with the counter-based uniforms,
    argmax_v (x_v - max x) / T + g_v in float64: the shift keeps every scaled logit in [-inf, 0], so a vanishing
    T (1e-308) cannot overflow to inf and tie unrelated tokens. NaN rows and rows without a value > -inf -> -1.
    Row r's uniforms: row r of ``stream``, or with ``row_streams`` row 0 of stream + row_streams[r]."""
    x = np.asarray(logits, np.float32)
    out = np.empty(x.shape[0], np.int32)
    for r in range(x.shape[0]):
        if np.isnan(x[r]).any() or not (x[r] > -np.inf).any():
            out[r] = -1
        elif temperature == 0:
            out[r] = int(np.argmax(x[r]))
        else:
            s, row = (stream, r) if row_streams is None else (stream + int(row_streams[r]), 0)
            g = -np.log(-np.log(uniforms_ref(seed, s, row, x.shape[1])))
            xr = x[r].astype(np.float64)
            with np.errstate(over="ignore"):             # tiny T: the non-maximal entries go to -inf, rightly
                out[r] = int(np.argmax((xr - xr.max()) / temperature + g))
    return out


# ------------------------------------------------------------------------------------------------ device helpers
@cuda.jit(device=True)
def _philox_u(v, row, stream, k0, k1):
    """u in (0, 1) from Philox4x32-10 of counter (v, row, stream, 0) and key (k0, k1) (see philox_ref)."""
    c0 = uint64(v)
    c1 = uint64(row)
    c2 = uint64(stream)
    c3 = uint64(0)
    mask = uint64(M32)
    for _ in range(10):
        p0 = uint64(PHILOX_M[0]) * c0
        p1 = uint64(PHILOX_M[1]) * c2
        n0 = (p1 >> uint64(32)) ^ c1 ^ k0
        n2 = (p0 >> uint64(32)) ^ c3 ^ k1
        c1 = p1 & mask
        c3 = p0 & mask
        c0 = n0
        c2 = n2
        k0 = (k0 + uint64(PHILOX_W[0])) & mask
        k1 = (k1 + uint64(PHILOX_W[1])) & mask
    return (float64(c0) + 0.5) / 4294967296.0


# ------------------------------------------------------------------------------------------------ kernels
@cuda.jit(device=True, inline=True)
def _key_and_settings(temperature0, temperature_dev, seed_lo, seed_hi, seed_dev, stream0, stream_dev):
    """(T, k0, k1, stream): host part + device part of each (graph replay: device parts change between replays)."""
    return (temperature0 + temperature_dev[0], uint64(seed_lo) ^ uint64(seed_dev[0]),
            uint64(seed_hi) ^ uint64(seed_dev[1]), stream0 + stream_dev[0])


@cuda.jit(device=True, inline=True)
def _strided_max(x, row, v0, v1):
    """This thread's max of x[row, v0 + tid :: threads] below v1, in float64 (-inf if none)."""
    m = -math.inf
    for v in range(v0 + cuda.threadIdx.x, v1, cuda.blockDim.x):
        m = max(m, float64(x[row, v]))
    return m


@cuda.jit(device=True, inline=True)
def _noise_key(row, stream, row_streams, keyed):
    """(counter row, stream) of row ``row``'s draws: (row, stream), or with ``keyed`` (0, stream +
    row_streams[row]) - the module docstring's position keys."""
    if keyed:
        return 0, (int64(stream) + int64(row_streams[row])) & int64(M32)
    return row, stream


@cuda.jit(device=True, inline=True)
def _strided_best(x, row, v0, v1, temperature, top, k0, k1, noise_row, stream, nan_flag):
    """This thread's best (score, v) over x[row, v0 + tid :: threads] below v1 (argmax_beats; (-inf, V) if none);
    score = x (T = 0) or (x - top) / T + Gumbel(u(v, noise_row, stream)). A NaN sets nan_flag[0] and is skipped."""
    best = -math.inf
    best_i = x.shape[1]
    for v in range(v0 + cuda.threadIdx.x, v1, cuda.blockDim.x):
        val = x[row, v]
        if val != val:
            nan_flag[0] = 1
            continue
        score = float64(val)
        if temperature > 0:
            u = _philox_u(v, noise_row, stream, k0, k1)
            score = (score - top) / temperature - math.log(-math.log(u))
        if argmax_beats(score, v, best, best_i):
            best = score
            best_i = v
    return best, best_i


@cuda.jit(device=True, inline=True)
def _block_best(x, row, v0, v1, temperature, k0, k1, noise_row, stream, part_max, max_from_parts):
    """The block's best (score, v) over x[row, v0:v1] and its NaN flag, to every thread. At T > 0 the scores are
    taken against the row max: the max of the chunk maxima ``part_max[row]`` when ``max_from_parts``, else this
    block's own max over v0:v1 (the whole row)."""
    red_v = cuda.shared.array(MAX_THREADS, float64)
    red_i = cuda.shared.array(MAX_THREADS, int32)
    nan_flag = cuda.shared.array(1, int32)
    if cuda.threadIdx.x == 0:
        nan_flag[0] = 0
    cuda.syncthreads()
    top = float64(0.0)
    if temperature > 0 and max_from_parts:        # exact: max is the same in any order
        top = -math.inf
        for j in range(part_max.shape[1]):
            top = max(top, float64(part_max[row, j]))
    elif temperature > 0:                         # the row max: scores (x - top) / T stay in [-inf, 0]
        top = smem_max(_strided_max(x, row, v0, v1), red_v)
        cuda.syncthreads()                        # everyone has read red_v before the arg-max reuses it
    best, best_i = _strided_best(x, row, v0, v1, temperature, top, k0, k1, noise_row, stream, nan_flag)
    best, best_i = smem_argmax(best, best_i, red_v, red_i)   # its barriers also publish nan_flag
    return best, best_i, nan_flag[0]


@cuda.jit
def _choose_kernel(x, temperature0, temperature_dev, seed_lo, seed_hi, seed_dev, stream0, stream_dev, row_streams,
                   keyed, out):
    """One block per row: the row max (T > 0), then the row's arg-max of the scores."""
    row = cuda.blockIdx.x
    V = x.shape[1]
    temperature, k0, k1, stream = _key_and_settings(temperature0, temperature_dev, seed_lo, seed_hi, seed_dev,
                                                    stream0, stream_dev)
    noise_row, stream = _noise_key(row, stream, row_streams, keyed)
    _, win, nan = _block_best(x, row, 0, V, temperature, k0, k1, noise_row, stream, x, False)
    if cuda.threadIdx.x == 0:
        out[row] = -1 if nan or win >= V else win


@cuda.jit
def _chunk_max_kernel(x, temperature0, temperature_dev, chunk, part_max):
    """Block (row, c): max of x[row, c*chunk : (c+1)*chunk] -> part_max[row, c]; nothing at T = 0 (not needed)."""
    row = cuda.blockIdx.x
    c = cuda.blockIdx.y
    if temperature0 + temperature_dev[0] <= 0:
        return
    red = cuda.shared.array(MAX_THREADS, float64)
    v0 = c * chunk
    m = smem_max(_strided_max(x, row, v0, min(v0 + chunk, x.shape[1])), red)
    if cuda.threadIdx.x == 0:
        part_max[row, c] = m


@cuda.jit
def _chunk_best_kernel(x, temperature0, temperature_dev, seed_lo, seed_hi, seed_dev, stream0, stream_dev,
                       row_streams, keyed, chunk, part_max, part_v, part_i):
    """Block (row, c): the best (score, v) of chunk c -> part_v / part_i [row, c]; (+inf, -1) if it met a NaN."""
    row = cuda.blockIdx.x
    c = cuda.blockIdx.y
    temperature, k0, k1, stream = _key_and_settings(temperature0, temperature_dev, seed_lo, seed_hi, seed_dev,
                                                    stream0, stream_dev)
    noise_row, stream = _noise_key(row, stream, row_streams, keyed)
    v0 = c * chunk
    best, best_i, nan = _block_best(x, row, v0, min(v0 + chunk, x.shape[1]), temperature, k0, k1, noise_row, stream,
                                    part_max, True)
    if cuda.threadIdx.x == 0:
        part_v[row, c] = math.inf if nan else best
        part_i[row, c] = -1 if nan else best_i


@cuda.jit
def _choose_parts_kernel(part_v, part_i, V, out):
    """One block per row: the arg-max of the row's chunk winners (lower index on ties, as over the whole row); a
    chunk that met a NaN is (+inf, -1), which beats every other winner, so the row gets -1."""
    row = cuda.blockIdx.x
    red_v = cuda.shared.array(MAX_THREADS, float64)
    red_i = cuda.shared.array(MAX_THREADS, int32)
    best = -math.inf
    best_i = V
    for c in range(cuda.threadIdx.x, part_v.shape[1], cuda.blockDim.x):
        if argmax_beats(part_v[row, c], part_i[row, c], best, best_i):
            best = part_v[row, c]
            best_i = part_i[row, c]
    win = smem_argmax(best, best_i, red_v, red_i)[1]
    if cuda.threadIdx.x == 0:
        out[row] = -1 if win < 0 or win >= V else win


# ------------------------------------------------------------------------------------------------ launchers
_ZEROS: dict = {}      # backend name -> (float64 [1], uint32 [2]) zeros: the device parts of host settings


def settings(temperature: float, seed: int, out=None) -> tuple:
    """Device-side (temperature float64 [1], seed uint32 [2] = low, high words) for ``choose_tokens``, validated
    like its host arguments; ``out``: the pair to overwrite (a captured program's, so its graph sees the new values).
    Example: settings(0.8, 2**32 + 5) -> ([0.8], [5, 1])."""
    temperature = _checks.real(temperature, "temperature", lo=0.0)
    seed = _checks.integer(seed, "seed", lo=0, hi=2 ** 64 - 1)
    t = backend.empty((1,), np.float64) if out is None else out[0]
    s = backend.empty((2,), np.uint32) if out is None else out[1]
    backend.upload(t, np.array([temperature], np.float64))                 # one host-to-device copy each,
    backend.upload(s, np.array([seed & M32, seed >> 32], np.uint32))       # no kernel
    return t, s


def _host_and_device(temperature, seed) -> tuple:
    """(T_host, T_dev, seed_lo, seed_hi, seed_dev): host values with zero device parts, or device ``settings``
    arrays (unchecked: a host read; their producer validated them) with zero host parts."""
    name = backend.name
    if name not in _ZEROS:
        _ZEROS[name] = (backend.zeros((1,), np.float64), backend.zeros((2,), np.uint32))
    t_zero, s_zero = _ZEROS[name]
    if hasattr(temperature, "shape"):
        t_host, t_dev = 0.0, _checks.array(temperature, "temperature", dtype=np.float64, shape=(1,))
    else:
        t_host, t_dev = _checks.real(temperature, "temperature", lo=0.0), t_zero
    if hasattr(seed, "shape"):
        lo, hi, s_dev = 0, 0, _checks.array(seed, "seed", dtype=np.uint32, shape=(2,))
    else:
        seed = _checks.integer(seed, "seed", lo=0, hi=2 ** 64 - 1)
        lo, hi, s_dev = seed & M32, seed >> 32, s_zero
    return t_host, t_dev, lo, hi, s_dev


def choose_tokens(logits, temperature: float = 0.0, seed: int = 0, stream: int = 0, out=None, chunk: int = CHUNK,
                  row_streams=None):
    """One token per row of ``logits [M, V]``: argmax (T = 0) or a seeded Gumbel-max sample (T > 0).

    ``stream`` separates the random draws of different calls; the rows draw independently (row r of the stream),
    or with ``row_streams`` (int32 [M], on the backend) row r draws from stream + row_streams[r] - the position
    keys decoding uses (module docstring). Rows with NaN give -1. ``stream`` may be a device int32 [1] array (or
    ``(array, offset)``: ``_checks.device_int``), ``temperature`` and ``seed`` the device arrays of ``settings``
    (graph replay: decode/replay.py) - the same tokens as the host values.
    Rows longer than ``chunk`` are split over blocks of ``chunk`` columns (three launches; module docstring)."""
    x = _checks.array(logits, "logits", dtype=np.float32, ndim=2)
    t_host, t_dev, lo, hi, s_dev = _host_and_device(temperature, seed)
    stream0, stream_dev = _checks.device_int(stream, "stream")
    if stream0 > M32:
        raise ValueError(f"stream: expected an integer <= {M32}, got {stream0}")
    out = _checks.out_array(out, "out", (x.shape[0],), np.int32)
    chunk = _checks.integer(chunk, "chunk", lo=1)
    keyed = row_streams is not None
    if keyed:
        row_streams = _checks.array(row_streams, "row_streams", dtype=np.int32, shape=(x.shape[0],))
    if backend.name == "numpy":
        t = t_host + float(t_dev[0])
        out[...] = choose_tokens_ref(x, t, (lo ^ int(s_dev[0])) | (hi ^ int(s_dev[1])) << 32,
                                     _checks.host_int(stream), row_streams)
        return out
    if not keyed:
        row_streams = backend.placeholder((1,), np.int32)                  # unread (keyed False): a cached stand-in
    M, V = x.shape
    if M == 0:
        return out
    threads = backend.block_size(256, 32)
    if V <= chunk:
        backend.launch(_choose_kernel, M, threads, x, t_host, t_dev, lo, hi, s_dev, stream0, stream_dev, row_streams,
                       keyed, out)
        return out
    C = -(-V // chunk)
    part_max = backend.empty((M, C), np.float64)                            # [M, C] chunk maxima (T > 0)
    part_v = backend.empty((M, C), np.float64)                              # [M, C] chunk winners' scores
    part_i = backend.empty((M, C), np.int32)                                # [M, C] and their columns
    backend.launch(_chunk_max_kernel, (M, C), threads, x, t_host, t_dev, chunk, part_max)
    backend.launch(_chunk_best_kernel, (M, C), threads, x, t_host, t_dev, lo, hi, s_dev, stream0, stream_dev,
                   row_streams, keyed, chunk, part_max, part_v, part_i)
    backend.launch(_choose_parts_kernel, M, backend.block_size(64, 32), part_v, part_i, V, out)
    return out
