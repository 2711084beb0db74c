"""#16 item 7 (traces): a corrupted trace file (``generate --trace``) is refused with a ValueError naming the file,
the round and field, the value and what was expected; before, out-of-range parents or accepted indices loaded and
failed later (or drew a wrong tree)."""
import json

import pytest

import kdtree_numba as kd
from kdtree_numba.decode.trace import TraceError

from .helpers import tiny

pytestmark = pytest.mark.usefixtures("numpy_backend")


@pytest.fixture(scope="module")
def trace():
    with kd.backend.use("numpy"):
        t = tiny(1)
        res = kd.generate(t, [5, 9, 2], 12, drafter=kd.OracleDrafter(t, noise=0.5, seed=0), budget=8)
    d = json.loads(res.to_json())
    r = d["rounds"][0]
    assert len(r["tokens"]) >= 3 and len(d["rounds"]) >= 2
    return d


def test_a_valid_trace_round_trips(trace, tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace))
    gen = kd.Generation.from_json(str(p))
    assert json.loads(gen.to_json()) == trace


def _round(d, **change):
    r = d["rounds"][1]
    r.update(change)
    return d


@pytest.mark.parametrize("corrupt, needles", [
    (lambda d: d["rounds"][1]["parents"].__setitem__(2, 99), ["rounds[1].parents[2]", "got 99", "[0, 2)"]),
    (lambda d: d["rounds"][1]["parents"].__setitem__(1, 1), ["rounds[1].parents[1]", "got 1", "pop order"]),
    (lambda d: d["rounds"][1]["parents"].__setitem__(0, 0), ["rounds[1].parents[0]", "got 0", "-1"]),
    (lambda d: d["rounds"][1]["parents"].pop(), ["rounds[1].parents", "entries"]),
    (lambda d: d["rounds"][1]["depths"].__setitem__(0, 3), ["rounds[1].depths[0]", "got 3", "parent's + 1"]),
    (lambda d: d["rounds"][1].update(accepted=[0, 99]), ["rounds[1].accepted[1]", "got 99", "node index in [1,"]),
    (lambda d: d["rounds"][1].update(accepted=[1]), ["rounds[1].accepted[0]", "got 1", "0 (the root)"]),
    (lambda d: d["rounds"][1].update(accepted=[]), ["rounds[1].accepted", "got []", "non-empty"]),
    (lambda d: d["rounds"][1].update(accepted="0,1"), ["rounds[1].accepted", "'0,1'"]),
    (lambda d: d["rounds"][1].update(tokens="abc"), ["rounds[1].tokens", "'abc'", "list of integers"]),
    (lambda d: d["rounds"][1].update(draft_probs=[]), ["rounds[1].draft_probs", "got []", "one per committed"]),
    (lambda d: d["rounds"][1].update(start=-3), ["rounds[1].start", "got -3", "non-negative"]),
    (lambda d: d["rounds"][1].pop("bonus"), ["rounds[1]", "no bonus field"]),
    (lambda d: d["rounds"].__setitem__(0, [1, 2]), ["rounds[0]", "got [1, 2]", "expected an object"]),
    (lambda d: d.update(rounds={"0": 1}), ["rounds: got {'0': 1}", "a list of rounds"]),
    (lambda d: d.update(tokens=[1, "x"]), ["tokens: got [1, 'x']", "list of token ids"]),
    (lambda d: d.update(target_forwards=-1), ["target_forwards: got -1"]),
    (lambda d: d.pop("prompt"), ["no prompt field"]),
    # numbers the figures cannot draw (they raised inside matplotlib, or drew nonsense, leaving half the files)
    (lambda d: d["rounds"][1]["times"].update(draft=float("inf")), ["rounds[1].times", "finite, >= 0"]),
    (lambda d: d["rounds"][1]["logw"].__setitem__(0, float("nan")), ["rounds[1].logw", "finite log-probabilities"]),
    (lambda d: d["rounds"][1]["logw"].__setitem__(0, 0.5), ["rounds[1].logw", "(<= 0)"]),
    (lambda d: d["rounds"][1]["draft_probs"].__setitem__(0, 5.0), ["rounds[1].draft_probs", "probabilities"]),
    (lambda d: d.update(seconds=-1.0), ["seconds: got -1.0", "finite, >= 0"]),
    (lambda d: d["settings"].update(model=5), ["settings.model: got 5", "a string"]),
])
def test_a_corrupted_trace_is_named(trace, tmp_path, corrupt, needles):
    d = json.loads(json.dumps(trace))
    if len(d["rounds"][1]["tokens"]) < 3:
        pytest.skip("round 1 drew a tree too small for the case")
    corrupt(d)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    with pytest.raises(TraceError) as e:
        kd.Generation.from_json(str(p))
    msg = str(e.value)
    for n in [str(p), *needles]:
        assert n in msg, f"{n!r} not in {msg!r}"
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize("text, needle", [("[1, 2]", "got a JSON list"), ('{"prompt": ', "not JSON"),
                                          ("\xff\xfe", "not UTF-8")])
def test_a_trace_that_is_not_a_trace(tmp_path, text, needle):
    p = tmp_path / "bad.json"
    p.write_bytes(text.encode("latin-1"))
    with pytest.raises(TraceError, match=needle):
        kd.Generation.from_json(str(p))


def test_a_trace_from_a_path_object_or_nothing(trace, tmp_path):
    """A pathlib.Path loads like its str; empty text is a named TraceError, not a FileNotFoundError for ''."""
    p = tmp_path / "t.json"
    p.write_text(json.dumps(trace))
    assert kd.Generation.from_json(p).tokens == trace["tokens"]
    for bad in ("", "   ", None):
        with pytest.raises(TraceError, match="trace: expected JSON text or a file path, got"):
            kd.Generation.from_json(bad)
