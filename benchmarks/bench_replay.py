"""Graph-replayed plain decoding against direct launches, same process: ms per decode step and the ratio.

Direct: every step launches its kernels from Python (178 a step of the default target by ncu, 2026-12-02:
numba's host launch cost) and reads the chosen token.
Replayed: one step captured as a CUDA graph with its state on the device (decode/replay.py), replayed; the host
reads the tokens once per 16 steps. Both timed by ``Generation.seconds`` (wall time after the prefill; after a
warm-up run); the outputs are asserted identical. Models: kd.tiny_target(0) and the shipped default target.
Second table, the prefill (time to the first token: ``kd.generate(..., 1)``, wall clock, median of 7 after
warm-ups) of the default target at three prompt lengths: direct launches against the replay program's prefill,
padded to its power-of-two bucket and replayed from a graph (decode/prefill_replay.py); first tokens asserted
identical.

    PYTHONPATH=$PWD python3 benchmarks/bench_replay.py
"""
from _common import args, kd, median_ms, save, table

a = args(__doc__)
n_new = 256 if not a.quick else 12
rows = []
for name, target in [("tiny (3 layers, hidden 64)", kd.tiny_target(0)), ("default target (5 layers, hidden 256)",
                                                                        kd.load_default()[0])]:
    prompt = [(7 * i + 3) % 200 for i in range(16)]
    for replay in (False, True):
        kd.generate(target, prompt, 20, replay=replay)                     # warm-up: compile, capture once
    best = {}
    for replay in (False, True):
        runs = [kd.generate(target, prompt, n_new, replay=replay) for _ in range(3)]
        assert all(r.tokens == runs[0].tokens for r in runs)
        best[replay] = min(runs, key=lambda r: r.seconds)
    assert best[True].tokens == best[False].tokens
    d, r = (1e3 * best[k].seconds / len(best[k].tokens) for k in (False, True))
    rows.append([name, n_new, f"{d:.3f}", f"{r:.3f}", f"{d / r:.1f}x", f"{1e3 / d:.0f}", f"{1e3 / r:.0f}"])
table(f"Plain decoding, direct launches vs CUDA-graph replay ({kd.backend.name}), greedy, best of 3, identical "
      f"tokens", ["model", "new tokens", "direct ms/token", "replayed ms/token", "speedup", "direct tokens/s",
                  "replayed tokens/s"], rows)

target = kd.load_default()[0]
rows = []
for n in ((16, 100, 400) if not a.quick else (16,)):
    prompt = [(7 * i + 3) % 200 for i in range(n)]
    first = {replay: kd.generate(target, prompt, 1, replay=replay).tokens for replay in (False, True)}
    assert first[True] == first[False]
    ms = {replay: median_ms(lambda: kd.generate(target, prompt, 1, replay=replay), reps=7, warmup=2)
          for replay in (False, True)}
    rows.append([n, kd.decode.prefill_replay.bucket(target, n) or "- (direct)", f"{ms[False]:.2f}",
                 f"{ms[True]:.2f}", f"{ms[False] / ms[True]:.1f}x"])
table(f"Prefill of the default target (time to the first token), direct vs padded + replayed ({kd.backend.name})",
      ["prompt tokens", "bucket rows", "direct ms", "replayed ms", "speedup"], rows)
save("bench_replay")
