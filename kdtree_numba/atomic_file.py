"""Files that appear whole or not at all: every file the package writes outside a checkpoint save (traces, viewer
pages, figures, the tokenizer, one safetensors file, the model card; the benchmarks' JSON) goes through
``write_atomic``.

    write_atomic(path, write):  write(tmp) fills a temporary file beside ``path``; os.replace(tmp, path) puts it in
                                place in one step; on any failure tmp is removed and the error raised.

A reader (or a user after Ctrl-C, a full disk, an exception inside ``write``) sees the old file or the new one,
never a half-written one, and no temporary is left. The temporary keeps ``path``'s extension, so a writer that
picks its format from the name (matplotlib's ``savefig``) writes the same format. ``path``'s folder must exist.
Example: ``write_text_atomic("out/trace.json", text)`` (= ``write_atomic`` with a function that writes ``text`` to
the temporary) - while it runs, out/ holds ``.trace.json.partial-1a2b3c4d.json``; afterwards only trace.json.
"""
from __future__ import annotations

import contextlib
import os
import secrets


def write_atomic(path, write) -> None:
    """Call ``write(tmp)`` to fill a temporary file beside ``path``, then move it to ``path`` (module docstring)."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a folder, expected a file path")
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.partial-{secrets.token_hex(4)}{os.path.splitext(name)[1]}")
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(tmp)
        raise


def write_text_atomic(path, text: str) -> None:
    """``text`` (UTF-8, LF line ends) written to ``path`` with ``write_atomic``."""
    write_atomic(path, lambda tmp: _write_text(tmp, text))


def _write_text(path, text: str) -> None:
    with open(path, "w", encoding="utf-8", newline="\n") as f:       # LF on every platform
        f.write(text)
