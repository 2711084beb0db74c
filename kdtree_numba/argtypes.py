"""argparse value types shared by every command line here (``kdtree_numba``, ``.train``, ``.parallel``, the
benchmarks): a bad value is refused with one line that says what was expected and what came.

    whole(lo, hi)        an int in [lo, hi]            "expected a whole number >= 1, got 0"
    real(lo)             a finite float >= lo          "expected a finite number >= 0, got 'nan'"
    whole_list(lo, hi)   comma-separated ints          "expected comma-separated whole numbers, got '4,x'"
Example: ``p.add_argument("--budget", type=whole(0, 1024))``; ``--budget 2000`` exits 2 with
"argument --budget: expected a whole number <= 1024, got 2000".
``OneLineParser``: an ArgumentParser whose usage errors are one line (exit 2); ``out_dir_problem(path)``: why an
output folder cannot be written (checked before a command does any work).
"""
from __future__ import annotations

import argparse
import math
import os


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error on ONE line and exits 2."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")


def _range_text(lo, hi) -> str:
    if lo is not None and hi is not None:
        return f" in [{lo}, {hi}]"
    if lo is not None:
        return f" >= {lo}"
    return f" <= {hi}" if hi is not None else ""


def whole(lo: int | None = None, hi: int | None = None):
    """An argparse type: an int within [lo, hi] (either bound may be None)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number{_range_text(lo, hi)}, got {text!r}") from None
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected a whole number{_range_text(lo, hi)}, got {value}")
        return value
    return parse


def real(lo: float = 0.0, strict: bool = False, hi: float | None = None):
    """An argparse type: a finite float >= lo (> lo when ``strict``) and <= hi; NaN and inf are refused."""
    want = f"a finite number {'>' if strict else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if not math.isfinite(value) or value < lo or (strict and value == lo) or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return value
    return parse


def whole_list(lo: int | None = None, hi: int | None = None):
    """An argparse type: comma-separated ints, at least one, each within [lo, hi]."""
    def parse(text: str) -> list[int]:
        items = [x.strip() for x in text.split(",")]   # "1, 2" is fine; "1 2" is not 12 (int() refuses it below)
        if items != [""] and "" in items:          # "1,,2" or "4," is a typo, not the list [1, 2] / [4]
            raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got an empty item in {text!r}")
        try:
            values = [int(x) for x in items if x]
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"expected at least one whole number (comma-separated, e.g. 4,16,64), "
                                             f"got {text!r}")
        bad = [v for v in values if (lo is not None and v < lo) or (hi is not None and v > hi)]
        if bad:
            raise argparse.ArgumentTypeError(f"expected whole numbers{_range_text(lo, hi)}, got {bad[0]} in {text!r}")
        return values
    return parse


def out_file_problem(path: str, exts=None) -> str | None:
    """Why an output file cannot be written at ``path`` (ending in one of ``exts`` when given), or None: an empty
    path, another ending, a folder, a missing folder, or one the filesystem refuses (``out_dir_problem``'s probe).
    Example: out_file_problem("/no/such/dir/t.json") -> "cannot write /no/such/dir/t.json (the folder /no/such/dir
    does not exist)"."""
    if not path:
        return "expected a file path, got ''"
    if exts and (not path.lower().endswith(exts) or os.path.basename(path).lower() in exts):
        return f"expected a file path ending in {' or '.join(exts)}, got {path!r}"
    if os.path.isdir(path):
        return f"{path} is a folder, expected a file path"
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        return f"cannot write {path} (the folder {folder} does not exist)"
    problem = out_dir_problem(folder)
    return f"cannot write {path} ({problem})" if problem else None


def out_dir_problem(path: str) -> str | None:
    """Why the output folder ``path`` cannot be written, or None. Checked by doing it - creating the missing
    folders and a file in it, then removing them again (nothing is left) - since the permission bits can say yes
    where the filesystem says no (root on /proc, a read-only mount). Example: out_dir_problem("/proc/x") ->
    "cannot create the folder /proc/x (No such file or directory)"."""
    if os.path.exists(path) and not os.path.isdir(path):
        return f"{path} exists and is not a folder"
    missing, p = [], os.path.abspath(path)
    while not os.path.exists(p):
        missing.append(p)                                # the deepest first
        p = os.path.dirname(p)
    try:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as e:
            return f"cannot create the folder {path} ({e.strerror or e})"
        probe = os.path.join(path, f".kdtree_write_probe_{os.getpid()}")
        try:
            with open(probe, "w"):
                pass
            os.remove(probe)
        except OSError as e:
            return f"cannot write in {path} ({e.strerror or e})"
        return None
    finally:
        for m in missing:
            if os.path.isdir(m):
                os.rmdir(m)
