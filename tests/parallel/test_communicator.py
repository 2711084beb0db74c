"""The fake communicator against plain NumPy, its failure behaviour, and the NCCL id file (NCCL itself: gpu tests in
test_launcher.py)."""
import json
import sys
import threading
import types

import numpy as np
import pytest

from kdtree_numba.parallel import communicator as cm


@pytest.mark.parametrize("world", [1, 2, 3])
def test_collectives_equal_numpy(world, numpy_backend):
    rng = np.random.default_rng(world)
    xs = [rng.standard_normal((5, 3)).astype(np.float32) for _ in range(world)]
    rows = rng.integers(0, 4, size=(world, world))                      # rows[s, d]: s sends rows[s, d] rows to d
    chunks = [[np.full((rows[s, d], 2), 100 * s + d, np.int32) for d in range(world)] for s in range(world)]

    def rank(c):
        return c.all_reduce(xs[c.rank]), c.all_gather(xs[c.rank]), c.all_to_all_v(chunks[c.rank])

    outs = cm.run_ranks(world, rank)
    total = xs[0].copy()
    for x in xs[1:]:
        total += x
    for r, (red, gat, a2a) in enumerate(outs):
        np.testing.assert_array_equal(red, total)                       # same bits on every rank
        np.testing.assert_array_equal(gat, np.concatenate(xs))
        assert len(a2a) == world
        for s in range(world):
            np.testing.assert_array_equal(a2a[s], chunks[s][r])
    outs[0][0][...] = -1.0                                              # results are fresh arrays: no aliasing
    assert world == 1 or not np.any(outs[-1][0] == -1.0)


def test_mismatched_shapes_and_chunk_counts_are_named(numpy_backend):
    with pytest.raises(ValueError, match="all_reduce: rank 1 sent"):
        cm.run_ranks(2, lambda c: c.all_reduce(np.zeros(2 + c.rank, np.float32)))
    with pytest.raises(ValueError, match="chunks: expected one array per rank"):
        cm.run_ranks(2, lambda c: c.all_to_all_v([np.zeros(1)]))


def test_a_failing_rank_does_not_hang_the_others(numpy_backend):
    def rank(c):
        if c.rank == 1:
            raise RuntimeError("rank 1 broke")
        c.barrier()
        return c.all_reduce(np.ones(1))

    with pytest.raises(RuntimeError, match="rank 1 broke"):
        cm.run_ranks(3, rank)
    assert threading.active_count() < 10


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2", None])
def test_bad_world_sizes(bad):
    with pytest.raises(ValueError, match="world"):
        cm.FakeGroup(bad)
    with pytest.raises(ValueError, match="world"):
        cm.run_ranks(bad, lambda c: None)


def test_bad_rank():
    with pytest.raises(ValueError, match=r"rank: expected a rank in \[0, 2\)"):
        cm.FakeCommunicator(cm.FakeGroup(2), 2)


@pytest.mark.parametrize("uid", [bytes(range(128)), tuple(range(-64, 64))])
def test_nccl_id_file_round_trip(uid, tmp_path, monkeypatch):
    """CuPy >= 14 hands out the id as bytes, older CuPy as a tuple of ints: the file gives back the same kind."""
    nccl = types.SimpleNamespace(get_unique_id=lambda: uid)
    cuda = types.ModuleType("cupy.cuda")
    cuda.nccl = nccl
    cupy = types.ModuleType("cupy")
    cupy.cuda = cuda
    monkeypatch.setitem(sys.modules, "cupy", cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", cuda)
    path = str(tmp_path / "id.json")
    cm.write_unique_id(path)
    assert cm.read_unique_id(path) == uid and type(cm.read_unique_id(path)) is type(uid)
    assert json.load(open(path))["kind"] == ("bytes" if isinstance(uid, bytes) else "tuple")


def test_nccl_id_file_missing_times_out(tmp_path):
    with pytest.raises(TimeoutError, match="no NCCL unique id"):
        cm.read_unique_id(str(tmp_path / "none.json"), timeout=0.1)


def test_nccl_from_env_names_the_missing_variable(monkeypatch):
    for v in (cm.ENV_ID_FILE, cm.ENV_RANK, cm.ENV_WORLD):
        monkeypatch.delenv(v, raising=False)
    with pytest.raises(ValueError, match=cm.ENV_ID_FILE):
        cm.NcclCommunicator.from_env()
