"""The backend: ``cuda`` | ``sim`` | ``numpy``, chosen per process; ``use`` switches a thread to NumPy for a block.

Chosen once per process by ``KDTREE_BACKEND=cuda|sim|numpy|auto`` (default ``auto``: ``cuda`` when a GPU and CuPy
are present, else ``numpy``), read when ``kdtree_numba`` is first imported.

- ``cuda``  arrays are CuPy arrays (cuBLAS GEMMs, memory pool, one non-blocking stream); stage kernels are
            numba.cuda kernels launched on cached numba views of those arrays.
- ``sim``   the same numba.cuda kernels on numba's CUDA simulator, arrays are NumPy. ``NUMBA_ENABLE_CUDASIM=1``
            is set here, before numba is imported.
- ``numpy`` every stage runs its plain NumPy reference.

``use("numpy")`` switches a block of code to the NumPy references while the process backend is ``cuda`` or
``sim`` (tests compare kernel and reference in one process; a target remembers the backend it was built on).

Also here: the numpy>=2.5 compat shim numba-cuda 0.30 needs (``np.row_stack``), the simulator's barrier poll made
to yield the GIL (``_simulator_yields_in_barrier_poll``), array helpers (``asarray``,
``to_host``, ``empty``), ``launch`` (numba views + the stream, in one place), ``branch`` (a block of launches on a
side stream, joined later: concurrent kernels inside one captured graph) and ``timer`` (device events).
"""
from __future__ import annotations

import collections
import contextlib
import os
import sys
import threading
import time

import numpy as np

_CHOICES = ("auto", "cuda", "sim", "numpy")

# numba-cuda 0.30 calls np.row_stack in its first compile; numpy 2.5 removed it (measured on the H200 image).
if not hasattr(np, "row_stack"):
    np.row_stack = np.vstack


def _requested() -> str:
    raw = os.environ.get("KDTREE_BACKEND", "auto")
    choice = raw.strip().lower() or "auto"
    if choice not in _CHOICES:
        raise ValueError(f"KDTREE_BACKEND={raw!r}: expected one of cuda, sim, numpy, auto")
    return choice


def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device (never imports numba)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def _resolve(choice: str) -> str:
    if choice == "auto":
        return "cuda" if gpu_available() else "numpy"
    if choice == "cuda" and not gpu_available():
        raise RuntimeError("KDTREE_BACKEND=cuda: no CUDA GPU visible to CuPy (install the 'gpu' extra, or use "
                           "KDTREE_BACKEND=sim or numpy)")
    if choice == "sim":
        cuda_mod = sys.modules.get("numba.cuda")
        if cuda_mod is not None and os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
            raise RuntimeError("KDTREE_BACKEND=sim: numba.cuda was imported before kdtree_numba without "
                               "NUMBA_ENABLE_CUDASIM=1; import kdtree_numba first or set the variable yourself")
        os.environ["NUMBA_ENABLE_CUDASIM"] = "1"
    return choice


#: the backend the process was started with ("cuda" | "sim" | "numpy")
process_name: str = _resolve(_requested())
# ``name`` / ``xp`` (module attributes, __getattr__ below): the backend in force now in THIS thread - the process
# backend unless ``use`` switched the thread to numpy for a block. Per thread, so that a thread generating on a
# NumPy-backed target never sends another thread's simulator work to the references (or the other way round).
_local = threading.local()

if process_name == "cuda":
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()
else:
    cp = None
    stream = None


def _simulator_yields_in_barrier_poll() -> bool:
    """numba's CUDA simulator runs a block as one Python thread per CUDA thread, and the launching thread releases
    each ``syncthreads`` barrier from a busy loop that calls ``is_alive()`` on every block thread, every pass -
    holding the GIL for whole switch intervals while the threads it waits for cannot run. Here ``is_alive`` first
    sleeps 0 s (yields the GIL). Scheduling only: every kernel computes the same. Measured on a 2-core machine, one
    process: a simulated tree build (L 5, K 5, budget 30) 3.6 -> 0.6 s, a top-K launch (3 rows x 4096) 2.7 -> 1.0 s.
    An optimisation, not a requirement: skipped (returns False) if numba's simulator has no ``BlockThread``."""
    from numba.cuda.simulator import kernel as sim_kernel

    block_thread = getattr(sim_kernel, "BlockThread", None)
    if block_thread is None or not issubclass(block_thread, threading.Thread):
        return False

    def is_alive(thread) -> bool:
        time.sleep(0)
        return threading.Thread.is_alive(thread)

    block_thread.is_alive = is_alive
    return True


def _simulator_shared_arrays_locked() -> bool:
    """numba's simulator gives the threads of a block one shared array per ``cuda.shared.array`` source line: the
    first thread to reach the line creates it, the others look it up - without a lock. Two threads that both miss
    (a thread switch between the lookup and the insert, e.g. under load) each keep an array of their own, and their
    writes never meet: a kernel then computes garbage now and then (seen once in CI: tutorial 5's simulated MLA
    attention off by 0.37, the same run passing everywhere else). Here the lookup and insert hold a lock, and the
    caller is read from its frame instead of ``traceback.extract_stack`` (which also read every frame's source
    line, per call). Same arrays, same results. Skipped (returns False) if the simulator has no such class."""
    from numba.cuda.simulator import kernelapi

    shared = getattr(kernelapi, "FakeCUDAShared", None)
    original = getattr(shared, "array", None)
    if original is None:
        return False
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if alignment is not None or shape == 0:            # refused / dynamic shared memory: no per-line array
            return original(self, shape, dtype, alignment)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            res = self._allocations.get(key)
            if res is None:
                dt = kernelapi.numpy_support.as_dtype(dtype) if isinstance(dtype, kernelapi.types.Type) else dtype
                res = self._allocations[key] = np.empty(shape, dt)
        return res

    shared.array = array
    return True


if process_name == "sim":
    _simulator_yields_in_barrier_poll()
    _simulator_shared_arrays_locked()


def _name() -> str:
    return getattr(_local, "name", process_name)


def _xp():
    return cp if _name() == "cuda" else np


def __getattr__(attr: str):
    if attr == "name":
        return _name()
    if attr == "xp":
        return _xp()
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")

from numba import cuda  # noqa: E402  (after NUMBA_ENABLE_CUDASIM is set)


def quiet_low_occupancy() -> bool:
    """Turn numba-cuda's low-occupancy warnings off unless ``NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS`` is set; return
    whether they are off. The shipped pair's kernels launch grids of a few blocks by design (a 9 M model, one
    token per step) and numba-cuda warns once per distinct small grid (``NumbaPerformanceWarning``: hundreds of
    lines in a run on a GPU, burying the output). Called on import for the cuda backend."""
    try:
        from numba.cuda.core import config as numba_cuda_config            # numba-cuda 0.30
    except ImportError:
        return False
    setting = os.environ.get("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "").strip()
    if setting == "":
        numba_cuda_config.CUDA_LOW_OCCUPANCY_WARNINGS = 0
    return not numba_cuda_config.CUDA_LOW_OCCUPANCY_WARNINGS


if process_name == "cuda":
    quiet_low_occupancy()


@contextlib.contextmanager
def use(backend: str):
    """Run a block on another backend: the process backend or ``numpy``. Per thread: other threads keep theirs
    (a new thread starts on the process backend).

    >>> with use("numpy"): ...   # references, NumPy arrays
    """
    if backend not in (process_name, "numpy"):
        raise ValueError(f"backend: {backend!r} cannot be used in a process started as {process_name!r} "
                         f"(expected {' or '.join(repr(b) for b in dict.fromkeys((process_name, 'numpy')))}; set "
                         f"KDTREE_BACKEND before starting Python)")
    bind_stream()
    old = getattr(_local, "name", None)
    _local.name = backend
    try:
        yield
    finally:
        if old is None:
            del _local.name
        else:
            _local.name = old


# ---------------------------------------------------------------------------------------------------- arrays
def bind_stream() -> None:
    """Make ``stream`` this thread's current CuPy stream (cuda; a no-op elsewhere). Called by every helper here.

    CuPy runs each array operation on the thread's *current* stream, the kernels run on ``stream``: the two must
    be one, or CuPy's work races the kernels (``stream`` is non-blocking, so nothing orders it against the legacy
    default stream) and falls outside a graph capture. Two things reset the current stream to the default one: a
    new thread starts there, and CuPy's own ``with stream:`` blocks (``ndarray.get`` of a non-contiguous array,
    e.g.) restore the default stream on exit whatever ``stream.use()`` had set - which once made every later
    replayed decode step of a process read half-written arrays (tests/test_backend_threads.py)."""
    if stream is not None and cp.cuda.get_current_stream().ptr != stream.ptr:
        stream.use()


def is_device(a) -> bool:
    return cp is not None and isinstance(a, cp.ndarray)


def same_start(a, b) -> bool:
    """Whether arrays ``a`` and ``b`` begin at the same address (both on the device, or both on the host): e.g. a
    caller passing an object's own buffer back to it. Example: same_start(x[:1], x) -> True; a copy -> False."""
    if is_device(a) or is_device(b):
        return is_device(a) and is_device(b) and a.data.ptr == b.data.ptr
    return np.asarray(a).__array_interface__["data"][0] == np.asarray(b).__array_interface__["data"][0]


_PLACEHOLDERS: dict = {}     # (backend, shape, dtype) -> a zero array kernels get for arguments they do not touch


def placeholder(shape, dtype=np.float32):
    """A cached zero array of ``shape`` on the current backend, for a kernel argument a launch never reads or writes
    (its type fixes the compiled overload; a fresh one per launch would be an allocation and a memset in the decode
    loop). Never write into it: every caller shares it. Example: placeholder((1, 1)) is placeholder((1, 1))."""
    key = (_name(), tuple(shape), np.dtype(dtype).str)
    if key not in _PLACEHOLDERS:
        _PLACEHOLDERS[key] = zeros(shape, dtype)
    return _PLACEHOLDERS[key]


def asarray(a, dtype=None):
    """``a`` as a C-contiguous array of the current backend (a copy only when needed)."""
    bind_stream()
    if _name() == "cuda":
        return cp.ascontiguousarray(cp.asarray(a, dtype=dtype))
    return np.ascontiguousarray(_device_to_host(a) if is_device(a) else a, dtype=dtype)


def upload(dst, host) -> None:
    """Copy the host array ``host`` into the backend array ``dst`` (same shape and dtype; ``dst`` C-contiguous). On
    cuda one host-to-device copy on ``stream``, queued behind its work (``host`` may be reused as soon as this
    returns) - where ``dst[...] = asarray(host)`` costs an allocation, a copy and a kernel, and ``dst[...] = v`` a
    kernel per array: a decode program writes its per-generation inputs with one upload. Example:
    upload(state, np.array([7, 1], np.int32)) for a device int32 [2] ``state``."""
    host = np.ascontiguousarray(host, dtype=dst.dtype)
    if host.shape != dst.shape:
        raise ValueError(f"upload: host shape {host.shape} does not match the destination's {dst.shape}")
    if is_device(dst):
        bind_stream()
        dst.set(host, stream=stream)
    else:
        dst[...] = host


def to_host(a) -> np.ndarray:
    """NumPy copy (device arrays) or the array itself (host arrays)."""
    return _device_to_host(a) if is_device(a) else np.asarray(a)


def _device_to_host(a) -> np.ndarray:
    """A device array's host copy, made on ``stream``; a non-contiguous one is made contiguous there first (CuPy's
    own path for it leaves the thread on the default stream: bind_stream)."""
    bind_stream()
    return cp.ascontiguousarray(a).get(stream=stream)


def empty(shape, dtype=np.float32):
    bind_stream()
    return _xp().empty(shape, dtype=dtype)


def zeros(shape, dtype=np.float32):
    bind_stream()
    return _xp().zeros(shape, dtype=dtype)


def full(shape, value, dtype=np.float32):
    bind_stream()
    return _xp().full(shape, value, dtype=dtype)


def synchronize() -> None:
    if _name() == "cuda":
        bind_stream()
        stream.synchronize()


# ---------------------------------------------------------------------------------------------------- launches
_VIEW_CACHE: "collections.OrderedDict[tuple, object]" = collections.OrderedDict()
_VIEW_CACHE_SIZE = 4096
_nb_streams: dict = {}                # CuPy stream pointer -> numba's external_stream over it


def view(a):
    """The numba view a kernel is launched with: a cached numba device array over a CuPy array (cuda), the
    NumPy array itself (sim). Views hold no reference to the CuPy array: a view is keyed by pointer, shape,
    strides and dtype, so a pointer the pool hands out again for the same layout maps to an identical view."""
    if not is_device(a):
        return a
    key = (a.data.ptr, a.shape, a.strides, a.dtype.str)
    v = _VIEW_CACHE.get(key)
    if v is None:
        v = cuda.from_cuda_array_interface(a.__cuda_array_interface__, owner=None, sync=False)
        _VIEW_CACHE[key] = v
        if len(_VIEW_CACHE) > _VIEW_CACHE_SIZE:
            _VIEW_CACHE.popitem(last=False)
    else:
        _VIEW_CACHE.move_to_end(key)
    return v


def launch(kernel, grid, block, *args, shared: int = 0) -> None:
    """Launch a numba.cuda kernel on the backend's stream; array arguments become numba views. ``shared``: bytes of
    dynamic shared memory (``cuda.shared.array(0, dtype)`` in the kernel). Above 48 KB (static included) a kernel
    must be opted in: the first launch of each compiled overload is refused, which opts it in and launches again
    (see _allow_shared). Typing the arguments before every launch instead repeated, in Python, what the dispatcher
    does anyway."""
    if _name() == "numpy":
        raise RuntimeError("launch: the numpy backend runs references, not kernels")
    args = tuple(view(a) if hasattr(a, "__cuda_array_interface__") else a for a in args)
    if _name() != "cuda":
        # the simulator refuses strided views (a GPU kernel takes them as they are): run on contiguous copies and
        # write back the copies the kernel changed (only those: two views of the same memory, e.g. ``out`` = ``x``
        # in place, are two copies, and the unchanged input must not overwrite the result)
        views = [a if isinstance(a, np.ndarray) and not a.flags["C_CONTIGUOUS"] else None for a in args]
        before = [np.array(v, order="C") if v is not None else None for v in views]
        args = tuple(b.copy() if b is not None else a for a, b in zip(args, before))
        kernel[grid, block, 0, shared](*args)
        for v, b, a in zip(views, before, args):
            if v is not None and not np.array_equal(b, a, equal_nan=True):
                v[...] = a
        return
    bind_stream()
    nb = _nb_streams.get(stream.ptr)
    if nb is None:
        nb = _nb_streams[stream.ptr] = cuda.external_stream(stream.ptr)
    configured = kernel[grid, block, nb, shared]
    if not shared:
        configured(*args)
        return
    try:
        configured(*args)
    except Exception:                  # the error type depends on numba-cuda's launch path (cuda.core or ctypes)
        if not _allow_shared(kernel, args, shared):
            raise
        configured(*args)


_shared_allowed: dict = {}            # (kernel, argument types) -> dynamic shared bytes allowed


def _allow_shared(kernel, args, nbytes: int) -> bool:
    """Let ``kernel`` (specialised for ``args``) launch with up to ``nbytes`` of dynamic shared memory: a kernel
    needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES once static + dynamic exceed 48 KB (Hopper allows
    227 KB), and numba-cuda 0.30 has no option for it, so it is set on the compiled function's handle (numba's own
    carveout setter does the same). False when it was allowed already (the refusal was something else); raises
    ValueError naming the size when the device refuses it."""
    from numba.cuda.cudadrv.driver import binding, driver
    sig = tuple(kernel.typeof_pyval(a) for a in args)
    key = (kernel, sig)
    if _shared_allowed.get(key, 0) >= nbytes:
        return False
    func = kernel.compile(sig)._codelibrary.get_cufunc()
    attr = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    try:
        driver.cuKernelSetAttribute(attr, int(nbytes), func.handle, func.device.id)
    except Exception as e:             # the driver's error type differs between cuda-python versions
        raise ValueError(f"shared: {nbytes} bytes of dynamic shared memory are refused by the device ({e})") from e
    _shared_allowed[key] = nbytes
    return True


SIM_SHARED_OPTIN = 232448           # the simulator's answer: an H200's (sm_90) 227 KB, so it takes the GPU's paths
_optin: dict = {}                    # device id -> bytes


def shared_optin() -> int:
    """Bytes of shared memory (static + dynamic) one block may opt into on this thread's device: 227 KB on sm_90
    (H100 / H200), 163 KB on sm_80 (A100), 99 KB on sm_86 / sm_89 (RTX 30xx / 40xx, A10, L4), 64 KB on sm_75. Kernels that
    stage operands in large dynamic shared memory ask this first and take a path that fits where it is smaller.
    Simulator: SIM_SHARED_OPTIN (it enforces no limit). Example: on an H200, shared_optin() == 232448."""
    if _name() != "cuda":
        return SIM_SHARED_OPTIN
    dev = cp.cuda.Device().id
    if dev not in _optin:               # numba's device reads CU_DEVICE_ATTRIBUTE_<name> from the driver
        _optin[dev] = int(cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)
    return _optin[dev]


SIM_SM_COUNT = 132                  # the simulator's answer: an H200's streaming multiprocessors
_sms: dict = {}                      # device id -> SMs


def sm_count() -> int:
    """Streaming multiprocessors of this thread's device (132 on an H200, 108 on an A100): launchers that size a
    grid to one wave ask it. Simulator: SIM_SM_COUNT. Example: on an H200, sm_count() == 132."""
    if _name() != "cuda":
        return SIM_SM_COUNT
    dev = cp.cuda.Device().id
    if dev not in _sms:
        _sms[dev] = int(cuda.get_current_device().MULTIPROCESSOR_COUNT)
    return _sms[dev]


def block_size(gpu: int, sim: int = 32) -> int:
    """Threads per block: ``gpu`` on a real GPU, a small count on the simulator (one OS thread per CUDA thread)."""
    return gpu if _name() == "cuda" else sim


# ---------------------------------------------------------------------------------------------------- branches
BRANCHES = True                      # cuda: a ``branch`` block runs on a side stream; False: in order on ``stream``
_side: list = []                     # the side stream (made at the first branch)


class Branch:
    """What ``branch()`` yields: ``join()`` makes the main stream wait for the branch's launches (cuda); a no-op on
    the host backends, where the block ran in order. Call it before anything reads what the branch wrote."""

    def __init__(self):
        self._done = None

    def join(self) -> None:
        if self._done is not None:
            stream.wait_event(self._done)
            self._done = None


@contextlib.contextmanager
def branch():
    """Run the block's device work beside what the main stream does next: on cuda the block's launches (numba
    kernels, CuPy and cuBLAS work) go to a side stream that first waits for everything issued so far, and the
    yielded ``Branch``'s ``join()`` makes the main stream wait for them. Under a CUDA graph capture the two waits
    become the graph's edges, so a replayed graph runs the branch's kernels concurrently with the main line's: a
    few small kernels that each fill a handful of SMs (the MoE's shared expert next to its routed experts) cost
    their latency once instead of one after the other. The host backends run the block in order (join: no-op);
    ``BRANCHES = False`` does the same on cuda (an A/B switch). Every branch must be joined before its results are
    read and before a capture ends (CUDA refuses to end a capture with unjoined work). Not for concurrent use by
    several host threads: the process has one main stream.

    >>> with backend.branch() as side:
    ...     write_cache(...)                 # the side stream
    >>> q = project(...)                     # the main stream, meanwhile
    >>> side.join()
    >>> attention(q, cache)                  # sees the cache rows
    """
    global stream
    b = Branch()
    if _name() != "cuda" or not BRANCHES:
        yield b
        return
    main = stream
    if not _side:
        _side.append(cp.cuda.Stream(non_blocking=True))
    side = _side[0]
    fork = cp.cuda.Event(disable_timing=True)
    fork.record(main)
    side.wait_event(fork)
    stream = side
    side.use()
    try:
        yield b
    finally:
        done = cp.cuda.Event(disable_timing=True)
        done.record(side)
        stream = main
        main.use()
        b._done = done


# ---------------------------------------------------------------------------------------------------- timing
class Timer:
    """Elapsed time of a block in milliseconds: CUDA events on the stream (cuda), a host clock otherwise.

    >>> with backend.timer() as t: work()
    >>> t.ms
    """

    def __init__(self):
        self.ms = float("nan")
        self._events = None
        self._t0 = 0.0

    def __enter__(self):
        if _name() == "cuda":
            self._events = (cp.cuda.Event(), cp.cuda.Event())
            self._events[0].record(stream)
        else:
            self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self._events is not None:
            self._events[1].record(stream)
            self._events[1].synchronize()
            self.ms = cp.cuda.get_elapsed_time(*self._events)
        else:
            self.ms = (time.perf_counter() - self._t0) * 1e3
        return False


def timer() -> Timer:
    return Timer()


def mark():
    """A point on the stream's timeline without a sync: a recorded CUDA event (cuda: another stream can wait on it,
    as the replayed DDTree loop's result reader does) or a host clock reading. Not a timer: stage times come from
    device clock stamps (kernels/stamp.py)."""
    if _name() == "cuda":
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(stream)
        return ev
    return time.perf_counter()
