"""The one file hash of the training tools: ``sha256_file(path)`` -> the hex sha256 of the file's bytes, read in
1 MiB blocks. The corpus manifest, the model card's file table, a drafter log's ``weights_sha256`` and ``--init``'s
record of its starting weights all use it. Standard library only, so the card (which must not need ``tokenizers``)
imports it too. Example: a file holding b"abc" -> "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".
"""
from __future__ import annotations

import hashlib
import os


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of the bytes of ``path``."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()
