"""Device clock stamps (kernels/stamp.py): the row from an int or a device counter, later stamps never earlier,
bad arguments named."""
import time

import numpy as np
import pytest

import kdtree_numba as kd
from kdtree_numba.kernels.stamp import stamp

H = kd.backend.to_host


def test_stamps_land_in_their_row_and_column_in_order():
    stamps = kd.backend.zeros((3, 4), np.int64)
    counter = kd.backend.asarray(np.array([3], np.int32))               # a round counter: row = 3 - 1
    stamp(stamps, counter, 0, row_offset=-1)
    time.sleep(0.002)
    stamp(stamps, counter, 1, row_offset=-1)
    stamp(stamps, 0, 3)                                                  # an int row
    h = H(stamps)
    assert h[2, 0] != 0 and h[2, 1] != 0 and h[0, 3] != 0
    assert h[2, 1] - h[2, 0] >= 1_000_000                               # >= the 2 ms slept between them, in ns
    assert h[0, 3] >= h[2, 1]
    assert (h[1] == 0).all() and h[0, :3].tolist() == [0, 0, 0] and h[2, 2:].tolist() == [0, 0]


@pytest.mark.parametrize("kw, msg", [
    (dict(stamps=np.zeros((2, 3), np.float64), row=0, col=0), "stamps: expected dtype int64"),
    (dict(stamps=np.zeros((2, 3), np.int64), row=2, col=0), "row: expected a stamp row in [0, 2), got 2"),
    (dict(stamps=np.zeros((2, 3), np.int64), row=0, col=3), "col: expected an integer <= 2, got 3"),
    (dict(stamps=np.zeros((2, 3), np.int64), row=-1, col=0), "row: expected an integer >= 0, got -1"),
])
def test_bad_arguments_are_named(kw, msg):
    kw["stamps"] = kd.backend.asarray(kw["stamps"])
    with pytest.raises(ValueError, match=msg.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        stamp(**kw)
