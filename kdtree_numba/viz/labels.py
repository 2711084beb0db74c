"""Readable text for tokens: the labels drawn inside tree nodes and the generated text under them.

Byte-level vocabularies (``vocab_size == 256``, as in ``kd.tiny_target``) show each token as its character:
printable ASCII as itself, a space as ``␣``, a newline as ``⏎``, a tab as ``⇥`` and every other byte as ``\\xNN``.
Any other vocabulary has no text here, so its tokens are shown as their decimal ids.

Example: ``token_label(72, 256) -> 'H'``, ``token_label(32, 256) -> '␣'``, ``token_label(200, 256) -> '\\xc8'``,
``token_label(200, 32000) -> '200'``; ``text_of(list(b"Hi!"), 256) -> 'Hi!'``.
"""
from __future__ import annotations

BYTE_VOCAB = 256


def _check(tok, vocab_size: int) -> int:
    tok = int(tok)
    if tok < 0 or (vocab_size > 0 and tok >= vocab_size):
        raise ValueError(f"token: {tok} is outside the vocabulary 0..{vocab_size - 1}")
    return tok


def token_label(tok: int, vocab_size: int) -> str:
    """Short printable label of one token (what a tree node shows).

    tok: the token id; vocab_size: the vocabulary size (256 = byte-level text). Raises ValueError for an id
    outside the vocabulary."""
    tok = _check(tok, vocab_size)
    if vocab_size != BYTE_VOCAB:
        return str(tok)
    if tok == 32:
        return "\u2423"                       # ␣
    if tok == 10:
        return "\u23ce"                       # ⏎
    if tok == 9:
        return "\u21e5"                       # ⇥
    if 33 <= tok <= 126:
        return chr(tok)
    return f"\\x{tok:02x}"


def token_piece(tok: int, vocab_size: int) -> str:
    """The token as it reads inside running text: like ``token_label`` but a space stays a space and a newline
    is ``⏎`` followed by a real line break (ids of non-byte vocabularies get a trailing space)."""
    tok = _check(tok, vocab_size)
    if vocab_size != BYTE_VOCAB:
        return f"{tok} "
    if tok == 32:
        return " "
    if tok == 10:
        return "\u23ce\n"
    return token_label(tok, vocab_size)


def text_of(tokens, vocab_size: int) -> str:
    """The text of a token sequence: UTF-8 decoded bytes (invalid sequences replaced by U+FFFD) for a
    byte-level vocabulary, else the ids joined by single spaces."""
    toks = [_check(t, vocab_size) for t in tokens]
    if vocab_size == BYTE_VOCAB:
        return bytes(toks).decode("utf-8", errors="replace")
    return " ".join(str(t) for t in toks)
