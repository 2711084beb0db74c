"""Readable text for tokens: the labels drawn inside tree nodes and the generated text under them.

With a tokenizer (``target.tokenizer``, e.g. the default model's byte-level BPE) a token is shown as its decoded
text: ``token_label`` gives the label form (``tokenizer.token_text``: spaces as ``·``, newlines as ``⏎``, tabs as
``→``), ``token_piece`` and ``text_of`` the running text (real spaces and line breaks). Ids the tokenizer does
not cover (a model's padding rows) are shown as ``#id``.

Without one, byte-level vocabularies (``vocab_size == 256``, as in ``kd.tiny_target``) show each token as its
character: printable ASCII as itself, a space as ``␣``, a newline as ``⏎``, a tab as ``⇥`` and every other byte as
``\\xNN``. Any other vocabulary has no text here, so its tokens are shown as their decimal ids.

Example: ``token_label(72, 256) -> 'H'``, ``token_label(32, 256) -> '␣'``, ``token_label(200, 256) -> '\\xc8'``,
``token_label(200, 32000) -> '200'``; ``text_of(list(b"Hi!"), 256) -> 'Hi!'``;
``token_label(ids[0], 4096, tokenizer=target.tokenizer) -> 'def'``.
"""
from __future__ import annotations

from ..kernels import _checks
from . import _args

BYTE_VOCAB = 256


def _check(tok, vocab_size: int) -> int:
    tok = _checks.integer(tok, "token")
    if tok < 0 or (vocab_size > 0 and tok >= vocab_size):
        hint = (" (the pictures label bytes by default, vocab_size 256: pass tokenizer=target.tokenizer or "
                "vocab_size=target.config.vocab_size)") if vocab_size == BYTE_VOCAB and tok >= vocab_size else ""
        raise ValueError(f"token: {tok} is outside the vocabulary 0..{vocab_size - 1}{hint}")
    return tok


def _covered(tok: int, tokenizer) -> bool:
    size = getattr(tokenizer, "vocab_size", None)
    return size is None or tok < size


def token_label(tok: int, vocab_size: int, tokenizer=None) -> str:
    """Short printable label of one token (what a tree node shows).

    tok: the token id; vocab_size: the vocabulary size (256 = byte-level text); tokenizer: an object with
    ``token_text(id)`` (``target.tokenizer``): labels are its decoded text and vocab_size is not consulted.
    Raises ValueError for an id outside the vocabulary (a negative id with a tokenizer)."""
    _args.tokenizer(tokenizer)
    if tokenizer is not None:
        tok = _check(tok, 0)
        return tokenizer.token_text(tok) if _covered(tok, tokenizer) else f"#{tok}"
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


def token_piece(tok: int, vocab_size: int, tokenizer=None) -> str:
    """The token as it reads inside running text: like ``token_label`` but a space stays a space and a newline
    is ``⏎`` followed by a real line break (ids of non-byte vocabularies get a trailing space)."""
    _args.tokenizer(tokenizer)
    if tokenizer is not None:
        tok = _check(tok, 0)
        if not _covered(tok, tokenizer):
            return f"#{tok} "
        return tokenizer.decode([tok]).replace("\n", "\u23ce\n")
    tok = _check(tok, vocab_size)
    if vocab_size != BYTE_VOCAB:
        return f"{tok} "
    if tok == 32:
        return " "
    if tok == 10:
        return "\u23ce\n"
    return token_label(tok, vocab_size)


def text_of(tokens, vocab_size: int, tokenizer=None) -> str:
    """The text of a token sequence: ``tokenizer.decode`` when a tokenizer is given; else UTF-8 decoded bytes
    (invalid sequences replaced by U+FFFD) for a byte-level vocabulary, else the ids joined by single spaces."""
    _args.tokenizer(tokenizer)
    if tokenizer is not None:
        return tokenizer.decode([_check(t, 0) for t in tokens])
    toks = [_check(t, vocab_size) for t in tokens]
    if vocab_size == BYTE_VOCAB:
        return bytes(toks).decode("utf-8", errors="replace")
    return " ".join(str(t) for t in toks)


def visible(text: str) -> str:
    """``text`` with whitespace made visible the way tokenizer labels show it (a space ``·``, a newline ``⏎``,
    a tab ``→``): for one-line captions of decoded text."""
    return text.replace(" ", "\u00b7").replace("\n", "\u23ce").replace("\t", "\u2192")


def shorten(label: str, limit: int) -> str:
    """``label`` cut to ``limit`` characters, the last one an ellipsis when something was cut."""
    return label if len(label) <= limit else label[:max(limit - 1, 1)] + "\u2026"
