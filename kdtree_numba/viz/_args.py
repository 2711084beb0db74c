"""Argument checks shared by the picture functions: a bad argument is a ValueError naming it, its value and what
was expected, raised before anything is drawn - never an AttributeError or KeyError from deep inside a plot.
Example: tokenizer("x") -> ValueError("tokenizer: expected target.tokenizer (token_text and decode) or None,
got str")."""
from __future__ import annotations

from collections.abc import Sequence


def _kind(value) -> str:
    return type(value).__name__


def tokenizer(tok):
    """``tok`` when it is None or labels tokens like ``target.tokenizer`` (``token_text`` and ``decode``)."""
    if tok is not None and not (callable(getattr(tok, "token_text", None)) and callable(getattr(tok, "decode", None))):
        raise ValueError(f"tokenizer: expected target.tokenizer (token_text and decode) or None, got {_kind(tok)}")
    return tok


def generation(gen, arg: str = "gen"):
    """``gen`` when it is a Generation (what kd.generate returns)."""
    from ..decode.trace import Generation

    if not isinstance(gen, Generation):
        raise ValueError(f"{arg}: expected a Generation (what kd.generate returns), got {_kind(gen)}")
    return gen


def rounds(value, arg: str = "rounds") -> list:
    """The rounds of a Generation, or a list of RoundTraces, as a list."""
    from ..decode.trace import Generation, RoundTrace

    if isinstance(value, Generation):
        return list(value.rounds)
    if isinstance(value, Sequence) and not isinstance(value, (str, bytes)) \
            and all(isinstance(r, RoundTrace) for r in value):          # a list, or a Generation's ``rounds``
        return list(value)
    raise ValueError(f"{arg}: expected a Generation or a list of its RoundTraces, got {_kind(value)}")


def axes(ax, arg: str = "ax"):
    """``ax`` when it is None or a matplotlib Axes."""
    from matplotlib.axes import Axes

    if ax is not None and not isinstance(ax, Axes):
        raise ValueError(f"{arg}: expected a matplotlib Axes or None, got {_kind(ax)}")
    return ax
