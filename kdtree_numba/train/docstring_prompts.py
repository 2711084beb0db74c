"""Regeneration prompts that END LIKE A HUMANEVAL PROMPT: ``--regen-docstring F`` of ``train drafter``.

Why: the drafter learns from text the target regenerated from 64-token prompts. Random corpus windows give a
held-out chain acceptance of ~4 on such text but ~2 on the HumanEval prompts, which all end with a function
signature, its docstring, the closing quotes token and one bare ``"\\n"`` token, after which the target writes the
body. A fraction F of the prompts is taken from places of the corpus that look like that.

A SITE is a position i of a token split (train or validation) such that

    * token i closes a run of three equal quote characters (``\"\"\"`` or ``'''``, also when the run is split
      over up to three tokens, e.g. ``''`` + ``'``) and the next token starts with blanks and a newline (or is
      ``<|endoftext|>``, or i ends the split): found with NumPy over the whole split from per-id tables;
    * the decoded look-back window ``tokens[i - LOOKBACK + 1 .. i]`` ends with ``def name(...) [-> ann]:``, then
      only whitespace, then the opening triple quote (optional ``r``/``u``/``b``/``rb``/``br`` prefix), then the
      docstring (no triple quote of its kind inside), then the closing quotes: the docstring is the first statement
      of the function (a class docstring, or a string after other statements, does not match);
    * the ``P - 1`` prompt tokens ending at i lie inside the split (i >= P - 2).

The PROMPT of a site is ``tokens[i - P + 2 .. i] + [id of "\\n"]``, P tokens: whatever precedes the def in the
stream as left context, the closing quotes token, then the bare newline (the corpus usually has a
``"\\n" + indentation`` token there; the eval has ``"\\n"``).

``find_sites`` checks candidates in a random order (the run's Generator) until it has as many as asked, so a
request is a uniform sample of the valid sites without decoding the whole split; without ``need`` it scans all of
them (the statistics). NumPy, ``re`` and ``tokenizers`` only (no torch).
"""
from __future__ import annotations

import math
import os
import re
import time

import numpy as np

FLAG = "--regen-docstring"
LOOKBACK = 200                    # tokens decoded before a candidate closing quote (signature + docstring)
CHUNK = 2048                      # candidates decoded per batch
QUOTES = ('"', "'")

_DEF_START = re.compile(r"(?m)^[ \t]*(?:async[ \t]+)?def[ \t]")
_PARAMS = r"\((?:[^()]|\((?:[^()]|\([^()]*\))*\))*\)"          # parentheses nested up to three deep
_SIGNATURE = re.compile(r"[ \t]*(?:async[ \t]+)?def[ \t]+[A-Za-z_]\w*[ \t]*" + _PARAMS +
                        r"[ \t]*(?:->[^:]+)?:\s*")              # fullmatch: only whitespace after the colon
_STRING_PREFIX = re.compile(r"(?:[rR][bB]?|[bB][rR]?|[uU])\Z")
_NEWLINE_START = re.compile(r"[ \t]*\r?\n")


def check_fraction(value, flag: str = FLAG) -> float:
    """``value`` as a float in [0, 1]; anything else (negative, > 1, NaN, not a number): ValueError naming the
    flag (``--regen-docstring`` unless told) and the value."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{flag} {value!r}: expected a fraction in [0, 1]") from None
    if not (math.isfinite(f) and 0.0 <= f <= 1.0):
        raise ValueError(f"{flag} {value!r}: expected a fraction in [0, 1]")
    return f


def count_for(fraction: float, n: int) -> int:
    """How many of ``n`` prompts are docstring prompts: round(fraction * n), halves up (0 for fraction 0)."""
    return int(math.floor(fraction * n + 0.5)) if fraction > 0 else 0


def load_tokenizer(*dirs):
    """``tokenizers.Tokenizer`` of the first ``DIR/tokenizer.json`` that exists (FileNotFoundError naming them all)."""
    from tokenizers import Tokenizer

    paths = [os.path.join(d, "tokenizer.json") for d in dirs if d]
    for p in paths:
        if os.path.isfile(p):
            return Tokenizer.from_file(p)
    raise FileNotFoundError(f"{FLAG}: no tokenizer.json in {', '.join(paths) or 'no directory'} (needed to find "
                            f"docstrings)")


def newline_id(tokenizer) -> int:
    """The single token id of ``"\\n"`` (what ends every HumanEval prompt)."""
    ids = tokenizer.encode("\n").ids
    if len(ids) != 1:
        raise ValueError(f"{FLAG}: the tokenizer encodes '\\n' as {len(ids)} tokens {ids}, expected one")
    return int(ids[0])


class QuoteTables:
    """Per-id tables of a tokenizer: trailing quote runs, all-quote tokens, newline-starting tokens."""

    def __init__(self, tokenizer):
        V = tokenizer.get_vocab_size()
        self.strings = [tokenizer.decode([i], skip_special_tokens=False) for i in range(V)]
        self.tail = {q: np.zeros(V, np.int16) for q in QUOTES}         # trailing run of q       [V]
        self.whole = {q: np.zeros(V, bool) for q in QUOTES}            # token is only q chars    [V]
        self.newline_start = np.zeros(V, bool)                         # blanks then a newline    [V]
        for i, s in enumerate(self.strings):
            for q in QUOTES:
                self.tail[q][i] = len(s) - len(s.rstrip(q))
                self.whole[q][i] = bool(s) and s.strip(q) == ""
            self.newline_start[i] = bool(_NEWLINE_START.match(s))
        eot = tokenizer.token_to_id("<|endoftext|>")
        self.eot = int(eot) if eot is not None else None

    def cover(self, size: int) -> None:
        """Extend the tables to ``size`` ids (ids the tokenizer does not know: no quotes, no newline)."""
        extra = size - len(self.newline_start)
        if extra > 0:
            for q in QUOTES:
                self.tail[q] = np.concatenate([self.tail[q], np.zeros(extra, np.int16)])
                self.whole[q] = np.concatenate([self.whole[q], np.zeros(extra, bool)])
            self.newline_start = np.concatenate([self.newline_start, np.zeros(extra, bool)])

    def closing_ids(self) -> list:
        """Ids whose decoded string itself ends with a triple quote (the common closing tokens)."""
        return [i for i, s in enumerate(self.strings) if s.endswith('"""') or s.endswith("'''")]


def candidate_positions(tokens: np.ndarray, tables: QuoteTables, first: int = 0) -> np.ndarray:
    """Positions >= ``first`` that close a triple-quote run followed by a newline-starting token (NumPy)."""
    t = np.asarray(tokens)
    n = len(t)
    if n:
        tables.cover(int(t.max()) + 1)
    ends_quote = np.zeros(len(tables.newline_start), bool)
    for q in QUOTES:
        ends_quote |= tables.tail[q] > 0
    pos = np.flatnonzero(ends_quote[t])                                              # [C0] token ends with a quote
    pos = pos[pos >= first]
    ok = np.ones(len(pos), bool)
    inner = pos < n - 1
    nt = t[pos[inner] + 1]                                                           # the following token
    ok[inner] = tables.newline_start[nt] | ((nt == tables.eot) if tables.eot is not None else False)
    pos = pos[ok]                                                                    # [C1]
    closes = np.zeros(len(pos), bool)
    t0, t1, t2 = t[pos], t[np.maximum(pos - 1, 0)], t[np.maximum(pos - 2, 0)]         # tokens i, i-1, i-2
    for q in QUOTES:
        tail, whole = tables.tail[q], tables.whole[q]
        w1 = whole[t0] & (pos >= 1)                                                  # token i is only quotes
        w2 = whole[t1] & (pos >= 2)                                                  # token i-1 too
        run = tail[t0] + np.where(w1, tail[t1] + np.where(w2, tail[t2], 0), 0)       # quote run ending at i
        closes |= run >= 3
    return pos[closes].astype(np.int64)


def is_docstring_end(text: str) -> bool:
    """Does ``text`` end with ``def name(...)[-> ann]:``, whitespace, an opening triple quote, a docstring and its
    closing quotes (the docstring being the function's first statement)?"""
    for q3 in ('"""', "'''"):
        if text.endswith(q3):
            break
    else:
        return False
    opening = text.rfind(q3, 0, len(text) - 3)
    if opening < 0:
        return False
    head = text[:opening]
    m = _STRING_PREFIX.search(head)
    if m:
        head = head[:m.start()]
    last = None
    for last in _DEF_START.finditer(head):
        pass
    return last is not None and _SIGNATURE.fullmatch(head, last.start()) is not None


def find_sites(tokens: np.ndarray, tokenizer, prompt_len: int, *, need: int | None = None,
               rng: np.random.Generator | None = None, tables: QuoteTables | None = None,
               lookback: int = LOOKBACK, chunk: int = CHUNK) -> tuple[np.ndarray, dict]:
    """Valid docstring sites of ``tokens`` (see the module docstring) -> (positions int64, info).

    With ``need``, candidates are checked in ``rng``'s random order (``rng.permutation``) and the search stops at
    ``need`` valid sites, returned in that order (a uniform sample); without it every candidate is checked in
    stream order. info: candidates, checked, valid, seconds.
    """
    t0 = time.perf_counter()
    tables = tables or QuoteTables(tokenizer)
    cand = candidate_positions(tokens, tables, first=max(0, prompt_len - 2))         # [C]
    order = rng.permutation(cand) if (need is not None and rng is not None) else cand
    found, checked = [], 0
    for s in range(0, len(order), chunk):
        if need is not None and len(found) >= need:
            break
        pos = order[s:s + chunk]
        windows = [np.asarray(tokens[max(0, int(i) - lookback + 1): int(i) + 1]).tolist() for i in pos]
        texts = tokenizer.decode_batch(windows, skip_special_tokens=False)
        for i, text in zip(pos, texts):
            checked += 1
            if is_docstring_end(text):
                found.append(int(i))
                if need is not None and len(found) >= need:
                    break
    info = {"candidates": int(len(cand)), "checked": checked, "valid": len(found),
            "seconds": time.perf_counter() - t0}
    return np.asarray(found, np.int64), info


def prompts_at(tokens: np.ndarray, sites: np.ndarray, prompt_len: int, nl_id: int) -> np.ndarray:
    """``tokens[i - P + 2 .. i] + [nl_id]`` for every site i                          -> [len(sites), P] int64"""
    P = prompt_len
    sites = np.asarray(sites, np.int64)
    out = np.empty((len(sites), P), np.int64)
    if len(sites):
        out[:, :-1] = np.asarray(tokens)[sites[:, None] + np.arange(-(P - 2), 1)[None, :]]
    out[:, -1] = nl_id
    return out


def docstring_prompts(train: np.ndarray, val: np.ndarray, tokenizer, rng: np.random.Generator, n_train: int,
                      n_val: int, prompt_len: int, fraction: float | None = None) -> tuple:
    """``n_train`` prompts from the train split's sites and ``n_val`` from the validation split's, each a uniform
    sample drawn with ``rng`` -> (train [n_train, P], val [n_val, P], info). Fewer valid sites than asked ->
    ValueError naming ``--regen-docstring``, the count found and the count asked. Nothing asked: ``rng`` untouched."""
    t0 = time.perf_counter()
    info = {"fraction": fraction, "train_prompts": int(n_train), "val_prompts": int(n_val), "lookback": LOOKBACK}
    if n_train <= 0 and n_val <= 0:
        empty = np.zeros((0, prompt_len), np.int64)
        return empty, empty, dict(info, seconds=0.0)
    nl = newline_id(tokenizer)
    tables = QuoteTables(tokenizer)
    out = {}
    for split, tokens, n in (("train", train, n_train), ("val", val, n_val)):
        if n <= 0:
            out[split] = np.zeros((0, prompt_len), np.int64)
            continue
        sites, sinfo = find_sites(tokens, tokenizer, prompt_len, need=n, rng=rng, tables=tables)
        info[split] = {k: v for k, v in sinfo.items() if k != "seconds"}
        if len(sites) < n:
            what = "validation" if split == "val" else "train"
            raise ValueError(f"{FLAG} {fraction if fraction is not None else ''}: the {what} split has only "
                             f"{len(sites)} valid docstring sites (def + docstring, {prompt_len}-token prompts; "
                             f"{sinfo['candidates']} closing-quote candidates), {n} asked"
                             + (f"; {FLAG} {math.floor(100 * fraction * len(sites) / n) / 100:g} or less fits"
                                if fraction and len(sites) else ""))
        out[split] = prompts_at(tokens, sites, prompt_len, nl)
    info["seconds"] = time.perf_counter() - t0
    return out["train"], out["val"], info


__all__ = ["FLAG", "LOOKBACK", "check_fraction", "count_for", "load_tokenizer", "newline_id", "QuoteTables",
           "candidate_positions", "is_docstring_end", "find_sites", "prompts_at", "docstring_prompts"]
