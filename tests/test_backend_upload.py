"""backend.upload: a decode program's per-generation inputs in one host-to-device copy."""
import numpy as np
import pytest

import kdtree_numba as kd


def test_upload_writes_a_view_and_nothing_beside_it():
    """On whatever backend the process runs (on cuda: one copy on the backend stream, queued behind its work)."""
    be = kd.backend
    buf = be.full((6,), -1, np.int32)
    be.xp.add(buf, 1, out=buf)                       # work queued before the copy: the copy must land after it
    be.upload(buf[2:4], np.array([7, 8], np.int32))
    assert be.to_host(buf).tolist() == [0, 0, 7, 8, 0, 0]


def test_upload_converts_the_dtype_and_refuses_another_shape(numpy_backend):
    buf = kd.backend.zeros((2,), np.int32)
    kd.backend.upload(buf, [3, 4])                   # a list, converted to the destination's dtype
    assert buf.tolist() == [3, 4] and buf.dtype == np.int32
    with pytest.raises(ValueError, match=r"upload: host shape \(3,\) does not match the destination's \(2,\)"):
        kd.backend.upload(buf, np.zeros(3, np.int32))
    assert buf.tolist() == [3, 4]
