"""A generation's RoundTraces are built when first read (decode/trace.py ``Rounds``), from host copies of the device
records taken when the generation ended (decode/ddtree.py ``_records``): a later generation through the same kept
program does not change them."""
import pickle

import pytest

import kdtree_numba as kd
from kdtree_numba.decode import ddtree
from kdtree_numba.decode.trace import Rounds
from kdtree_numba.model import dflash

from .test_ddtree_replay import _same_rounds


def test_rounds_build_once_on_first_read_and_read_like_a_list():
    calls = []

    def make():
        calls.append(1)
        return ["a", "b", "c"]

    r = Rounds(3, make)
    assert len(r) == 3 and not calls and "not yet built" in repr(r)
    assert r[-1] == "c" and r[1:] == ["b", "c"] and list(r) == ["a", "b", "c"] and calls == [1]
    assert r == ["a", "b", "c"] and ["a", "b", "c"] == r and r != ["a"] and calls == [1]
    assert repr(r) == "Rounds(['a', 'b', 'c'])"
    assert pickle.loads(pickle.dumps(Rounds(1, lambda: ["x"]))) == ["x"]         # a maker need not pickle


def test_a_maker_that_breaks_its_count_is_an_error():
    with pytest.raises(RuntimeError, match="built 1 rounds, expected 2"):
        Rounds(2, lambda: ["a"])[0]


@pytest.mark.parametrize("replay", [False, True])
def test_traces_are_built_on_first_read_from_the_records_at_the_end(monkeypatch, numpy_backend, replay):
    target = kd.tiny_target(0)
    drafter = dflash.random_drafter(target, block_size=4)
    built = []
    make = ddtree._round_traces
    monkeypatch.setattr(ddtree, "_round_traces", lambda h, rounds: built.append(1) or make(h, rounds))
    kw = dict(drafter=drafter, budget=4, replay=replay)
    first = kd.generate(target, [3, 17, 99, 5], 12, **kw)
    kd.generate(target, [8, 1, 2], 15, **kw)                       # the same kept program (replay), other records
    assert not built and len(first.rounds) == first.target_forwards - 1
    assert first.rounds[0].start == 4 and built == [1]                 # built now, once
    _same_rounds(kd.generate(target, [3, 17, 99, 5], 12, drafter=drafter, budget=4), first)
