"""Where a DDTree round goes: per-stage device time of a graph-replayed round, and the round's wall time against
the sum of its stages' device times (how much host time is left between the graphs).

The trained default pair (target + DFlash drafter) on a held-out-style prompt, greedy. Per configuration two
replayed generations of n and 2n tokens; the steady-state wall time of a round is their difference divided by
their difference in rounds (``_common.steady_pair``: prefill and the first round cancel out, and neither pays a
capture).
Device time per stage: the mean over rounds 2.. of the device clock stamps the round takes between its stages
(``RoundTrace.times``; kernels/stamp.py).
What a generation pays outside its rounds, from the fastest of 3 n-token generations (both measured, not
differences of differences): "before the clock" is the wall clock around kd.generate less the generation's own
clock (``Generation.seconds``, which starts once the first token is read): the prefill and the first token's read;
"clock less device rounds" is the generation's clock less the device time of its rounds (the sum of their stage
stamps): the host gaps between rounds, the rounds launched one at a time near the token limit, the records'
copies at the end. (On the host backends, as in a --quick run, round 1 runs before the clock starts, so there the
first reads a round high and the second a round low.)
Direct (host-launched) rounds are not timed here: they cost 15-28 ms of host time a round, which varied between
the configurations of one run by more than the rounds differ (2026-12-05, H100: the n- / 2n-token difference came
out negative for two of five). bench_replay.py compares direct and replayed decoding.

    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/bench_round.py
    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/bench_round.py --budgets 32,36,40,44

On cuda a last table lists the kernel kernels/gemm_choice.py kept for each verify GEMM shape, with its candidates'
times.
``--budgets`` (default 16,32,64,256): the DDTree budgets, a row each; the DFlash chain is always the last row. The
second command showed why budgets 36 and 40 ran slower than 32 and 44: a second cuBLAS call for the rows
equal row blocks left, now overlapping blocks (docs/PERFORMANCE.md, fortieth session).
"""
import time

import numpy as np

from _common import args, gemm_choice_table, kd, save, steady_pair, table

from kdtree_numba.argtypes import whole_list  # noqa: E402
from kdtree_numba.decode.trace import STAGES  # noqa: E402

a = args(__doc__, lambda p: p.add_argument("--budgets", type=whole_list(1, 1024), default=[16, 32, 64, 256],
                                           help="DDTree budgets, comma-separated (default 16,32,64,256)"))
n = 128 if not a.quick else 6
target, drafter = kd.load_default()
prompt = target.tokenizer.encode('def running_mean(xs):\n    """Return the running mean of a list of numbers."""\n')


def measure(**kw):
    """(wall ms per round in steady state, mean device ms per stage, tau, ms before the clock, ms of the clock
    less its rounds' device time) of replayed generations (module docstring)."""
    def gen(m):
        return kd.generate(target, prompt, m, drafter=drafter, replay=True, **kw)

    g1, g2 = steady_pair(gen, n)
    wall = 1e3 * (g2.seconds - g1.seconds) / max(1, len(g2.rounds) - len(g1.rounds))
    stages = {s: float(np.mean([r.times[s] for r in g2.rounds[1:]])) for s in STAGES}
    runs = []
    for _ in range(3):
        t0 = time.perf_counter()
        g = gen(n)
        runs.append((1e3 * (time.perf_counter() - t0), g))
    whole, g = min(runs, key=lambda r: r[0])
    clock = 1e3 * g.seconds
    rounds = sum(sum(r.times.values()) for r in g.rounds)
    return wall, stages, g2.acceptance_length, whole - clock, clock - rounds


rows = []
for label, kw in [(f"DDTree, budget {b}", dict(budget=b)) for b in a.budgets] + [("DFlash chain", dict(chain=True))]:
    wall, st, tau, before, beyond = measure(**kw)
    dev = sum(st.values())
    rows.append([label, f"{tau:.2f}", f"{wall:.3f}", f"{dev:.3f}", f"{wall / dev:.2f}", f"{before:.2f}",
                 f"{beyond:.2f}"] + [f"{st[s]:.3f}" for s in STAGES])
table(f"One replayed DDTree round of the trained pair ({kd.backend.name}), greedy, steady state ({n} -> {2 * n} "
      "tokens)", ["method", "tau", "wall ms/round", "stage sum ms", "wall / stage sum",
                  f"before the clock ms ({n} tok)", "clock less device rounds ms"] + [f"{s} ms" for s in STAGES], rows)
gemm_choice_table()
save("bench_round")
