"""The backend is per thread (#16 item 9): a thread on the NumPy references and a thread on the process backend's
kernels run at the same time without sending each other's work to the wrong backend."""
import threading

import numpy as np
import pytest

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
