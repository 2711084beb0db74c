"""The text side of a model: an HF ``tokenizer.json`` (the ``tokenizers`` library) behind two calls.

``Tokenizer.encode(text) -> list[int]`` and ``.decode(ids) -> str``; ``token_text(id)`` is one token's own text
for labels (tree nodes, the viewer), with whitespace made visible. A checkpoint directory that holds a
``tokenizer.json`` gets one at load (``target.tokenizer``); the tiny random models have none (``None``).
Example: the default model's tokenizer encodes "def f(x):" into 5 ids and decodes them back to the same text.
"""
from __future__ import annotations

import os

from ..atomic_file import write_atomic
from ..kernels import _checks


class TokenizerError(ValueError):
    """A tokenizer file is missing, malformed, or does not fit the model."""


class Tokenizer:
    def __init__(self, path: str, vocab_size: int | None = None):
        try:
            from tokenizers import Tokenizer as _HF
        except ImportError:                                         # a core dependency; only a broken install
            raise TokenizerError("tokenizer: the 'tokenizers' package is not installed") from None
        try:
            self._tok = _HF.from_file(os.fspath(path))
        except Exception as e:                                      # the library's own error types vary
            raise TokenizerError(f"{path}: not a readable tokenizer.json ({str(e).splitlines()[0][:200]})") from None
        self.path = os.fspath(path)
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
        if vocab_size is not None and self.vocab_size > vocab_size:
            raise TokenizerError(f"{path}: {self.vocab_size} tokens, more than the model's vocab_size {vocab_size}")

    def encode(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"text: expected a string, got {type(text).__name__}")
        return list(self._tok.encode(text, add_special_tokens=False).ids)

    def decode(self, ids) -> str:
        """The text of token ids (ids past this tokenizer's vocabulary - a model's padded rows - decode to
        nothing); a negative or non-integer id is a ValueError naming it (a raw OverflowError, or 1.5 read as 1)."""
        out = [_checks.integer(i, f"ids[{k}]", lo=0) for k, i in enumerate(ids)]
        return self._tok.decode(out, skip_special_tokens=False)

    def save(self, path: str) -> None:
        """Write the tokenizer as ``tokenizer.json`` at ``path`` (atomically)."""
        write_atomic(path, self._tok.save)

    def token_id(self, token: str) -> int | None:
        """The id of a (special) token string, or None."""
        return self._tok.token_to_id(token)

    def token_text(self, i: int) -> str:
        """One token's text for a label: spaces as '·', newlines as '⏎', tabs as '→'."""
        s = self.decode([i])
        return s.replace(" ", "·").replace("\n", "⏎").replace("\t", "→") or "∅"


def load(directory: str, vocab_size: int | None = None) -> Tokenizer | None:
    """The directory's ``tokenizer.json``, or None when it has none."""
    path = os.path.join(directory, "tokenizer.json")
    return Tokenizer(path, vocab_size) if os.path.exists(path) else None
