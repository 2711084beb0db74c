"""Where a DDTree round goes: per-stage device time of a graph-replayed round, and the round's wall time against
the sum of its stages' device times (how much host time is left between the graphs).

The trained default pair (target + DFlash drafter) on a held-out-style prompt, greedy. Per configuration two
replayed generations of n and 2n tokens; the steady-state wall time of a round is their difference divided by
their difference in rounds (``_common.steady_pair``: prefill and the first round cancel out, and neither pays a
capture).
Device time per stage: the mean over rounds 2.. of the device clock stamps the round takes between its stages
(``RoundTrace.times``; kernels/stamp.py).
Direct (un-captured) rounds of the same configuration are timed the same way, in the same run.
"Outside rounds": an n-token generation's wall clock (prefill included, the fastest of 3) less its rounds at the
steady round time - what a generation pays once (the prefill, the first token's read, the rounds launched one at a
time near the token limit, the records' copies at the end).

    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/bench_round.py
"""
import numpy as np

from _common import args, host_best_ms, kd, save, steady_pair, table

from kdtree_numba.decode.trace import STAGES  # noqa: E402

a = args(__doc__)
n = 128 if not a.quick else 6
target, drafter = kd.load_default()
prompt = target.tokenizer.encode('def running_mean(xs):\n    """Return the running mean of a list of numbers."""\n')


def steady(replay: bool, **kw):
    """(wall ms per round in steady state, mean device ms per stage, tau, ms of an n-token generation outside its
    rounds: its wall clock around kd.generate - prefill included, the fastest of 3 - less its rounds at the steady
    round time: the prefill, the first token's read, the rounds launched one at a time near the limit, the end)."""
    def gen(m):
        return kd.generate(target, prompt, m, drafter=drafter, replay=replay, **kw)

    g1, g2 = steady_pair(gen, n)
    wall = 1e3 * (g2.seconds - g1.seconds) / max(1, len(g2.rounds) - len(g1.rounds))
    stages = {s: float(np.mean([r.times[s] for r in g2.rounds[1:]])) for s in STAGES}
    whole = host_best_ms(lambda: gen(n), reps=3)
    return wall, stages, g2.acceptance_length, whole - len(g1.rounds) * wall


rows = []
for label, kw in [("DDTree, budget 16", dict(budget=16)), ("DDTree, budget 32", dict(budget=32)),
                  ("DDTree, budget 64", dict(budget=64)),
                  ("DDTree, budget 256", dict(budget=256)), ("DFlash chain", dict(chain=True))]:
    for replay in (False, True):
        wall, st, tau, outside = steady(replay, **kw)
        dev = sum(st.values())
        rows.append([label, "replayed" if replay else "direct", f"{tau:.2f}", f"{wall:.3f}", f"{dev:.3f}",
                     f"{wall / dev:.2f}", f"{outside:.2f}"] + [f"{st[s]:.3f}" for s in STAGES])
table(f"One DDTree round of the trained pair ({kd.backend.name}), greedy, steady state ({n} -> {2 * n} tokens)",
      ["method", "rounds", "tau", "wall ms/round", "stage sum ms", "wall / stage sum", f"outside rounds ms ({n} tok)"] +
      [f"{s} ms" for s in STAGES], rows)
save("bench_round")
