"""End to end on a tiny model: tokens/s and target forwards per token, DDTree (oracle drafter at a few noise
levels, a single chain for comparison) against plain decoding, with the per-stage time split.

The oracle drafter runs the target itself, so "all stages" tokens/s includes a drafter as expensive as the
target; "target side" counts build + verify + accept + compact only (what a cheap real drafter would leave).

    PYTHONPATH=$PWD python3 benchmarks/bench_e2e.py
"""
from _common import args, kd, save, table

from kdtree_numba.decode.trace import STAGES  # noqa: E402

a = args(__doc__)
n_new = 256 if not a.quick else 24
target = kd.tiny_target(0)
prompt = list(b"DDTree drafts a whole tree of continuations, then the target checks them all at once. ")
kd.generate(target, prompt, 8)                                        # warm-up: compile every kernel
kd.generate(target, prompt, 8, drafter=kd.OracleDrafter(target, depth=8), budget=16)
ar = kd.generate(target, prompt, n_new)
rows = [["autoregressive", "", "1.00", f"{ar.forwards_per_token:.3f}", f"{ar.tokens_per_second:.0f}",
         f"{ar.tokens_per_second:.0f}", "1.00x", ""]]
for noise, budget, chain in [(0.0, 64, False), (0.5, 16, False), (0.5, 64, False), (0.5, 256, False),
                             (0.5, 8, True), (2.0, 64, False)]:
    res = kd.generate(target, prompt, n_new, drafter=kd.OracleDrafter(target, noise=noise, depth=8), chain=chain,
                      **({} if chain else dict(budget=budget)))
    assert res.tokens == ar.tokens
    st = res.stage_totals()
    target_ms = sum(v for k, v in st.items() if k != "draft")
    per_round = {k: v / len(res.rounds) for k, v in st.items()}
    side = len(res.tokens) / (target_ms / 1e3)
    rows.append([f"DDTree noise {noise}" + (" (chain)" if chain else ""), budget if not chain else "chain of 8",
                 f"{res.acceptance_length:.2f}", f"{res.forwards_per_token:.3f}", f"{res.tokens_per_second:.0f}",
                 f"{side:.0f}", f"{side / ar.tokens_per_second:.2f}x",
                 " / ".join(f"{per_round[k]:.2f}" for k in STAGES)])
table(f"End to end, tiny target ({kd.backend.name}), {n_new} new tokens, greedy (outputs identical to plain decoding)",
      ["method", "budget", "tau", "target fwd/token", "tokens/s (all)", "tokens/s (target side)",
       "target-side speedup", "ms per round: " + " / ".join(STAGES)], rows)
save("bench_e2e")
