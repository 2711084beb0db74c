"""Tutorial 16: the round on the device - decode state in device arrays, replayed as CUDA graphs, and the padded
prefill.

Run:  KDTREE_BACKEND=sim python tutorials/16_the_round_on_the_device.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 16 - The round on the device
#
# On a 9 M-parameter model every kernel does a few microseconds of work, and numba launches each one from Python
# (argument checks, a dispatcher lookup, a driver call). A decode step of the shipped target is a long list of such
# launches - numba kernels, cuBLAS GEMMs, CuPy element-wise operations - so the host sets the pace, not the GPU:
# measured on an H200 (docs/PERFORMANCE.md, 2026-12-01, `bench_replay.py`), a step launched directly took 11.0 ms and
# the same step replayed from a CUDA graph 0.835 ms.
#
# A **CUDA graph** records a stream's work once - every kernel with its grid, block and argument values, pointers
# included - and launches the whole recording with one call. What it records, it replays unchanged:
#
# * **fixed shapes**: every grid and every array size is the one of the capture;
# * **fixed addresses**: every array a kernel touches (temporaries too) must stay where it was;
# * **fixed scalars**: an `int start` passed to a kernel is baked into the graph.
#
# So everything that changes from step to step must live in **device arrays at fixed addresses** - the *state* -
# and the kernels read it there (`start[0]` instead of `start`). Nothing inside may read back to the host: a host
# read waits for the stream, and a capture cannot contain it. This tutorial:
#
# 1. one step on the kernels: the same launches, with the same grids, every step (a tiny model, simulated kernels);
# 2. plain decoding as a device program: `_StepProgram`, its state `tok / pos / step / out`, the kept program;
# 3. the DDTree round as six stage functions and an advance over the state `start / root / round`, one host read
#    per round, pipelined;
# 4. the prefill padded to a power-of-two bucket, and why the pad rows are never read (NaN-poisoned, with a check
#    that has teeth);
# 5. `CapturedStep`, the capture itself, and what it bought on an H200 (quoted from docs/PERFORMANCE.md).
#
# The code: `kdtree_numba/decode/replay.py`, `ddtree_replay.py`, `prefill_replay.py`, `capture.py` and
# `kernels/round_end.py`. Private names (`_StepProgram`, `_RoundProgram`, `_ResultReader`) are named with their file.

# %%
import contextlib
import math
import sys

import numpy as np

from _common import (banner, check, check_true, finish, heldout_prompts, host, load_pair, model_backend, parse_args,
                     save_figure, section, show_kernel, spy, stopwatch, table)

import kdtree_numba as kd
from kdtree_numba.decode import ddtree_replay, prefill_replay, replay
from kdtree_numba.decode.capture import CapturedStep
from kdtree_numba.decode.prefill_replay import Prefill
from kdtree_numba.kernels import gemm

args = parse_args(__doc__)
banner("Tutorial 16 - the round on the device", args)
LARGE = args.size == "large"
CUDA = kd.backend.process_name == "cuda"


@contextlib.contextmanager
def patched(owner, name, value):
    """Replace ``owner.name`` by ``value`` inside the block (a class's method, a module's function)."""
    old = getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)


class host_reads:
    """``with host_reads() as r: ...`` counts the calls of ``kd.backend.to_host`` (the package's device -> host
    copy) by the calling module: ``r.by["decode"]`` (the decode loops, ``kdtree_numba.decode``), ``r.by["kernels"]``
    (the stage functions) and ``r.by["other"]``. (The replayed round's result read on cuda is a CuPy copy on a
    stream of its own, not ``to_host``: section 3.)"""

    def __enter__(self):
        self.by = {"decode": 0, "kernels": 0, "other": 0}
        self._to_host = kd.backend.to_host

        def to_host(a):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            part = caller.split(".")[1] if caller.startswith("kdtree_numba.") else ""
            self.by[part if part in self.by else "other"] += 1
            return self._to_host(a)
        kd.backend.to_host = to_host
        return self

    def __exit__(self, *exc):
        kd.backend.to_host = self._to_host
        return False


section("what changes per step, and where it lives instead")
table([("the new token's position", "host int start -> kernel argument", "pos [1] (step) / start [1] (round)"),
       ("the token fed to the target", "host int", "tok [1] (step) / root [1] (round)"),
       ("the sampler's RNG stream (the position)", "host int", "pos [1] (step) / start [1] (round)"),
       ("temperature, seed", "host numbers", "sampler = (T [1] float64, seed [2] uint32)"),
       ("the emitted tokens", "read every step / round", "out [capacity] / result rows of the records"),
       ("the path the drafter observes", "m rows (1 .. L + 1)", "L + 1 rows (padded), n_acc [1] on the device"),
       ("prompt length n", "n rows", "padded to a bucket of 2^k rows, last [1] = n - 1")],
      ("changes per step", "direct code", "replayed code: a device array at a fixed address"))

# %% [markdown]
# ## 1. One step on the kernels: the same launches every step
#
# `replay._StepProgram` (decode/replay.py) is plain decoding written as one function, `_step`, that reads all of its
# inputs from device arrays and writes all of its outputs into device arrays:

# %%
section("1. the step function, from decode/replay.py")
show_kernel(replay._StepProgram._step)

# %% [markdown]
# `advance()` runs `_step`; on cuda, after the first (direct) run it captures `_step` as a graph and from then on
# only replays it. On the simulator we cannot capture, but we can check the property a capture relies on: with the
# state on the device, **every step makes exactly the same launches** - same kernels, same grids, same blocks -
# whatever the position. `spy()` records the numba kernel launches (name, grid, block); the GEMMs are counted
# separately (NumPy here, cuBLAS launches on a GPU). The model: `kd.tiny_target(0, num_hidden_layers=1)` on the
# process backend's kernels (the trained 5-layer pair would take minutes a forward on the simulator).
#
# On cuda the same cell shows the capture: the first `advance()` launches the step twice (directly, then under
# capture), and later ones launch no numba kernel at all - one graph launch replaces them.

# %%
section("1. one decode step on the kernels (tiny 1-layer model)")
if kd.backend.process_name == "numpy":
    print("skipped on the numpy backend: it has no kernel launches to count (run with KDTREE_BACKEND=sim or cuda)")
else:
    tiny = kd.tiny_target(0, num_hidden_layers=1)
    P = np.array([3, 17, 99, 5, 42], np.int32)                                         # [5] prompt
    gemms = [0]
    product = gemm._product                                  # kernels/gemm.py: every matmul / linear goes through it

    def counted_product(*a, **kw):
        gemms[0] += 1
        return product(*a, **kw)

    prog = replay._StepProgram(tiny, 256)                    # built by hand, not kept (replay.program keeps them)
    prog.begin(P, 0.0, 0)                                    # the padded prefill (section 4) and the first token
    steps = []
    for _ in range(3):
        gemms[0] = 0
        at = int(host(prog.pos)[0])                                  # the position this step writes
        with spy() as s, patched(gemm, "_product", counted_product), stopwatch() as ts:
            prog.advance()
        steps.append((at, s.launches, gemms[0], ts.ms))
    table([(i + 1, at, len(ls), g, f"{ms:.0f}") for i, (at, ls, g, ms) in enumerate(steps)],
          ("advance", "pos (the row it writes)", "numba launches", "GEMMs", "ms"))
    print("  kernels of the last step, in order (grid): "
          + " ".join(f"{k.strip('_')}{list(g) if isinstance(g, tuple) else [g]}" for k, g, _ in steps[-1][1]))
    launches = [ls for _, ls, _, _ in steps]
    n_step = len(launches[2]) if not CUDA else len(launches[0]) // 2
    if CUDA:
        first = launches[0]
        check_true("cuda: the first advance = the step, then the same step under capture",
                   n_step > 0 and first[:n_step] == first[n_step:], f"{len(first)} launches = 2 x {n_step}")
        check_true("cuda: later advances replay the graph (no numba launch)",
                   launches[1] == [] and launches[2] == [], f"{len(launches[1])}, {len(launches[2])} launches")
    else:
        check_true("three steps at three positions: identical launches (names, grids, blocks)",
                   len(launches[0]) > 0 and launches[0] == launches[1] == launches[2],
                   f"{n_step} numba launches + {steps[0][2]} GEMMs a step")
    want = kd.generate(tiny, P, 4).tokens                                              # direct: host ints
    check("the device-state steps emit the direct tokens (tiny, 4 tokens)", host(prog.out[:4]),
          np.array(want, np.int32))
    print("(the trained target has 5 layers, 4 of them MoE: ncu counted 178 kernels in one of its plain steps on "
          "an H200 - docs/PERFORMANCE.md, 2026-12-02, third session; later sessions removed some)")

# %% [markdown]
# ## 2. Plain decoding as a device program
#
# The state of `_StepProgram` (decode/replay.py), four device int32 arrays:
#
#     tok  [1]   the token fed to the target (the last emitted one, clamped to >= 0)
#     pos  [1]   its position = the cache row it writes (prompt length + tokens emitted - 1)
#     step [1]   tokens emitted so far = the row of `out` the next choice goes to
#     out  [capacity]   the emitted tokens (-1 where a row of logits held NaN)
#
# `begin(prompt, T, seed)` writes the sampler's settings into its device arrays, runs the prefill, whose follow-up
# `_first` chooses the first token into `out[0]` and `tok`, and sets `pos = len(prompt)`, `step = 1`. Each
# `advance()` then decodes one token. The host reads `out` once every `sync_every` (16) steps only, to find stop
# tokens and NaN.
#
# `replay.program(owner, key, make)` keeps the program on the model object (`target._programs`, the last four
# keys): its cache, its state and, on cuda, its graphs. `kd.generate(..., replay=True)` looks it up under
# `("step", capacity)` with `capacity = replay.capacity_for(prompt + new tokens)` (a power of two >= 256), so a later
# generation of a similar length reuses it - another prompt, temperature or seed included - as a server captures
# its graphs once at start-up. Here on the trained target (`model_backend()`: NumPy on the simulator), a held-out
# HumanEval prompt.

# %%
section("2. _StepProgram on the trained target: the state after each step")
target, drafter = load_pair()
tok = target.tokenizer
prompts = heldout_prompts()
task, task2 = prompts[8], prompts[14]
ids = np.array(tok.encode(task["prompt"]), np.int32)                                  # [112]
ids2 = np.array(tok.encode(task2["prompt"]), np.int32)                                # [64]
N_AR = 6
cap = replay.capacity_for(len(ids) + N_AR)
key = ("step", cap)
print(f"{task['task_id']}: {len(ids)} prompt tokens; program key {key}; model backend {target.backend}")
with kd.backend.use(target.backend):
    p = replay.program(target, key, lambda: replay._StepProgram(target, cap))
    p.begin(ids, 0.0, 0)
    rows, states = [], []
    for i in range(N_AR):
        if i:
            p.advance()
        t_, pos_, step_ = int(host(p.tok)[0]), int(host(p.pos)[0]), int(host(p.step)[0])
        out_ = host(p.out[:step_]).tolist()                                             # [step]
        states.append((t_, pos_, step_, out_))
        rows.append(("begin" if i == 0 else f"advance {i}", t_, repr(tok.token_text(t_)), pos_, step_, out_))
table(rows, ("after", "tok", "tok's text", "pos", "step", "out[:step]"))
want_ar = kd.generate(target, ids, N_AR).tokens                                        # direct decoding
check(f"out[:{N_AR}] == kd.generate(target, prompt, {N_AR}) (direct)", np.array(states[-1][3]),
      np.array(want_ar))
check_true(f"state invariants: pos = n + step - 1, tok = out[step - 1], step = 1 .. {N_AR}",
           all(ps == len(ids) + st - 1 and t_ == o[-1] and st == i + 1 for i, (t_, ps, st, o) in enumerate(states)))

section("2. the kept program serves the next generations")
N2 = 24 if not LARGE else 96
for prompt, T, seed in ((ids2, 0.0, 0), (ids, 0.8, 3)):
    with host_reads() as r:
        got = kd.generate(target, prompt, N2, temperature=T, seed=seed, replay=True)
    want = kd.generate(target, prompt, N2, temperature=T, seed=seed)
    check(f"replayed == direct ({len(prompt)}-token prompt, T {T}, seed {seed}, {N2} tokens)", np.array(got.tokens),
          np.array(want.tokens))
kept = target._programs.get(key)
check_true("the same _StepProgram object served all three generations", kept is p,
           f"target._programs keys {list(target._programs)}; prefill buckets {sorted(p.prefill.buckets)}")
reads_want = 1 + math.ceil((N2 - 1) / 16)
check_true(f"the loop read `out` {reads_want} times for {N2} tokens (once per 16 steps, not once per token)",
           r.by["decode"] == reads_want, f"decode-loop host reads {r.by['decode']}")

# %% [markdown]
# A graph reads the weights by address too. `Program.valid()` (decode/replay.py) compares the weight arrays the
# program captured with those the model holds now; replacing one (a reload, a fine-tune step) makes
# `replay.program` build a fresh program instead of replaying a graph that still reads the old array (which the
# program keeps alive, so the graph's addresses never point at freed memory).

# %%
section("2. a replaced weight array makes a fresh program")
target.w["lm_head"] = target.w["lm_head"].copy()              # same values, a new array (a new address on a GPU)
with kd.backend.use(target.backend):
    p_new = replay.program(target, key, lambda: replay._StepProgram(target, cap))
check_true("the old program is no longer valid, the new one is", (not p.valid()) and p_new.valid() and p_new is not p)

# %% [markdown]
# ## 3. The DDTree round as six stages and an advance over device state
#
# `_RoundProgram` (decode/ddtree_replay.py) splits the round of tutorial 11 into six stages and an advance; each reads
# the state `start [1]` (committed length = the root's cache row), `root [1]` (the last bonus token) and
# `round [1]` (from 1; the trace records go to row round - 1) on the device; the accept stage's draws are keyed by
# `start` (+ each node's depth), as plain decoding's by `pos`:
#
#     draft    logits = drafter.draft_at(root, start)                               [L, V]
#     topk     lp, ids = top-K of log_softmax(logits)                                [L, K]
#     build    the best-first tree of `budget` nodes (always budget + 1 verify rows)
#     verify   logits, hidden = target.forward([root, tree tokens], start, tree)     [budget + 1, V]
#     accept   accepted [L + 1], n_acc [1], result = [m, tokens .., bonus]           [L + 2]
#     compact  cache rows start + accepted[j] -> start + j, the padded path's (L + 1) feature rows gathered in the
#              same launch; the drafter observes them
#     advance  records at row round - 1; start += n_acc; root = result[m]; round += 1   (kernels/round_end.py)
#
# `root` has two homes, both written by the advance: the verify's first id (the tree's tokens follow it) and the
# drafter's block slot (`drafter.root_slot()`, what `draft_at` reads), so no stage copies it.
#
# On cuda the first round runs directly, then the whole round is captured as one graph (`CapturedStep`) and every
# later round replays it, the device clock stamped between the stages inside the graph (kernels/stamp.py: the trace's
# stage times); here the same stage functions run directly, so what follows tests the same bookkeeping. Only
# `result` (L + 2 int32) comes back to the host each round: the host emits its m tokens and checks stop tokens, NaN
# and the token limit.
#
# **Pipelined.** The direct loop (decode/ddtree.py) cannot launch round i + 1 before it has read round i's result:
# its launches take `start` and `root` as host values. The replayed loop can - `advance` already moved the state on
# the device - so it launches round i + 1 first and then reads round i's result (on cuda from its record, on a
# second stream that waits only for round i's end event), and the GPU runs round i + 1 while the host emits tokens.
# The prefill's token is read the same way: round 1 is launched behind the prefill first (R0 below). It stops
# launching ahead when round i could reach the token limit (fewer than L + 2 tokens to go), so no round is
# wasted without a stop token.

# %%
section("3. a replayed DDTree generation against the direct loop")
BUDGET = 16
N_DD = 48 if not LARGE else 128
kw = dict(drafter=drafter, budget=BUDGET)
with stopwatch() as t_direct:
    want_dd = kd.generate(target, ids, N_DD, **kw)
events = []
rounds_fn, read_fn = ddtree_replay._RoundProgram.rounds, ddtree_replay._ResultReader.__call__


def logged_rounds(self):
    for i, marks in enumerate(rounds_fn(self), 1):
        events.append(("launch", i))                        # round i's stages are launched (not yet read)
        yield marks


def logged_read(self, row, end):
    events.append(("read", sum(e == "read" for e, _ in events)))   # 0: the prefill's token, i: round i's result
    return read_fn(self, row, end)


with patched(ddtree_replay._RoundProgram, "rounds", logged_rounds), \
        patched(ddtree_replay._ResultReader, "__call__", logged_read), host_reads() as r_long, \
        stopwatch() as t_replay:
    got_dd = kd.generate(target, ids, N_DD, replay=True, **kw)
R = len(got_dd.rounds)
print(f"{task['task_id']}, budget {BUDGET}, {N_DD} tokens: {R} rounds, tau {got_dd.acceptance_length:.2f}; "
      f"direct {t_direct.ms:.0f} ms, replayed {t_replay.ms:.0f} ms on {target.backend} "
      f"(settings['replay'] = {got_dd.settings['replay']!r})")
L = drafter.depth
show = got_dd.rounds if LARGE else got_dd.rounds[:12]
table([(i + 1, r.start, repr(tok.token_text(r.root)), r.tree.n, r.accepted, len(r.accepted),
        [len(r.accepted)] + r.accepted_tokens + [r.bonus], repr(tok.decode(r.accepted_tokens + [r.bonus])))
       for i, r in enumerate(show)],
      ("round", "start", "root", "tree n", "accepted nodes", "m", "result [m, tokens.., bonus]", "emitted"))
check("replayed tokens == direct tokens", np.array(got_dd.tokens), np.array(want_dd.tokens))
check_true("every round equal to the direct loop's (start, root, accepted nodes, bonus)",
           [(r.start, r.root, r.accepted, r.bonus) for r in got_dd.rounds]
           == [(r.start, r.root, r.accepted, r.bonus) for r in want_dd.rounds], f"{R} rounds")
chain_ok = got_dd.rounds[0].start == len(ids) and all(
    b.start == a.start + len(a.accepted) and b.root == a.bonus for a, b in zip(got_dd.rounds, got_dd.rounds[1:]))
check_true("advance: start += m and root = bonus, round after round", chain_ok,
           f"start {got_dd.rounds[0].start} -> {got_dd.rounds[-1].start}")
check_true(f"fixed shapes: every tree has exactly budget = {BUDGET} nodes",
           all(r.tree.n == BUDGET for r in got_dd.rounds))

section("3. the pipeline: launches and result reads in order")
names = {"launch": "L", "read": "R"}
print("  " + " ".join(f"{names[e]}{i}" for e, i in events) + "      (Li: round i launched, Ri: its result read, "
      "R0: the prefill's token)")
order = {e: k for k, e in enumerate(events)}
ahead = [N_DD - (r.start - len(ids) + 1) > L + 1 for r in got_dd.rounds]       # launched ahead of round i's read?
check_true("round i + 1 is launched before round i is read exactly while > L + 1 tokens remain",
           all((order.get(("launch", i + 2), 1 << 30) < order[("read", i + 1)]) == ahead[i] for i in range(R)),
           f"{sum(ahead)} of {R} rounds read with the next one already launched")
check_true("round 1 is launched before the prefill's token is read", order[("launch", 1)] < order[("read", 0)])
check_true("one result read and one launch per round (no wasted round), and one read of the first token",
           sum(e == "read" for e, _ in events) == R + 1 and sum(e == "launch" for e, _ in events) == R)

# %% [markdown]
# **Counting host reads.** `host_reads` (above) counts `kd.backend.to_host` by calling module. On the NumPy and
# simulator backends the trained pair runs on the NumPy references, and a reference reads its device scalars
# (`start[0]`, the sampler's settings) with `to_host` - it is host code; on cuda the same modules launch kernels
# that read them on the device. So the number to look at is the decode loop's: compare two generation lengths, and
# each extra round must cost exactly one read of the decode loop (on cuda none: the round's read is
# `_ResultReader`'s copy on its own stream, not `to_host`).

# %%
section("3. host reads per round")
N_SHORT = 20
with patched(ddtree_replay._ResultReader, "__call__", logged_read), host_reads() as r_short:
    events.clear()
    short = kd.generate(target, ids, N_SHORT, replay=True, **kw)
R2 = len(short.rounds)
table([(f"{N_SHORT} tokens", R2, r_short.by["decode"], r_short.by["kernels"], r_short.by["other"]),
       (f"{N_DD} tokens", R, r_long.by["decode"], r_long.by["kernels"], r_long.by["other"]),
       ("per extra round", R - R2, f"{(r_long.by['decode'] - r_short.by['decode']) / (R - R2):.2f}",
        f"{(r_long.by['kernels'] - r_short.by['kernels']) / (R - R2):.2f}", "")],
      ("replayed generation", "rounds", "decode loop reads", "stage reads (references)", "other"))
check_true("_ResultReader called once per round and once for the first token",
           sum(e == "read" for e, _ in events) == R2 + 1, f"{R2} rounds")
per_round = r_long.by["decode"] - r_short.by["decode"]
if CUDA:
    check_true("cuda: no decode-loop to_host per round (the result row is _ResultReader's copy)", per_round == 0,
               f"{per_round} extra; stage reads {r_long.by['kernels']} (the first, direct round's and prefill's)")
else:
    check_true("each extra round costs the decode loop exactly one host read", per_round == R - R2,
               f"{per_round} reads for {R - R2} rounds")

# %% [markdown]
# ## 4. The prefill, padded to a bucket
#
# A graph replays fixed shapes, but prompts have any length. `prefill_replay.bucket(target, n)` pads an n-token
# prompt to the next power of two, at least `PREFILL_MIN` (8) rows; one graph per bucket:
#
#     ids  [Tb]  the prompt, then PAD (token 0) up to Tb
#     last [1]   n - 1: the one row whose logits are computed, read on the device (`forward(..., logits_at=last)`)
#
# Longer than `PREFILL_MAX` (1024) rows, or for a MoE target more than `moe_grouped_gemm.CUBLAS_ROWS` expert rows
# (Tb x top-k; above it the grouped GEMM reads the expert offsets on the host), the prompt prefills directly.
# Why the pad rows change nothing: attention is causal, so prompt row t sees rows 0 .. t and never a pad row; every
# other stage works row by row. Their cache rows n .. Tb - 1 hold garbage that nothing reads before it is
# overwritten - a decode step at position p writes row p, then attends to rows 0 .. p.

# %%
section("4. the bucket of an n-token prompt")
cfg = target.config
top_k = cfg.num_experts_per_tok if cfg.n_routed_experts > 0 else 0
sizes = (1, 5, 8, 9, 109, len(ids), 1024, 1025, 2000)
got_b = [prefill_replay.bucket(target, n) for n in sizes]
table([(n, "direct" if b is None else b, "-" if b is None else b - n) for n, b in zip(sizes, got_b)],
      ("prompt tokens n", "bucket rows Tb", "pad rows"))
print(f"PREFILL_MIN {prefill_replay.PREFILL_MIN}, PREFILL_MAX {prefill_replay.PREFILL_MAX}; this target: top-{top_k} "
      f"of {cfg.n_routed_experts} experts, CUBLAS_ROWS {kd.kernels.moe_grouped_gemm.CUBLAS_ROWS} -> at most "
      f"{kd.kernels.moe_grouped_gemm.CUBLAS_ROWS // max(top_k, 1)} rows")
rule = [max(8, 1 << (n - 1).bit_length()) if n <= 1024 else None for n in sizes]
check_true("bucket = max(8, next power of two), direct above 1024 rows", got_b == rule, str(got_b))

section("4. the padded forward vs a direct prefill")
feats = drafter.feature_layers
n = len(ids)
Tb = prefill_replay.bucket(target, n)
with kd.backend.use(target.backend):
    direct_cache = target.new_cache(256)
    want_lg, want_hid = target.forward(ids, direct_cache, 0, hidden_layers=feats, logits_to_keep=1)    # [1, V]
    # `then` obeys Prefill's contract: it copies into arrays allocated *before*, at fixed addresses. On cuda the
    # bucket's first prefill runs directly and is then captured - the capture calls `then` once more, and what it
    # does is recorded, not run: a `then` that made new arrays (lg.copy()) would leave empty capture buffers.
    got = {"logits": kd.backend.zeros((1, cfg.vocab_size)),                                  # [1, V]
           "hid": {k: kd.backend.zeros((Tb, cfg.hidden_size)) for k in feats}}              # [Tb, H] each

    def then(lg, hid, last):                                              # last: the row's position, n - 1
        got["rows"] = [hid[k].shape[0] for k in feats]                    # Python: the same at every call
        got["last"] = last                                                # (a device [1] array: its sampler's key)
        got["logits"][...] = lg
        for k in feats:
            got["hid"][k][...] = hid[k]

    pad_cache = target.new_cache(256)
    pre = Prefill(target, pad_cache, feats, then)
    pre(ids)                               # pads to Tb rows, then then(logits [1, V], hiddens [Tb rows], last)
captured = pre.buckets[Tb].run != pre.buckets[Tb].forward            # cuda: replayed from now on
print(f"{n} prompt tokens -> bucket {Tb}: buckets built {sorted(pre.buckets)}; hidden rows run {got['rows']} "
      f"(layers {list(feats)}); bucket captured as a graph: {captured}")
check("padded prefill logits (row n - 1) vs direct prefill", got["logits"], want_lg, atol=1e-4, rtol=1e-4)
check_true("same first token (argmax)", int(np.argmax(host(got["logits"]))) == int(np.argmax(host(want_lg))))
check_true(f"the padded forward ran all {Tb} rows", got["rows"] == [Tb] * len(feats), str(got["rows"]))
check_true("then() gets the logits row's position n - 1", int(host(got["last"])[0]) == n - 1)
check("prompt rows' features (the drafter's context) vs direct", np.stack([host(got["hid"][k])[:n] for k in feats]),
      np.stack([host(want_hid[k]) for k in feats]), atol=1e-4, rtol=1e-4)
check("prompt rows' cache rows, every layer, vs direct", host(pad_cache.data)[:, :n], host(direct_cache.data)[:, :n],
      atol=1e-4, rtol=1e-4)

# %% [markdown]
# **The pad rows are never read - tested.** Poison them: after the prefill set every cache row from n on to NaN
# (the pad rows and every later row), then decode. A read of any poisoned row before it is written would spread
# NaN into the logits, and a NaN row of logits makes the sampler emit -1. First by hand on a `_StepProgram` (its
# `begin` runs the prefill; we poison between `begin` and the first `advance`): rows >= n, then rows >= n - 1 (the
# last prompt row, which every step reads) to show the check has teeth.

# %%
section("4. NaN in every cache row past the prompt (plain decoding, by hand)")
N_P = 8


def poisoned_decode(first_nan_row):
    with kd.backend.use(target.backend):
        q = replay._StepProgram(target, 256)                      # a fresh program, not the kept one
        q.begin(ids, 0.0, 0)
        for i in range(cfg.num_hidden_layers):
            q.cache.layer(i)[first_nan_row:] = np.nan                                  # [256 - row, Lkv + R]
        for _ in range(N_P - 1):
            q.advance()
        return host(q.out[:N_P])                                                       # [N_P]


want_p = np.array(kd.generate(target, ids, N_P).tokens, np.int32)
clean_rows, bad_rows = poisoned_decode(n), poisoned_decode(n - 1)
table([("direct", "-", want_p.tolist()), (f"rows >= {n} NaN", 256 - n, clean_rows.tolist()),
       (f"rows >= {n - 1} NaN", 256 - n + 1, bad_rows.tolist())], ("run", "NaN rows / layer", "out[:8]"))
check(f"rows >= n ({n}: pad rows {n}..{Tb - 1} and beyond) NaN: the direct tokens", clean_rows, want_p)
check_true("teeth: row n - 1 NaN too -> every step after the prefill emits -1 (NaN logits)",
           bad_rows[0] == want_p[0] and (bad_rows[1:] == -1).all(), str(bad_rows.tolist()))

# %% [markdown]
# The same for DDTree and both caches, through `kd.generate`: `Prefill.__call__` is patched to poison, after each
# prefill, the target's cache rows >= n and the drafter's `_k` / `_v` rows >= n (as
# `test_rows_past_the_prompt_are_never_read` in tests/decode/test_prefill_replay.py does). The drafter observed
# the pad rows' features too - scratch, overwritten by the first draft's block before anything reads them. Then the
# teeth: the drafter's rows from n - 1 (its last context row); `kd.generate` raises on the NaN draft. (Host
# backends only: on cuda nothing checks the draft logits on the host.)

# %%
section("4. NaN past the prompt in both caches (DDTree, through kd.generate)")
run_prefill = Prefill.__call__


def poisoning(target_from, drafter_from):
    """Prefill.__call__, then NaN in the target's cache rows >= len(prompt) + target_from and the drafter's
    k / v rows >= len(prompt) + drafter_from."""
    def call(self, prompt):
        run_prefill(self, prompt)
        t0, d0 = len(prompt) + target_from, len(prompt) + drafter_from
        for i in range(cfg.num_hidden_layers):
            self.cache.layer(i)[t0:] = np.nan                                          # [capacity - t0, Lkv + R]
        if drafter._k is not None:
            drafter._k[:, d0:], drafter._v[:, d0:] = np.nan, np.nan                      # [layers, rows, Nkv, D]
    return call


N_Q = 24
want_q = kd.generate(target, ids, N_Q, **kw)
with patched(Prefill, "__call__", poisoning(0, 0)):
    got_q = kd.generate(target, ids, N_Q, replay=True, **kw)
check_true("both caches NaN from row n: DDTree tokens and rounds == direct",
           got_q.tokens == want_q.tokens and [r.accepted for r in got_q.rounds] == [r.accepted for r in want_q.rounds],
           f"{len(got_q.rounds)} rounds")
if CUDA:
    print("teeth for the drafter's cache: host backends only (on cuda nothing checks the draft logits on the host)")
else:
    raised = ""
    with patched(Prefill, "__call__", poisoning(0, -1)):
        try:
            kd.generate(target, ids, N_Q, replay=True, **kw)
        except ValueError as e:
            raised = str(e)
    check_true("teeth: the drafter's row n - 1 NaN -> the generation raises", raised != "", f"ValueError: {raised}")
again = kd.generate(target, ids, N_Q, replay=True, **kw)             # the kept program, unpoisoned prefill
check_true("the kept program decodes correctly again afterwards", again.tokens == want_q.tokens)

# %% [markdown]
# ## 5. The capture: `CapturedStep` (decode/capture.py)
#
# `CapturedStep(fn)` runs `fn` once under CuPy's stream capture on the backend stream. numba launches its kernels
# on that stream, and the GEMMs go to cuBLAS through `kernels/_cublas.py` on it too, so kernels, GEMMs and CuPy's
# own operations land in one graph. Two rules make a replay safe:
#
# * `fn` must have run **directly once** before: numba compiles a kernel at its first launch, and CuPy's pool
#   gets every block the step allocates;
# * whatever `fn` allocates during the capture comes from an allocator that **keeps every block** for the graph's
#   lifetime: the graph replays those addresses, so nothing else may ever be given them.
#
# `replay()` is then `graph.launch(stream)`: one launch for the whole step (or stage, or prefill bucket). A capture
# that fails (a host read inside `fn`, CuPy work on another stream) raises a `RuntimeError` that names the work and
# says to use `replay=False`; a prefill bucket whose capture fails warns and prefills directly.

# %%
section("5. CapturedStep.__init__, from decode/capture.py")
show_kernel(CapturedStep.__init__)

section("5. direct vs replayed on this machine")
if CUDA:
    rows = []
    N_T = 64 if not LARGE else 256
    for name, kw5 in (("plain decoding", {}), (f"DDTree {BUDGET}", kw),
                      ("DDTree 64", dict(drafter=drafter, budget=64))):
        kd.generate(target, ids, N_T, **kw5)                                      # compile every kernel
        kd.generate(target, ids, N_T, replay=True, **kw5)                         # build and capture the program
        with stopwatch() as td:
            d = kd.generate(target, ids, N_T, **kw5)
        with stopwatch() as tr:
            g = kd.generate(target, ids, N_T, replay=True, **kw5)
        rows.append((name, N_T, f"{td.ms:.1f}", f"{tr.ms:.1f}", f"{td.ms / tr.ms:.1f}x"))
        check_true(f"{name}: replayed tokens == direct, and faster", g.tokens == d.tokens and tr.ms < td.ms,
                   f"{td.ms:.1f} ms direct, {tr.ms:.1f} ms replayed")
    table(rows, ("method", "tokens", "direct ms", "replayed ms", "speedup"))
else:
    print(f"this cell times graphs: it needs KDTREE_BACKEND=cuda (this run: {kd.backend.process_name}; the trained "
          f"pair ran on {model_backend()}, where a step is NumPy work and nothing is launched)")

# %% [markdown]
# ## What it bought on an H200 (quoted from docs/PERFORMANCE.md, not measured here)
#
# * A plain decode step of the default target: 11.008 ms direct, 0.835 ms replayed, 13.2x (2026-12-01,
#   `bench_replay.py`, 256 greedy tokens); after later kernel work a replayed step was 0.405-0.409 ms
#   (2026-12-04, fourteenth session).
# * A DDTree-64 round: 17.94 ms direct, 2.41 ms replayed (2026-12-01, `bench_round.py`, the stage table below and
#   the picture; that run still had the v1 attention and an older tree build); replayed round / sum of its
#   kernels' device times 1.08x - the rest was the one host read and the seven graph launches of that day (one
#   graph a round since 2026-12-04: DDTree-32 6 % faster). The latest: a replayed DDTree-64 round of 0.939 ms on
#   `bench_round.py`'s prompt, its stages 0.819 ms by the device clock stamps - verify 0.563, draft 0.136, build
#   0.056 - and 7 us between two pipelined rounds (2026-12-04, nineteenth session).
# * The prefill: in a 63.2 ms replayed DDTree-64 generation of 128 tokens, 12.6 ms was `begin` - the direct
#   prefill of a 98-149 token prompt and the drafter's first observe (2026-12-03, eleventh session). That is why the
#   prefill is now replayed too (section 4; 2026-12-04, fifteenth session). Measured the next session
#   (`bench_replay.py`, time to the first token, best of 3): 0.59 / 0.84 / 1.22 ms for prompts of 16 / 100 / 400
#   tokens against 8.90 / 11.07 / 10.14 ms direct (15.0x / 13.2x / 8.3x).

# %%
section("quoted from docs/PERFORMANCE.md (H200, 2026-12-01, bench_round.py) - not measured here")
STAGE_NAMES = ("draft", "topk", "build", "verify", "accept", "compact")
quoted = {"direct": (17.94, 15.68, (2.935, 0.226, 0.166, 11.939, 0.303, 0.106)),
          "replayed": (2.41, 2.23, (0.591, 0.118, 0.107, 1.152, 0.014, 0.251))}
table([(k, wall, ssum) + st for k, (wall, ssum, st) in quoted.items()],
      ("DDTree 64", "wall ms/round", "stage sum") + STAGE_NAMES)
check_true("quoted stage times add up to the quoted stage sums (+-0.01 ms)",
           all(abs(sum(st) - ssum) <= 0.01 for _, ssum, st in quoted.values()))
check_true("quoted: replayed / direct wall 7.4x, replayed plain step 13.2x (1 %)",
           abs(17.94 / 2.41 - 7.44) < 0.075 and abs(11.008 / 0.835 - 13.2) < 0.13)

import matplotlib.pyplot as plt  # noqa: E402

fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw={"width_ratios": [1, 1.6]})
ns = np.arange(1, 1101)
bk = np.array([prefill_replay.bucket(target, int(k)) or 0 for k in ns])                 # [1100] 0 = direct
ax0.step(ns[bk > 0], bk[bk > 0], where="post", label="bucket rows Tb")
ax0.plot(ns[bk > 0], ns[bk > 0], "k:", lw=1, label="prompt rows n")
ax0.axvline(prefill_replay.PREFILL_MAX + 0.5, color="r", lw=1, ls="--", label="longer: direct prefill")
ax0.axvline(n, color="g", lw=1, label=f"{task['task_id']}: {n} -> {Tb}")
ax0.set_xlabel("prompt tokens n")
ax0.set_ylabel("rows the captured prefill runs")
ax0.set_title("prefill buckets (computed)", fontsize=9)
ax0.legend(fontsize=7)
colors = plt.get_cmap("tab10").colors
for y, (k, (wall, _, st)) in enumerate(quoted.items()):
    left = 0.0
    for j, (stage, v) in enumerate(zip(STAGE_NAMES, st)):
        ax1.barh(y, v, left=left, color=colors[j], label=stage if y == 0 else None)
        left += v
    ax1.text(left + 0.2, y, f"stages {left:.2f} ms, wall {wall:.2f} ms/round", va="center", fontsize=8)
ax1.set_yticks([0, 1])
ax1.set_yticklabels(list(quoted))
ax1.set_xlim(0, 24)
ax1.set_xlabel("ms per DDTree-64 round (H200, docs/PERFORMANCE.md, 2026-12-01)")
ax1.set_title("a round's stages, direct vs replayed (quoted)", fontsize=9)
ax1.legend(fontsize=7, ncol=3, loc="upper right")
save_figure(fig, args, "16_the_round_on_the_device.png")

# %%
finish()
