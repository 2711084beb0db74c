"""#16 item 2: saves are atomic. A save over a sharded checkpoint loads as the new model; a save that fails at any
point (a writer raising, a full disk, a rename refused) leaves the old checkpoint byte-identical and nothing
behind; files the save does not supersede survive. The same for the drafter's save and the tokenizer."""
import errno
import json
import os

import pytest

import kdtree_numba as kd
from kdtree_numba.model import checkpoint as ck
from kdtree_numba.model import dflash
from kdtree_numba.model import tokenizer as tk

from .helpers import INDEX, same_state, save_sharded, snapshot, tiny

pytestmark = pytest.mark.usefixtures("numpy_backend")


def unrelated(path):
    """Files a user keeps beside the weights; no save may touch them."""
    os.makedirs(os.path.join(path, "notes"), exist_ok=True)
    for name, text in (("README.md", "my notes"), ("generation_config.json", "{}"), ("notes/run.txt", "x")):
        with open(os.path.join(path, name), "w") as f:
            f.write(text)


def make_tokenizer(tmp_path, vocab=64):
    from tokenizers import Tokenizer, models, pre_tokenizers

    hf = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    hf.pre_tokenizer = pre_tokenizers.Whitespace()
    p = str(tmp_path / "tok.json")
    hf.save(p)
    return tk.Tokenizer(p, vocab)


@pytest.mark.parametrize("layout", ["sharded", "single"])
def test_save_over_a_checkpoint_loads_the_new_model_and_keeps_other_files(tmp_path, layout):
    old, new = tiny(1), tiny(2)
    path = tmp_path / "ckpt"
    save_sharded(old, path) if layout == "sharded" else old.save(path)
    unrelated(path)
    keep = {k: v for k, v in snapshot(path).items() if k in ("README.md", "generation_config.json", "notes/",
                                                              "notes/run.txt")}
    new.save(path)
    assert same_state(kd.load_target(path).state_dict(), new.state_dict())
    after = snapshot(path)
    assert {k: after[k] for k in keep} == keep                                  # unrelated files untouched
    assert sorted(after) == sorted(["config.json", "model.safetensors", *keep])  # stale index and shards gone
    assert sorted(os.listdir(tmp_path)) == ["ckpt"]                              # no staging directory left


def test_a_stale_index_beside_model_safetensors_is_refused(tmp_path):
    """The loader never guesses between a single file and an index that does not list it."""
    path = tmp_path / "ckpt"
    save_sharded(tiny(1), path)
    tiny(2).save(tmp_path / "other")
    os.replace(tmp_path / "other" / "model.safetensors", path / "model.safetensors")
    with pytest.raises(ck.CheckpointError, match=f"{path}: holds both model.safetensors and {INDEX}"):
        kd.load_target(path)


def _enospc(*a, **k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _partial_weights_then_full_disk(path, tensors):
    with open(str(path) + ".partial", "wb") as f:                # what a full disk leaves mid-write
        f.write(b"\0" * 64)
    _enospc()


def _fail_at_second_rename(monkeypatch):
    real, calls = os.replace, []

    def replace(a, b):
        calls.append(a)
        if len(calls) == 2:
            _enospc()
        return real(a, b)

    monkeypatch.setattr(os, "replace", replace)


FAILURES = {
    "weights writer": lambda mp: mp.setattr(ck, "save_safetensors", _partial_weights_then_full_disk),
    "config writer": lambda mp: mp.setattr(json, "dump", _enospc),
    "tokenizer writer": lambda mp: mp.setattr(tk.Tokenizer, "save", _enospc),
    "a rename": _fail_at_second_rename,
}


@pytest.mark.parametrize("layout", ["sharded", "single"])
@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_a_failed_save_leaves_the_old_checkpoint(tmp_path, monkeypatch, layout, failure):
    old, new = tiny(1), tiny(2)
    new.tokenizer = make_tokenizer(tmp_path)
    path = tmp_path / "ckpt"
    save_sharded(old, path) if layout == "sharded" else old.save(path)
    unrelated(path)
    before, siblings = snapshot(path), sorted(os.listdir(tmp_path))
    with monkeypatch.context() as mp:
        FAILURES[failure](mp)
        with pytest.raises(OSError, match="No space left"):
            new.save(path)
    assert snapshot(path) == before                          # byte-identical, no *.partial
    assert sorted(os.listdir(tmp_path)) == siblings          # no staging directory left
    assert same_state(kd.load_target(path).state_dict(), old.state_dict())
    new.save(path)                                           # and the same save then succeeds
    back = kd.load_target(path)
    assert same_state(back.state_dict(), new.state_dict())
    assert back.tokenizer is not None and back.tokenizer.encode("t5 t7") == [5, 7]


def test_a_failed_first_save_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(json, "dump", _enospc)
    with pytest.raises(OSError):
        tiny(1).save(tmp_path / "a" / "b")
    assert os.listdir(tmp_path / "a") == []


def test_save_refuses_an_empty_or_missing_path_and_names_the_path_it_could_not_write(tmp_path, monkeypatch):
    """save("") would have resolved to the working directory and replaced its checkpoint files; a failure of the
    file system names the path asked for, not the staging folder beside it, and keeps its OSError class."""
    monkeypatch.chdir(tmp_path)
    for bad in ("", None, 123):
        with pytest.raises(ck.CheckpointError, match=f"path: expected a checkpoint directory path, got {bad!r}"):
            tiny(1).save(bad)
    assert os.listdir(tmp_path) == []
    (tmp_path / "f").write_text("x")
    with pytest.raises(FileExistsError, match=f"path: cannot save to {tmp_path / 'f' / 'ck'}: "):
        tiny(1).save(tmp_path / "f" / "ck")
    assert os.listdir(tmp_path) == ["f"]


def test_save_refuses_a_file_path(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ck.CheckpointError, match="exists and is not a directory"):
        tiny(1).save(tmp_path / "f")
    assert (tmp_path / "f").read_text() == "x"


def test_drafter_save_is_atomic_and_replaces_a_sharded_drafter(tmp_path, monkeypatch):
    target = tiny(1)
    old, new = dflash.random_drafter(target, seed=1), dflash.random_drafter(target, seed=2)
    path = tmp_path / "drafter"
    old.save(path)
    # re-shard the old drafter's weights as transformers would, beside an unrelated file
    sd = old.state_dict()
    keys = sorted(sd)
    os.remove(path / "model.safetensors")
    wmap = {}
    for i, name in enumerate(("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")):
        ck.save_safetensors(str(path / name), {k: sd[k] for k in keys[i::2]})
        wmap.update({k: name for k in keys[i::2]})
    (path / INDEX).write_text(json.dumps({"weight_map": wmap}))
    unrelated(path)
    assert same_state(kd.load_drafter(path, target).state_dict(), sd)
    before = snapshot(path)
    with monkeypatch.context() as mp:
        mp.setattr(json, "dump", _enospc)
        with pytest.raises(OSError):
            new.save(path)
    assert snapshot(path) == before and sorted(os.listdir(tmp_path)) == ["drafter"]
    new.save(path)
    assert same_state(kd.load_drafter(path, target).state_dict(), new.state_dict())
    assert not (path / INDEX).exists() and (path / "README.md").read_text() == "my notes"
