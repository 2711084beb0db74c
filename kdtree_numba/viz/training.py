"""How the embedded default pair learned: ``training_curves(target_log, drafter_log)``.

The logs are the JSON files ``python -m kdtree_numba.train`` writes next to the models
(``default_model/target_train_log.json`` and ``drafter_train_log.json``). Four panels:
  * the target's next-token cross-entropy: training loss (every logged step) and held-out validation loss;
  * the drafter's block loss: training loss (position-weighted, on half corpus / half target-generated text)
    and validation loss on held-out corpus text and on target-generated text (what DDTree drafts at greedy);
  * the drafter's training top-1 accuracy vs step at a few block positions (position k = the k-th token after
    the root);
  * top-1 accuracy per block position at the end of training: training batches and both validation sets, with
    the expected single-chain acceptance length the validation measured (``chain_accept``).
The function returns a matplotlib Figure and saves it when ``path`` is given.
"""
from __future__ import annotations

import json
import os

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import PercentFormatter

from .rounds import ACCENT, SERIES, TREE_COLOUR, _label, _style
from .trees import save

VAL_NAMES = {"regen": "val: target-generated text", "corpus": "val: held-out corpus text"}
VAL_STYLE = {"regen": dict(color="#2b9348", marker="s"), "corpus": dict(color="#7b2cbf", marker="^")}


def _read(log) -> dict:
    if isinstance(log, dict):
        if not isinstance(log.get("steps"), list) or not log["steps"]:
            raise ValueError("log: not a training log (expected a 'steps' list)")
        return log
    if not isinstance(log, (str, os.PathLike)):
        raise ValueError(f"log: expected a training log (a dict or a JSON file path), got {type(log).__name__}")
    path = os.fspath(log)
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise ValueError(f"{path}: not a readable training log ({type(e).__name__}: {e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("steps"), list) or not data["steps"]:
        raise ValueError(f"{path}: not a training log (expected a 'steps' list)")
    return data


def _millions(n) -> str:
    return f"{n / 1e6:.1f} M" if isinstance(n, (int, float)) else "?"


def training_curves(target_log, drafter_log, path=None, positions=(1, 2, 4, 8, 15)) -> Figure:
    """Training curves of the target and its DFlash drafter (module docstring). target_log / drafter_log: the
    log dicts or paths to the JSON files; positions: block positions whose accuracy is drawn against the step."""
    t, d = _read(target_log), _read(drafter_log)
    fig = Figure(figsize=(11.0, 7.4), layout="constrained")
    (a1, a2), (a3, a4) = fig.subplots(2, 2)
    for a in (a1, a2, a3, a4):
        _style(a, "both")

    # target loss
    st = [(s["step"], s["loss"]) for s in t["steps"]]
    a1.plot(*zip(*st), color=TREE_COLOUR, lw=1.6, label="train (per batch, every 50 steps)")
    if t.get("val"):
        vs = [(v["step"], v["loss"]) for v in t["val"]]
        a1.plot(*zip(*vs), color=ACCENT, lw=1.6, ls=(0, (4, 2)), marker="o", ms=5, label="validation (held out)")
        a1.annotate(f"{vs[-1][1]:.2f}", vs[-1], xytext=(0, 7), textcoords="offset points", ha="center",
                    fontsize=7.5, color=ACCENT)
    a1.set_ylim(0, max(l for _, l in st + [(v["step"], v["loss"]) for v in t.get("val") or []]) * 1.05)
    _label(a1, "step", "cross-entropy (nats / token)",
           f"Target ({_millions(t.get('params'))} params): next-token loss")
    a1.legend(fontsize=8, frameon=False)

    # drafter loss
    sd = [(s["step"], s["loss"]) for s in d["steps"]]
    a2.plot(*zip(*sd), color=TREE_COLOUR, lw=1.6, label="train (position-weighted)")
    top = max(l for _, l in sd)
    for key in ("regen", "corpus"):
        pts = [(v["step"], v[key]["loss"]) for v in d.get("val", []) if key in v]
        if pts:
            a2.plot(*zip(*pts), lw=1.4, ls=(0, (4, 2)), ms=6, label=VAL_NAMES[key], **VAL_STYLE[key])
            top = max(top, *(l for _, l in pts))
    a2.set_ylim(0, top * 1.05)                  # every curve in view: a drafter trained on from another one's
    #                                             weights starts below its held-out losses
    _label(a2, "step", "block cross-entropy (nats / token)",
           f"DFlash drafter ({_millions(d.get('params'))} params): block loss")
    a2.legend(fontsize=8, frameon=False)

    # drafter accuracy vs step at a few positions
    steps = np.array([s["step"] for s in d["steps"]])
    acc = np.array([s["acc"] for s in d["steps"]], float)                       # [steps, block - 1]
    positions = [p for p in positions if 1 <= p <= acc.shape[1]]
    for j, p in enumerate(positions):
        a3.plot(steps, acc[:, p - 1], color=SERIES[j % len(SERIES)], lw=1.6, label=f"position {p}")
    a3.set_ylim(0, 1)
    a3.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    _label(a3, "step", "top-1 accuracy (training batches)", "Drafter accuracy by block position")
    a3.legend(fontsize=8, frameon=False, ncol=2, loc="best")     # a drafter trained on from another one's weights
    #                                                             starts high: its curves fill the top

    # accuracy per position at the end
    pos = np.arange(1, acc.shape[1] + 1)
    a4.plot(pos, acc[-1], color=TREE_COLOUR, lw=1.8, marker="o", ms=4.5,
            label=f"train, step {int(steps[-1])}")
    last = d["val"][-1] if d.get("val") else {}
    for key in ("regen", "corpus"):
        if key in last:
            ca = last[key].get("chain_accept")
            extra = f" (chain \u03c4 {ca:.2f})" if isinstance(ca, (int, float)) else ""
            a4.plot(pos, last[key]["acc"], lw=1.5, ls=(0, (4, 2)), ms=5.5, markerfacecolor="white",
                    label=VAL_NAMES[key] + extra, **VAL_STYLE[key])
    a4.set_ylim(0, 1)
    a4.set_xticks(pos)
    a4.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=0))
    when = f", step {last['step']}" if "step" in last else ""
    _label(a4, "block position (tokens after the root)", "top-1 accuracy",
           f"Drafter accuracy per position at the end{when}")
    a4.legend(fontsize=8, frameon=False, loc="upper right")
    save(fig, path)
    return fig
