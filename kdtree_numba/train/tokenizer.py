"""Byte-level BPE tokenizer for the Python-source corpus (HF ``tokenizers``).

Byte-level BPE over the GPT-2 pre-tokenizer regex, no normalizer: every UTF-8 string, tabs, indentation, CRLF
and non-ASCII included, decodes back to itself exactly. The three special tokens always take ids 0, 1, 2 in the
order of ``SPECIALS``. Training is deterministic (the BPE trainer breaks count ties on the pair ids and the saved
vocabulary is ordered by id), so the same corpus and vocab size give a byte-identical ``tokenizer.json``.

Documents in a corpus file are separated by the literal text ``EOT``; training sees the documents without it, and
``encode_file`` maps every ``EOT`` in the text to its special id.
"""
from __future__ import annotations

import os

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

SPECIALS = ("<|endoftext|>", "<|mask|>", "<|pad|>")
EOT = SPECIALS[0]
MIN_VOCAB = 256 + len(SPECIALS)  # the byte alphabet plus the specials
MAX_VOCAB = 1 << 16  # token ids are stored as uint16
_ENCODE_BATCH = 256  # documents per encode_batch call: bounds the memory of the Encoding objects


def read_text(path: str | os.PathLike) -> str:
    """The UTF-8 text of ``path`` exactly as stored (``newline=""``: no CRLF translation)."""
    with open(path, encoding="utf-8", newline="") as f:
        return f.read()


def train(corpus_path: str | os.PathLike, vocab_size: int = 4096,
          out_path: str | os.PathLike | None = None) -> Tokenizer:
    """Train a byte-level BPE tokenizer of ``vocab_size`` tokens on the documents of ``corpus_path``.

    The corpus is split on ``EOT`` and each non-empty document is one training sequence, so the separator never
    leaks into the merges. Specials get ids 0, 1, 2. Saved as JSON to ``out_path`` when given.
    """
    if not MIN_VOCAB <= vocab_size <= MAX_VOCAB:
        raise ValueError(f"vocab_size={vocab_size}: expected {MIN_VOCAB} <= vocab_size <= {MAX_VOCAB}")
    docs = [d for d in read_text(corpus_path).split(EOT) if d]
    if not docs:
        raise ValueError(f"corpus_path={os.fspath(corpus_path)!r}: no text to train on")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(docs, trainer=trainer, length=len(docs))
    for i, s in enumerate(SPECIALS):
        if tok.token_to_id(s) != i:
            raise RuntimeError(f"special token {s!r} got id {tok.token_to_id(s)}, expected {i}")
    if out_path is not None:
        tok.save(os.fspath(out_path))
    return tok


def encode_file(tokenizer: Tokenizer, corpus_path: str | os.PathLike) -> np.ndarray:
    """The token ids (uint16, 1-D) of the text of ``corpus_path``.

    The text is split on ``EOT``; each piece is encoded as plain text and the ``EOT`` id is put back wherever the
    text had ``EOT``, so ``decode`` of a piece's ids gives the piece back.
    """
    if tokenizer.get_vocab_size() > MAX_VOCAB:
        raise ValueError(f"tokenizer vocab size {tokenizer.get_vocab_size()}: ids must fit uint16 (<= {MAX_VOCAB})")
    eot = tokenizer.token_to_id(EOT)
    if eot is None:
        raise ValueError(f"tokenizer has no {EOT!r} token")
    pieces = read_text(corpus_path).split(EOT)
    parts: list[np.ndarray] = []
    eot_arr = np.array([eot], dtype=np.uint16)
    for start in range(0, len(pieces), _ENCODE_BATCH):
        batch = pieces[start:start + _ENCODE_BATCH]
        for i, enc in enumerate(tokenizer.encode_batch(batch, add_special_tokens=False), start):
            parts.append(np.asarray(enc.ids, dtype=np.uint16))
            if i < len(pieces) - 1:
                parts.append(eot_arr)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint16)
