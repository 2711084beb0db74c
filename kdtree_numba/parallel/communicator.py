"""Communicators: the few collectives expert parallelism needs, for N ranks in one process (CI) or one per GPU.

    comm.rank, comm.world_size
    comm.all_reduce(x)        -> sum over ranks of x, same shape, on every rank (rank order: deterministic)
    comm.all_gather(x)        -> [world * x.shape[0], ...]: every rank's x stacked in rank order, on every rank
    comm.all_to_all_v(chunks) -> received: chunks[d] (any number of rows) goes to rank d; received[s] came from s
    comm.barrier()

Two implementations:
- ``FakeCommunicator``: N ranks in ONE process, each rank a thread running its own code path (its own sharded
  weights, its own calls), meeting in a shared ``FakeGroup``: a rank posts its buffer, waits for the others at a
  barrier, reads every rank's buffer, waits again (so no buffer is overwritten before all have read it). Arrays
  of the current backend (NumPy on numpy/sim; CuPy works too). ``run_ranks(world, fn)`` starts the threads and
  returns every rank's result; an exception on one rank breaks the barrier, so the others fail instead of
  hanging. The ranks take turns: a rank runs only while it holds the group's ``turn`` lock and gives it up only
  inside a collective, so one rank computes at a time. That is needed, not a simplification: numba's CUDA
  simulator cannot run kernels from two threads at once (a second thread's launch is taken for a device-function
  call). The backend is per thread (``backend.use``), so ``run_ranks`` runs every rank on the caller's backend.
- ``NcclCommunicator``: one process per GPU, on CuPy's ``cupy.cuda.nccl`` bindings (``NcclCommunicator(ndev,
  commId, rank)``, ``allReduce``, ``allGather``, ``send`` / ``recv`` between ``groupStart`` / ``groupEnd``).
  Why CuPy's NCCL and not nccl4py: CuPy is already the cuda backend's array library, its wheels ship the NCCL
  bindings, so this needs no extra dependency and takes CuPy arrays and streams as they are. cupy is imported
  lazily: this module imports on machines without a GPU.
  The NCCL unique id: rank 0 calls ``nccl.get_unique_id()`` and writes it to a JSON file (``write_unique_id``,
  atomic: temp file + rename); every rank reads it (``read_unique_id`` waits for the file). The launcher
  (``python -m kdtree_numba.parallel``) passes the file in ``KDTREE_NCCL_ID_FILE`` with ``KDTREE_RANK`` and
  ``KDTREE_WORLD``; ``NcclCommunicator.from_env()`` reads them. (CuPy >= 14 returns the id as ``bytes``, older
  versions as a tuple of ints: the file records which.) Not run yet: see docs/SCALE_UP.md.
Example (fake): run_ranks(2, lambda c: c.all_reduce(np.full(3, c.rank + 1.0))) -> [[3, 3, 3], [3, 3, 3]]
"""
from __future__ import annotations

import json
import os
import threading
import time

import numpy as np

from .. import backend
from ..atomic_file import write_text_atomic


class Communicator:
    """Interface: ``rank``, ``world_size`` and the collectives of the module docstring."""
    rank: int
    world_size: int

    def all_reduce(self, x):
        raise NotImplementedError

    def all_gather(self, x):
        raise NotImplementedError

    def all_to_all_v(self, chunks):
        raise NotImplementedError

    def barrier(self) -> None:
        raise NotImplementedError


def check_world(world, arg: str = "world") -> int:
    """``world`` as an int >= 1, or ValueError naming ``arg``."""
    if isinstance(world, bool) or not isinstance(world, (int, np.integer)) or world < 1:
        raise ValueError(f"{arg}: expected a whole number of ranks >= 1, got {world!r}")
    return int(world)


def check_rank(rank, world: int) -> int:
    if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < world:
        raise ValueError(f"rank: expected a rank in [0, {world}), got {rank!r}")
    return int(rank)


def _xp(a):
    return backend.cp if backend.is_device(a) else np


# ------------------------------------------------------------------------------------------------ fake (one process)
class FakeGroup:
    """The meeting point of N fake ranks: one buffer slot per rank and a reusable barrier."""

    def __init__(self, world: int, timeout: float = 120.0):
        self.world = check_world(world)
        self.slots = [None] * self.world
        self.barrier = threading.Barrier(self.world, timeout=timeout)
        self.turn = threading.Lock()              # held by the one rank computing now (run_ranks)

    def exchange(self, rank: int, value) -> list:
        """Post ``value``, return every rank's posted value (rank order) once all have posted. A rank holding the
        turn gives it up while it waits and takes it back before it returns."""
        self.slots[rank] = value
        held = getattr(threading.current_thread(), "kd_holds_turn", False)
        if held:
            self._release()
        try:
            self.barrier.wait()
            everyone = list(self.slots)
            self.barrier.wait()                   # nobody posts the next value before everyone has read this one
        finally:
            if held:
                self._acquire()
        return everyone

    def _acquire(self):
        self.turn.acquire()
        threading.current_thread().kd_holds_turn = True

    def _release(self):
        threading.current_thread().kd_holds_turn = False
        self.turn.release()

    def communicators(self) -> list["FakeCommunicator"]:
        return [FakeCommunicator(self, r) for r in range(self.world)]


class FakeCommunicator(Communicator):
    """One rank of a ``FakeGroup`` (module docstring). Results are fresh arrays: no rank aliases another's."""

    def __init__(self, group: FakeGroup, rank: int):
        self.group = group
        self.world_size = group.world
        self.rank = check_rank(rank, group.world)

    def _same_shapes(self, everyone, what: str):
        first = everyone[0]
        for r, a in enumerate(everyone):
            if tuple(a.shape) != tuple(first.shape) or a.dtype != first.dtype:
                raise ValueError(f"{what}: rank {r} sent {tuple(a.shape)} {a.dtype}, rank 0 sent "
                                 f"{tuple(first.shape)} {first.dtype} (every rank must send the same shape)")

    def all_reduce(self, x):
        everyone = self.group.exchange(self.rank, x)
        self._same_shapes(everyone, "all_reduce")
        out = everyone[0].copy()
        for a in everyone[1:]:                    # rank order: every rank gets the same bits
            out += a
        return out

    def all_gather(self, x):
        everyone = self.group.exchange(self.rank, x)
        self._same_shapes(everyone, "all_gather")
        return _xp(x).concatenate(everyone, axis=0)

    def all_to_all_v(self, chunks):
        chunks = list(chunks)
        if len(chunks) != self.world_size:
            raise ValueError(f"chunks: expected one array per rank ({self.world_size}), got {len(chunks)}")
        everyone = self.group.exchange(self.rank, chunks)
        return [everyone[s][self.rank].copy() for s in range(self.world_size)]

    def barrier(self) -> None:
        self.group.exchange(self.rank, None)


def run_ranks(world: int, fn, timeout: float = 120.0) -> list:
    """Run ``fn(comm)`` for every rank of a fresh FakeGroup, each in its own thread; return the results in rank
    order. An exception on any rank aborts the group (the others leave their barrier) and is re-raised here."""
    group = FakeGroup(world, timeout)
    results, errors = [None] * group.world, [None] * group.world

    current = backend.name                      # the caller's backend, for every rank thread (it is per thread)

    def body(comm):
        group._acquire()
        try:
            with backend.use(current):
                results[comm.rank] = fn(comm)
        except BaseException as e:                # noqa: B036 - re-raised in the caller's thread
            errors[comm.rank] = e
            group.barrier.abort()
        finally:
            group._release()

    if group.world == 1:
        body(group.communicators()[0])
    else:
        threads = [threading.Thread(target=body, args=(c,), name=f"rank{c.rank}") for c in group.communicators()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    first = next((e for e in errors if e is not None and not isinstance(e, threading.BrokenBarrierError)),
                 next((e for e in errors if e is not None), None))
    if first is not None:
        raise first
    return results


# ------------------------------------------------------------------------------------------------ NCCL (one per GPU)
ENV_ID_FILE, ENV_RANK, ENV_WORLD = "KDTREE_NCCL_ID_FILE", "KDTREE_RANK", "KDTREE_WORLD"


def write_unique_id(path: str) -> None:
    """Rank 0: a fresh NCCL unique id into ``path`` (JSON, written atomically)."""
    from cupy.cuda import nccl

    uid = nccl.get_unique_id()
    kind = "bytes" if isinstance(uid, (bytes, bytearray)) else "tuple"
    write_text_atomic(path, json.dumps({"kind": kind, "id": list(bytes(uid)) if kind == "bytes" else
                                        [int(v) for v in uid]}))            # a reader polling for it sees it whole


def read_unique_id(path: str, timeout: float = 120.0):
    """The id ``write_unique_id`` wrote (waits up to ``timeout`` s for the file), as CuPy expects it."""
    t0 = time.monotonic()
    while not os.path.exists(path):
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{path}: no NCCL unique id after {timeout:g} s (did rank 0 start?)")
        time.sleep(0.05)
    with open(path) as f:
        d = json.load(f)
    return bytes(d["id"]) if d["kind"] == "bytes" else tuple(d["id"])


class NcclCommunicator(Communicator):
    """One rank per process and GPU on ``cupy.cuda.nccl`` (module docstring). Collectives run on the backend's
    stream; inputs are CuPy arrays of the cuda backend (float32, int32, int64 or float64)."""

    def __init__(self, rank: int, world: int, unique_id):
        from cupy.cuda import nccl

        self.world_size = check_world(world)
        self.rank = check_rank(rank, self.world_size)
        self._nccl = nccl
        self.comm = nccl.NcclCommunicator(self.world_size, unique_id, self.rank)   # blocks until all ranks join
        self._types = {np.dtype(np.float32): nccl.NCCL_FLOAT32, np.dtype(np.float64): nccl.NCCL_FLOAT64,
                       np.dtype(np.int32): nccl.NCCL_INT32, np.dtype(np.int64): nccl.NCCL_INT64}

    @classmethod
    def from_env(cls, timeout: float = 120.0) -> "NcclCommunicator":
        """Rank, world and id file from KDTREE_RANK, KDTREE_WORLD, KDTREE_NCCL_ID_FILE; rank 0 writes the id."""
        missing = [v for v in (ENV_ID_FILE, ENV_RANK, ENV_WORLD) if v not in os.environ]
        if missing:
            raise ValueError(f"{missing[0]}: not set (the launcher sets {ENV_ID_FILE}, {ENV_RANK}, {ENV_WORLD})")
        rank, world, path = int(os.environ[ENV_RANK]), int(os.environ[ENV_WORLD]), os.environ[ENV_ID_FILE]
        if rank == 0:
            write_unique_id(path)
        return cls(rank, world, read_unique_id(path, timeout))

    def _args(self, x):
        cp = backend.cp
        x = cp.ascontiguousarray(x)
        if np.dtype(x.dtype) not in self._types:
            raise ValueError(f"x: dtype {x.dtype} has no NCCL type here (float32, float64, int32, int64)")
        return x, self._types[np.dtype(x.dtype)], backend.stream.ptr

    def all_reduce(self, x):
        x, dt, stream = self._args(x)
        out = backend.cp.empty_like(x)
        self.comm.allReduce(x.data.ptr, out.data.ptr, x.size, dt, self._nccl.NCCL_SUM, stream)
        return out

    def all_gather(self, x):
        x, dt, stream = self._args(x)
        out = backend.cp.empty((self.world_size,) + tuple(x.shape), x.dtype)
        self.comm.allGather(x.data.ptr, out.data.ptr, x.size, dt, stream)      # count: elements per rank
        return out.reshape((self.world_size * x.shape[0],) + tuple(x.shape[1:]))

    def all_to_all_v(self, chunks):
        """Row counts first (an all_gather of this rank's counts per destination, read on the host: the receive
        buffers need their sizes), then one grouped send/recv per peer; the chunk to itself is a local copy.
        Every chunk has the same trailing shape and dtype on every rank."""
        cp = backend.cp
        chunks = [cp.ascontiguousarray(c) for c in chunks]
        if len(chunks) != self.world_size:
            raise ValueError(f"chunks: expected one array per rank ({self.world_size}), got {len(chunks)}")
        rows = cp.asarray(np.array([c.shape[0] for c in chunks], np.int64))
        table = backend.to_host(self.all_gather(rows)).reshape(self.world_size, self.world_size)   # [src, dst]
        tail, dtype = tuple(chunks[0].shape[1:]), chunks[0].dtype
        received = [cp.empty((int(table[s, self.rank]),) + tail, dtype) for s in range(self.world_size)]
        _, dt, stream = self._args(chunks[0])
        nccl = self._nccl
        nccl.groupStart()
        for peer in range(self.world_size):
            if peer == self.rank:
                continue
            if chunks[peer].size:
                self.comm.send(chunks[peer].data.ptr, chunks[peer].size, dt, peer, stream)
            if received[peer].size:
                self.comm.recv(received[peer].data.ptr, received[peer].size, dt, peer, stream)
        nccl.groupEnd()
        received[self.rank][...] = chunks[self.rank]
        return received

    def barrier(self) -> None:
        self.all_reduce(backend.cp.zeros(1, np.float32))
        backend.synchronize()

    def close(self) -> None:
        self.comm.destroy()
