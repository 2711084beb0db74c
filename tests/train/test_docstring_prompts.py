"""--regen-docstring's site finder (kdtree_numba/train/docstring_prompts.py) on a token stream made with the shipped
tokenizer: which positions count as "a def's docstring just closed", the prompts cut there (P tokens, ending with
the closing quotes token and the bare "\\n" id, as HumanEval prompts do), the sampled search, the argument checks."""
import math
import os
import re

import numpy as np
import pytest

pytest.importorskip("tokenizers")

from kdtree_numba.train import docstring_prompts as dsp  # noqa: E402

TOKENIZER = os.path.join(os.path.dirname(dsp.__file__), "..", "default_model", "target", "tokenizer.json")

CODE = '''import os


def add(a, b):
    """Return a + b."""
    return a + b


def no_doc(x):
    return x * 2


class Thing:
    """A class docstring: no def right before it."""

    def method(self, y: int = 3) -> int:
        """Multi-line docstring.

        >>> Thing().method(1)
        1
        """
        return y


def late(x):
    y = x + 1
    """Not a docstring: not the first statement."""
    return y


def one(): """One-liner."""


async def multi(a,
                b: dict = {},
                c=(1, (2, 3))) -> "Tuple[int, int]":
    r\'\'\'Raw single-quoted docstring.\'\'\'
    return a, b, c


s = """a module-level string"""
'''
VALID = ["add", "method", "one", "multi"]


@pytest.fixture(scope="module")
def tok():
    from tokenizers import Tokenizer

    return Tokenizer.from_file(TOKENIZER)


@pytest.fixture(scope="module")
def stream(tok):
    """CODE three times, files separated by <|endoftext|> = 0                                      -> [T] uint16"""
    ids = tok.encode(CODE).ids
    return np.array((ids + [0]) * 3, np.uint16)


def _function_of(tok, tokens, i):
    """The name of the last def before position i (what a site belongs to)."""
    text = tok.decode(tokens[: i + 1].tolist(), skip_special_tokens=False)
    return re.findall(r"def (\w+)", text)[-1]


def test_sites_are_defs_followed_directly_by_their_docstring(tok, stream):
    sites, info = dsp.find_sites(stream, tok, 2)
    assert [_function_of(tok, stream, i) for i in sites] == VALID * 3
    assert info["valid"] == 12 and info["checked"] == info["candidates"] > 12      # openings, class, late, module
    closing = {tok.decode([int(stream[i])]) for i in sites}
    assert closing == {' """', '."""', "'"}                       # the ''' of multi is split into '' + '
    assert {'"""', ' """', '."""', " '''"} <= {tok.decode([i]) for i in dsp.QuoteTables(tok).closing_ids()}


def test_rule_on_text():
    ok = ['def f():\n    """doc"""', "def f(x) -> int:\n    '''doc\n    '''", 'def f(): """doc"""',
          'def f(a,\n      b=(1, 2)):\n    r"""doc"""', '    async def f(self):\n        """doc."""']
    bad = ['class A:\n    """doc"""', 'def f():\n    x = 1\n    """doc"""', 'def f():  # c\n    """doc"""',
           'def f():\n    """doc', 'x = """doc"""', 'def f():\n    """doc"""\n', 'def f():\n    f"""doc"""']
    assert [dsp.is_docstring_end(t) for t in ok] == [True] * len(ok)
    assert [dsp.is_docstring_end(t) for t in bad] == [False] * len(bad)


def test_prompts_end_with_the_closing_token_and_a_bare_newline(tok, stream):
    P = 12
    sites, _ = dsp.find_sites(stream, tok, P)
    prompts = dsp.prompts_at(stream, sites, P, dsp.newline_id(tok))                  # [n, P]
    nl = tok.encode("\n").ids[0]
    assert prompts.shape == (len(sites), P) and prompts.dtype == np.int64
    assert (prompts[:, -1] == nl).all()
    for i, p in zip(sites, prompts):
        assert p[:-1].tolist() == stream[i - P + 2: i + 1].tolist()                 # the stream up to the quotes
        assert re.search(r"(\"\"\"|''')\n\Z", tok.decode(p.tolist()))


def test_a_site_without_room_for_the_prompt_is_skipped(tok, stream):
    all_sites, _ = dsp.find_sites(stream, tok, 2)
    P = int(all_sites[0]) + 3                                       # one token short for the first site
    sites, _ = dsp.find_sites(stream, tok, P)
    assert sites.tolist() == all_sites[1:].tolist()
    assert dsp.find_sites(stream, tok, P - 1)[0].tolist() == all_sites.tolist()


def test_sampled_search_and_too_few_sites(tok, stream):
    all_sites, _ = dsp.find_sites(stream, tok, 8)
    a, info = dsp.find_sites(stream, tok, 8, need=5, rng=np.random.default_rng(1))
    b, _ = dsp.find_sites(stream, tok, 8, need=5, rng=np.random.default_rng(1))
    assert a.tolist() == b.tolist() and len(set(a.tolist())) == 5 and set(a.tolist()) <= set(all_sites.tolist())
    assert info["valid"] == 5 and info["checked"] <= info["candidates"]
    train, val = stream[:200], stream[200:]
    tr, va, info = dsp.docstring_prompts(train, val, tok, np.random.default_rng(0), 1, 2, 8, 0.5)
    assert tr.shape == (1, 8) and va.shape == (2, 8) and info["train_prompts"] == 1 and info["val"]["valid"] == 2
    n_train_sites = int(np.sum(all_sites < 200))
    fits = math.floor(100 * 0.5 * n_train_sites / 99) / 100          # the largest fraction the sites allow
    assert n_train_sites > 0 and fits < 0.5
    with pytest.raises(ValueError, match=rf"--regen-docstring 0.5: the train split has only {n_train_sites} valid "
                                         rf".*, 99 asked; --regen-docstring {fits:g} or less fits"):
        dsp.docstring_prompts(train, val, tok, np.random.default_rng(0), 99, 2, 8, 0.5)


def test_nothing_asked_leaves_the_generator_alone(tok, stream):
    rng = np.random.default_rng(3)
    before = rng.bit_generator.state
    tr, va, info = dsp.docstring_prompts(stream, stream, tok, rng, 0, 0, 8, 0.0)
    assert rng.bit_generator.state == before and tr.shape == va.shape == (0, 8) and info["seconds"] == 0.0


def test_fraction_checks_and_counts():
    for bad in (-0.1, 1.5, float("nan"), float("inf"), "x", None):
        with pytest.raises(ValueError, match=r"--regen-docstring .*expected a fraction in \[0, 1\]"):
            dsp.check_fraction(bad)
    assert [dsp.check_fraction(v) for v in (0, "0.25", 1)] == [0.0, 0.25, 1.0]
    assert [dsp.count_for(f, 64) for f in (0.0, 0.001, 0.5, 1.0)] == [0, 0, 32, 64]
    assert dsp.count_for(0.125, 4) == 1 and dsp.count_for(0.1, 4) == 0
