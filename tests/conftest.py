"""Test-suite backend: the process backend is chosen before kdtree_numba is imported.

Without KDTREE_BACKEND set, kernels run on numba's CUDA simulator on machines without a GPU and on the GPU where
one is visible. Tests that want the NumPy references at larger shapes use ``kd.backend.use("numpy")`` (the
``numpy_backend`` fixture). ``@pytest.mark.gpu`` tests run only on a real GPU.
"""
import os

# One BLAS thread per test process: pytest -n auto already runs a process per core, and OpenBLAS threads on top
# of that made a DDTree generation of the trained pair up to 20x slower on the 2-core CI machine.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import pytest  # noqa: E402


def _gpu_visible() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


os.environ.setdefault("KDTREE_BACKEND", "cuda" if _gpu_visible() else "sim")

import kdtree_numba as kd  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if kd.backend.process_name == "cuda":
        return
    skip = pytest.mark.skip(reason="needs a real GPU (KDTREE_BACKEND=cuda)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def numpy_backend():
    with kd.backend.use("numpy"):
        yield


@pytest.fixture
def kernel_backend():
    """Skip unless kernels really run (sim or cuda)."""
    if kd.backend.process_name == "numpy":
        pytest.skip("kernels need KDTREE_BACKEND=sim or cuda")
    yield


@pytest.fixture(autouse=True)
def _backend_not_pinned():
    """``kd.backend.name`` / ``.xp`` are computed per thread (the module's ``__getattr__``); a test that sets one
    (``monkeypatch.setattr(kd.backend, "name", ..)``, whose undo *sets* the old value back) pins it for every later
    test in the process - the eighteenth session lost a GPU test run to that. Unpinned here, and the test fails."""
    yield
    pinned = [a for a in ("name", "xp") if a in vars(kd.backend)]
    for a in pinned:
        delattr(kd.backend, a)
    if pinned:
        pytest.fail(f"the test left kd.backend.{pinned[0]} set as a module attribute (it shadows the per-thread "
                    f"backend); use kd.backend.use(...) instead")
