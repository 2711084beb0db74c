"""The backend is per thread (#16 item 9): a thread on the NumPy references and a thread on the process backend's
kernels run at the same time without sending each other's work to the wrong backend."""
import threading
import time

import numpy as np
import pytest
from numba import cuda, float32

import kdtree_numba as kd
from kdtree_numba import backend


def test_use_switches_only_the_calling_thread():
    seen = {}
    inside, release = threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["other"] = kd.backend.name                  # while the main thread is inside use("numpy")
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with kd.backend.use("numpy"):
        inside.set()
        release.wait(10)
        seen["main"] = kd.backend.name
    t.join()
    assert seen == {"main": "numpy", "other": kd.backend.process_name}
    assert kd.backend.name == kd.backend.process_name


def test_two_threads_generate_on_two_backends(kernel_backend):
    """One thread generates with a NumPy-backed target while another runs the process backend's kernels (the
    simulator here): both give what they give alone."""
    with kd.backend.use("numpy"):
        big = kd.tiny_target(0)
    want_big = kd.generate(big, [3, 17, 99, 5], 24).tokens
    small = kd.tiny_target(1, num_hidden_layers=1)
    want_small = kd.generate(small, [4, 2], 2).tokens
    got, errors = {}, []

    def run(key, target, prompt, n):
        try:
            for _ in range(3 if key == "numpy" else 1):
                got[key] = kd.generate(target, prompt, n).tokens
                assert backend.name == kd.backend.process_name  # generate's use() did not leak into this thread
        except Exception as e:                               # re-raised below
            errors.append(e)

    threads = [threading.Thread(target=run, args=("numpy", big, [3, 17, 99, 5], 24)),
               threading.Thread(target=run, args=("kernels", small, [4, 2], 2))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert got == {"numpy": want_big, "kernels": want_small}


def test_xp_follows_the_thread_backend():
    with kd.backend.use("numpy"):
        assert kd.backend.xp is np
        assert isinstance(kd.backend.zeros((2,)), np.ndarray)
    with pytest.raises(AttributeError):
        kd.backend.no_such_attribute


@pytest.mark.gpu
def test_cupy_work_stays_on_the_backend_stream():
    """CuPy runs array work on the thread's current stream, the kernels on ``backend.stream``. CuPy's own copy of a
    non-contiguous array to the host leaves the thread on the default stream, and a new thread starts there; every
    backend helper binds the stream again. (Before: one such read - a tree build of several requests reading its
    per-level counts - made every later replayed decode step of the process race its own state updates.)"""
    cp = backend.cp

    def current():
        return cp.cuda.get_current_stream().ptr

    a = backend.zeros((3, 5), np.int32)[:, 1:4]                 # not contiguous
    assert backend.to_host(a).shape == (3, 3) and current() == backend.stream.ptr
    cp.asnumpy(a, stream=backend.stream)                          # CuPy's path: back on the default stream
    assert current() != backend.stream.ptr
    backend.empty((2,))
    assert current() == backend.stream.ptr
    seen = {}

    def other():
        seen["fresh"] = current()
        backend.zeros((2,))
        seen["bound"] = current()

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == {"fresh": cp.cuda.Stream.null.ptr, "bound": backend.stream.ptr}


@pytest.mark.gpu
def test_replay_after_a_multi_request_tree_build():
    """The sequence that exposed it: a tree build of several requests (its counts read back as a strided view),
    then a graph-replayed generation - same tokens as direct launches."""
    from kdtree_numba.kernels import tree_build

    rng = np.random.default_rng(0)
    lp = -np.sort(rng.random((3, 2, 4), dtype=np.float32), axis=-1) - 0.1       # [R, L, K] rows sorted desc
    builder = tree_build.TreeBuilder(3, 2, 4, 4)
    builder.build(backend.asarray(lp), backend.asarray(np.tile(np.arange(4, dtype=np.int32), (3, 2, 1))))
    backend.to_host(builder.candidates)
    target = kd.tiny_target(0)
    want = kd.generate(target, [3, 17, 99, 5], 24).tokens
    assert kd.generate(target, [3, 17, 99, 5], 24, replay=True).tokens == want


@cuda.jit
def _reverse_through_shared(a, out):
    buf = cuda.shared.array(32, float32)
    t = cuda.threadIdx.x
    buf[t] = a[t]
    cuda.syncthreads()                  # the barrier whose poll yields
    out[t] = buf[31 - t]


def test_simulator_barrier_poll_yields_the_gil():
    """A sim process patches numba's BlockThread.is_alive (backend._simulator_yields_in_barrier_poll): 2.5-6x faster
    simulated kernels with barriers; a kernel with a barrier still computes the same."""
    if kd.backend.process_name != "sim":
        pytest.skip("simulator processes only")
    from numba.cuda.simulator import kernel as sim_kernel

    assert sim_kernel.BlockThread.is_alive is not threading.Thread.is_alive
    a = np.arange(32, dtype=np.float32)
    out = np.zeros_like(a)
    _reverse_through_shared[1, 32](a, out)
    np.testing.assert_array_equal(out, a[::-1])


def test_simulator_shared_arrays_are_one_per_line_under_thread_switches(monkeypatch):
    """The simulator's threads of a block share one array per cuda.shared.array line; numba's lookup had no lock,
    so a thread switch between its lookup and its insert gave threads private arrays (a rare CI failure).
    Forced here: np.empty sleeps (every thread switches right there). Unlocked, each of the 32 threads reads its
    own buffer and the reversal comes out wrong; backend._simulator_shared_arrays_locked keeps it exact."""
    if kd.backend.process_name != "sim":
        pytest.skip("simulator processes only")
    empty = np.empty

    def slow_empty(*args, **kwargs):
        time.sleep(0.002)
        return empty(*args, **kwargs)

    a = np.arange(32, dtype=np.float32)
    out = np.zeros_like(a)
    monkeypatch.setattr(np, "empty", slow_empty)
    _reverse_through_shared[1, 32](a, out)
    monkeypatch.undo()
    np.testing.assert_array_equal(out, a[::-1])


def test_low_occupancy_warnings_are_off_unless_the_user_set_them(monkeypatch):
    """numba-cuda warns once per distinct small grid (hundreds of lines a run with a 9 M model on a GPU); the cuda
    backend turns that off on import, but NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS, when set, is the user's choice."""
    from numba.cuda.core import config

    monkeypatch.setattr(config, "CUDA_LOW_OCCUPANCY_WARNINGS", 1)
    monkeypatch.delenv("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", raising=False)
    assert backend.quiet_low_occupancy() and config.CUDA_LOW_OCCUPANCY_WARNINGS == 0
    monkeypatch.setattr(config, "CUDA_LOW_OCCUPANCY_WARNINGS", 1)
    monkeypatch.setenv("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "1")
    assert not backend.quiet_low_occupancy() and config.CUDA_LOW_OCCUPANCY_WARNINGS == 1


@pytest.mark.gpu
def test_a_one_block_launch_does_not_warn_on_the_gpu(recwarn):
    @cuda.jit
    def one(out):
        out[0] = float32(1.0)

    out = kd.backend.zeros((1,), np.float32)
    backend.launch(one, 1, 1, out)
    assert kd.backend.to_host(out)[0] == 1.0
    assert not [w for w in recwarn if "occupancy" in str(w.message)], [str(w.message) for w in recwarn]


def test_placeholders_are_cached_per_backend_shape_and_dtype():
    """backend.placeholder: one zero array per (backend, shape, dtype), so a launch's unused arguments cost no
    allocation in the decode loop; a different shape or dtype is a different array."""
    a = kd.backend.placeholder((1, 1))
    assert a is kd.backend.placeholder((1, 1)) and a.shape == (1, 1) and a.dtype == np.float32
    assert kd.backend.placeholder((1, 1), np.int32) is not a and kd.backend.placeholder((1,)) is not a
    assert not kd.backend.to_host(a).any()
    with kd.backend.use("numpy"):
        assert isinstance(kd.backend.placeholder((1, 1)), np.ndarray)


@cuda.jit
def _spin_then_write(a, out, spins):
    """out = 2 a after a busy wait (so that a missing join shows: the reader runs before the write lands)."""
    t = cuda.grid(1)
    if t < a.shape[0]:
        v = a[t]
        for _ in range(spins):
            v = v * float32(1.0000001)
        out[t] = a[t] * float32(2.0) + (v - v)          # v - v: 0, but the loop stays (IEEE: no folding)


def test_branch_runs_in_order_on_the_host_backends():
    """backend.branch on numpy / sim: the block runs where it stands, join is a no-op (and may be called twice)."""
    with kd.backend.use("numpy"):
        x = kd.backend.zeros((3,))
        with backend.branch() as side:
            x[...] = 1.0
        assert x.tolist() == [1.0, 1.0, 1.0]
        side.join()
        side.join()


@pytest.mark.gpu
@pytest.mark.parametrize("branches", [True, False])
def test_branch_on_the_gpu_direct_and_captured(monkeypatch, branches):
    """A kernel in a branch (a side stream on cuda) and CuPy work on the main stream meanwhile; after join the main
    stream sees the branch's result - launched directly and replayed from a captured graph (the graph's fork and
    join edges). BRANCHES = False runs the same in order."""
    from kdtree_numba.decode.capture import CapturedStep

    monkeypatch.setattr(backend, "BRANCHES", branches)
    n = 4096
    a = backend.asarray(np.arange(n, dtype=np.float32))
    doubled, plus, total = backend.empty((n,)), backend.empty((n,)), backend.empty((n,))

    main = backend.stream

    def step():
        with backend.branch() as side:
            backend.launch(_spin_then_write, -(-n // 128), 128, a, doubled, 20000)
        assert backend.stream is main and backend.cp.cuda.get_current_stream().ptr == main.ptr
        backend.xp.add(a, 1.0, out=plus)                        # main stream, beside the branch
        side.join()
        backend.xp.add(doubled, plus, out=total)                # reads the branch's output

    step()
    np.testing.assert_array_equal(backend.to_host(total), 3 * np.arange(n) + 1)
    graph = CapturedStep(step, "a branched step")
    a[...] = 5.0
    total[...] = 0.0
    graph.replay()
    np.testing.assert_array_equal(backend.to_host(total), np.full(n, 16.0))


@pytest.mark.gpu
def test_branched_forward_equals_the_in_order_one(monkeypatch):
    """The target's branches (the latent rows beside the query projections, the rope columns beside the absorbed
    ones, the shared expert beside the routed ones) change no value: a prefill and a decode step give the same
    logits with BRANCHES on and off."""
    target = kd.tiny_target(0)
    outs = []
    for on in (True, False):
        monkeypatch.setattr(backend, "BRANCHES", on)
        cache = target.new_cache(16)
        a, _ = target.forward(np.array([3, 17, 99, 5], np.int32), cache, 0)
        b, _ = target.forward(np.array([7], np.int32), cache, 4)
        outs.append((backend.to_host(a), backend.to_host(b)))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])
