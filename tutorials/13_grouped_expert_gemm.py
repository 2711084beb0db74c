"""Tutorial 13: the grouped expert GEMM - every expert's rows in one launch, no host read.

Run:  KDTREE_BACKEND=sim python tutorials/13_grouped_expert_gemm.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 13 - The grouped expert GEMM
#
# After routing (tutorial 04) a MoE layer has T*k assignments. `group_by_expert` sorts them expert-major, the model
# gathers the token rows in that order into `xs [N, Kdim]` (N = T*k), and expert e's rows are the contiguous slice
# `offsets[e]:offsets[e+1]`. Every expert then multiplies its own rows by its own weight:
#
#     out[offsets[e]:offsets[e+1]] = xs[offsets[e]:offsets[e+1]] @ W[e].T        for every expert e
#
# with `W [E, M, Kdim]` in HF's `[out, in]` layout (the model's `experts_gu [E, 2I, H]` and `experts_down [E, H, I]`).
#
# **Why the counts stay on the device.** The obvious code reads `offsets` on the host and runs one GEMM per expert
# with rows. But `offsets` is computed on the GPU; reading it back waits for every kernel queued before it (a
# stream sync once per MoE layer: 60 times a forward on Kimi K2), and a host read cannot be captured in a CUDA
# graph, so a whole decode round could never be replayed as one graph.
#
# **The fused-MoE design** (as in serving engines): the grid is sized from *shapes* alone (N, E, M), never from
# the counts. Every block finds its own work on the device: a tiny kernel writes a table of row tiles per expert,
# and each block looks its expert up in that table. Blocks with nothing to do exit at once. The module is
# `kdtree_numba/kernels/moe_grouped_gemm.py`.

# %%
import numpy as np

from _common import (banner, check, check_true, draw_owners, finish, host, parse_args, rng, save_figure, section,
                     show_kernel, stopwatch, table)

import kdtree_numba as kd
from kdtree_numba.kernels import moe_grouped_gemm as mg
from kdtree_numba.kernels import moe_routing, swiglu

args = parse_args(__doc__)
banner("Tutorial 13 - the grouped expert GEMM", args)
R = rng(args, 13)
LARGE = args.size == "large"
KERNELS = kd.backend.name != "numpy"          # False: every call below runs the reference
TM, TN, TK, THREADS = mg.TM, mg.TN, mg.TK, mg.THREADS
print(f"tiles on this backend: TM {TM} rows, TN {TN} columns, TK {TK} of Kdim per step, {THREADS} threads per "
      f"block (GPU: 16, 64, 32, 256; simulator: 4, 16, 16, 32)")


def offsets_of(counts):
    off = np.zeros(len(counts) + 1, np.int32)                                  # [E+1]
    off[1:] = np.cumsum(counts)
    return off


def problem(counts, K, M):
    off = offsets_of(counts)                                                   # [E+1]
    xs = R.standard_normal((int(off[-1]), K)).astype(np.float32)               # [N, K]
    W = R.standard_normal((len(counts), M, K)).astype(np.float32)              # [E, M, K]
    return xs, W, off


def expert_of_rows(off):
    """Row n's expert: the e with off[e] <= n < off[e+1]."""
    return np.searchsorted(off, np.arange(off[-1]), side="right") - 1          # [N]


def tile_work(tiles, off, tile):
    """_block_work in Python: (expert, first row, rows) of global row tile ``tile`` < tiles[E]."""
    e = int(np.searchsorted(tiles, tile, side="right")) - 1                    # tiles[e] <= tile < tiles[e+1]
    row0 = int(off[e] + (tile - tiles[e]) * TM)
    return e, row0, min(TM, int(off[e + 1]) - row0)


class spy:
    """``with spy() as s: ...`` records the kernel launches (name, grid, block) and the host reads (to_host) made
    inside the block, by wrapping kd.backend.launch and kd.backend.to_host for its duration."""

    def __enter__(self):
        self.launches, self.host_reads = [], 0
        self._launch, self._to_host = kd.backend.launch, kd.backend.to_host

        def launch(kernel, grid, block, *a, **kw):
            fn = getattr(kernel, "py_func", None) or getattr(kernel, "fn", None) or kernel
            self.launches.append((fn.__name__, grid, block))
            return self._launch(kernel, grid, block, *a, **kw)

        def to_host(a):
            self.host_reads += 1
            return self._to_host(a)
        kd.backend.launch, kd.backend.to_host = launch, to_host
        return self

    def __exit__(self, *exc):
        kd.backend.launch, kd.backend.to_host = self._launch, self._to_host
        return False


# %% [markdown]
# ## 1. The reference
#
# `grouped_linear_ref` runs one NumPy GEMM per expert with rows. Next to it, the plainest form: a loop over the
# rows, each multiplied by its own expert's weight in float64. First the module docstring's example: three
# experts, expert 1 empty.

# %%
section("reference")
ex_xs = np.array([[1, 2], [3, 4], [5, 6]], np.float32)                         # [N 3, K 2]
ex_W = np.zeros((3, 1, 2), np.float32)                                         # [E 3, M 1, K 2]
ex_W[0] = [[1, 0]]
ex_W[1] = [[7, 7]]                                                             # expert 1 has no rows: never used
ex_W[2] = [[0, 2]]
ex_off = np.array([0, 2, 2, 3], np.int32)                                      # [E+1]
print(f"offsets {ex_off.tolist()}: rows 0-1 -> expert 0, expert 1 empty, row 2 -> expert 2")
check("docstring example -> [[1], [3], [12]]", mg.grouped_linear_ref(ex_xs, ex_W, ex_off),
      np.array([[1], [3], [12]], np.float32), atol=0, rtol=0)
check("docstring example, the kernel (default variant)", mg.grouped_linear(ex_xs, ex_W, ex_off),
      np.array([[1], [3], [12]], np.float32), atol=0, rtol=0)
check("docstring example: tiles with TM = 16 -> [0, 1, 1, 2]", mg.tile_table_ref(ex_off, 16),
      np.array([0, 1, 1, 2], np.int32))

xs, W, off = problem([5, 0, 17, 1, 0, 40] if not LARGE else [50, 0, 170, 1, 0, 400], 29, 13)
loop = np.empty((xs.shape[0], W.shape[1]))                                     # [N, M] float64
for n, e in enumerate(expert_of_rows(off)):
    loop[n] = W[e].astype(np.float64) @ xs[n].astype(np.float64)
check("grouped_linear_ref == a per-row loop (float64)", mg.grouped_linear_ref(xs, W, off), loop,
      atol=1e-5, rtol=1e-5)

# %% [markdown]
# ## 2. The tile table: which block owns which rows
#
# Expert e's rows split into `ceil(count[e] / TM)` row tiles of TM rows (the last one may be short). An exclusive
# prefix sum numbers them globally:
#
#     tiles[0] = 0,   tiles[e+1] = tiles[e] + ceil(count[e] / TM)         tiles [E+1]
#
# so expert e owns the global row tiles `tiles[e] .. tiles[e+1]-1`, `tiles[E]` in all. An empty expert owns none.
# Kernel `_tile_table_kernel`: **one warp**; lane l takes expert `base + l` of each chunk of 32 experts, a warp
# prefix sum places its tiles, and a running total carries over from chunk to chunk.
#
# The grid cannot wait for `tiles[E]` (that is a host read again), so it uses a bound from shapes only:
#
#     sum_e ceil(c_e / TM) <= sum_e (floor(c_e / TM) + [c_e > 0]) <= N // TM + min(E, N),   and also <= N
#
# `row_tile_bound(N, E)`. Each block (`_block_work`): global row tile `blockIdx.x`; if it is `>= tiles[E]`, exit;
# else a binary search over `tiles` (`_find_expert`) gives its expert e, its rows start at
# `offsets[e] + (blockIdx.x - tiles[e]) * TM` and stop at `offsets[e+1]`; `blockIdx.y` picks TN output columns.

# %%
section("the tile table, a worked example")
ex_counts = [5, 0, 9, 1, 0, 2]                                                 # E 6, N 17: two empty experts
ex_off = offsets_of(ex_counts)                                                 # [E+1]
ex_tiles = host(mg.tile_table(ex_off))                                         # [E+1]
N_ex, E_ex = int(ex_off[-1]), len(ex_counts)
bound = mg.row_tile_bound(N_ex, E_ex)
rows = []
for e, c in enumerate(ex_counts):
    spans = []
    for tile in range(ex_tiles[e], ex_tiles[e + 1]):                           # expert e's global row tiles
        first = ex_off[e] + (tile - ex_tiles[e]) * TM
        spans.append(f"{tile}: rows {first}-{min(first + TM, ex_off[e + 1]) - 1}")
    rows.append((e, c, ex_off[e], -(-c // TM), ex_tiles[e], "; ".join(spans) if spans else "(none)"))
table(rows, ("expert", "count", "offsets[e]", f"ceil(c/{TM})", "tiles[e]", "its row tiles: rows"))
print(f"tiles = {ex_tiles.tolist()}: {ex_tiles[-1]} row tiles; row_tile_bound(N={N_ex}, E={E_ex}) = "
      f"min({N_ex}, {N_ex // TM} + {min(E_ex, N_ex)}) = {bound} blocks per column tile "
      f"({bound - ex_tiles[-1]} exit at once)")
plain = [0]
for c in ex_counts:                                                            # plain Python: the running sum
    plain.append(plain[-1] + (c + TM - 1) // TM)
check("tile_table kernel == running sum of ceil(count/TM) (worked example)", ex_tiles, np.array(plain, np.int32))
check_true("row_tile_bound >= the real row tiles (worked example)", bound >= ex_tiles[-1],
           f"{bound} >= {ex_tiles[-1]}")

section("the tile table at 70 experts (three chunks of 32 lanes)")
counts70 = R.integers(0, 3 * TM, 70)                                           # [70]
counts70[[0, 31, 32, 69]] = 0                                                  # empty at the chunk edges
off70 = offsets_of(counts70)                                                   # [71]
with stopwatch() as t:
    tiles70 = host(mg.tile_table(off70))                                       # [71]
print(f"_tile_table_kernel[grid=1, block=32]: {t.ms:.1f} ms")
check("tile_table kernel vs tile_table_ref (70 experts)", tiles70, mg.tile_table_ref(off70))
check_true("tiles[E] == sum of ceil(count/TM), row_tile_bound >= it",
           tiles70[-1] == sum((int(c) + TM - 1) // TM for c in counts70)
           and tiles70[-1] <= mg.row_tile_bound(int(off70[-1]), 70), f"{tiles70[-1]} tiles, bound "
           f"{mg.row_tile_bound(int(off70[-1]), 70)}")
worst = 0                                                                      # how tight the bound is
for _ in range(300):
    E_r, N_r = int(R.integers(1, 40)), int(R.integers(0, 300))
    c_r = R.multinomial(N_r, R.dirichlet(np.full(E_r, 0.3)))
    need, have = int(mg.tile_table_ref(offsets_of(c_r))[-1]), mg.row_tile_bound(N_r, E_r)
    worst = min(worst, have - need)
check_true("row_tile_bound >= the real row tiles on 300 random splits", worst >= 0, f"min slack {worst}")

# %% [markdown]
# The picture: the output `out [N, M]` of the worked example with M = 21, each element numbered by the block
# (`blockIdx.x`, the global row tile) that writes it. The dashed line splits the TN-wide column tiles
# (`blockIdx.y`). Computed by replaying `_block_work`'s arithmetic in Python for every block of the grid; the
# check: every element is written by exactly one block, and that block's expert is the row's expert.

# %%
section("who writes what")
M_ex = 21
col_tiles = -(-M_ex // TN)
owner = np.full((N_ex, M_ex), -1)                                              # [N, M] row tile that writes it
writes = np.zeros((N_ex, M_ex), int)                                           # [N, M] how many blocks write it
block_expert = np.full((N_ex, M_ex), -1)                                       # [N, M] the writing block's expert
for bx in range(bound):                                                        # blockIdx.x
    for by in range(col_tiles):                                                # blockIdx.y
        if bx >= ex_tiles[E_ex]:
            continue                                                           # past the last row tile: exit
        e, row0, nrows = tile_work(ex_tiles, ex_off, bx)
        cols = slice(by * TN, min((by + 1) * TN, M_ex))
        owner[row0:row0 + nrows, cols] = bx
        writes[row0:row0 + nrows, cols] += 1
        block_expert[row0:row0 + nrows, cols] = e
check_true("every output element written by exactly one block", np.all(writes == 1),
           f"{int(np.sum(writes == 1))}/{writes.size}")
check("each row's block works for the row's expert", block_expert,
      np.repeat(expert_of_rows(ex_off)[:, None], M_ex, axis=1))
fig = draw_owners(owner, f"grouped GEMM, counts {ex_counts}: the row tile (blockIdx.x) writing each element of "
                  f"out\nTM = {TM}, TN = {TN} (dashed: column tiles, blockIdx.y); blocks {ex_tiles[-1]}..{bound - 1} "
                  f"of the grid exit at once",
                  "output column", "row of xs / out",
                  [f"{n}: expert {e}" for n, e in enumerate(expert_of_rows(ex_off))])
for c in range(TN, M_ex, TN):
    fig.axes[0].axvline(c - 0.5, color="k", ls="--", lw=1)
save_figure(fig, args, "13_grouped_gemm_blocks.png")

# %% [markdown]
# ## 3. Four kernels, one row-tile grid
#
# v1-v3 use the grid above (`row_tile_bound(N, E)` x `ceil(M / TN)` blocks of THREADS threads) and the same
# `_block_work`; they differ in how a block's threads compute its TM x TN tile of `out`. v4 keeps the row tiles
# and the tile search but has its own block (warps, no shared memory), so its column tiles are `SK_COLS` wide.
#
# * **v1 `_grouped_gemm_kernel`: shared tiles.** The block walks Kdim in steps of TK. Each step every thread loads
#   2 elements of the xs tile `[TM, TK]` and 8 of the W[e] tile `[TN, TK]` (element `i*THREADS + t`, row-major:
#   consecutive threads read consecutive k, so the loads coalesce) into ten named registers, stores them into
#   shared `xa` / `wb` (one padding column: no bank conflicts), a barrier, then thread `t` (row `t // TN`,
#   column `t % TN`) accumulates its rows `tr, tr + THREADS/TN, ...` of column `tc`; a second barrier. Rows past
#   the expert's end are skipped warp by warp, so a decode step does not multiply padding.
# * **v2 `_grouped_gemm_v2_kernel`: prefetch.** Same tiles, but right after the barrier each thread issues the
#   *next* step's ten loads into its registers, then multiplies this step's tiles: the block's loads overlap its
#   own compute. The launcher's default above decode-sized rows.
# * **v3 `_grouped_gemv_kernel`: the decode GEMV.** At decode most experts get one row or none, so the "GEMM" is a
#   GEMV that streams W[e]. No shared tiles, no barriers: warp w owns `TN / warps` output columns and takes them
#   one at a time; its 32 lanes stream that column's W row (lane l reads `k = l, l + 32, ...`: 128-byte loads),
#   **8 loads in flight** per lane (`_load8`, one step covers `GEMV_STEP = 256` of Kdim), the rest of Kdim one
#   load at a time, then a butterfly **warp sum** and lane 0 stores `out[r, c]`. A second row of the tile re-reads
#   the W row from L1/L2.
# * **v4 `_grouped_skinny_kernel`: skinny patches.** A tree verify gives each expert ~16 rows: too many for the
#   GEMV, too few for v2's shared tiles to repay a barrier pair per K step. v4 gives each warp an RW x CW = 8 x 4
#   patch of one row tile (`skinny_gemm.patch_sum`: K across the lanes, a reduce-scatter of the 32 sums, no shared
#   memory, no barrier); ceil(TM / RW) warps cover a tile's rows, a block's other warps further columns, so a block
#   covers `SK_COLS` columns. It pays only for short K (the default pair's H 256, I 192), not Kimi's 7168.
#
# The v3 kernel on the page (printed from the package):

# %%
section("the kernel on the page: v3, the grouped GEMV")
show_kernel(mg._grouped_gemv_kernel)
check_true("the text's constants match the code",
           mg.GEMV_STEP == 256 and mg.GEMV_UNROLL == 8 and mg.GEMV_ROWS_PER_EXPERT == 4
           and TM * TK == 2 * THREADS and TN * TK == 8 * THREADS,
           f"GEMV_STEP {mg.GEMV_STEP}, {mg.GEMV_UNROLL} loads in flight; 2 xs + 8 W loads per thread and step")

# %% [markdown]
# Which k of one W row each lane reads in v3, at Kdim = 296 = one unrolled step of 256 + a tail of 40: the
# unrolled loop gives every lane 8 loads (`k = l + 32 j`, j < 8); the tail loop `k = 256 + l, 256 + l + 32`
# gives lanes 0-7 two more loads and lanes 8-31 one. Replayed in Python: every k is read exactly once.

# %%
section("v3: one warp over a W row of Kdim 296")
K296 = 296
k_main = K296 - K296 % mg.GEMV_STEP
reads = np.zeros(K296, int)                                                    # [K] times each k is read
lane_rows = []
for lane in range(32):
    unrolled = [k + 32 * j for k in range(lane, k_main, mg.GEMV_STEP) for j in range(mg.GEMV_UNROLL)]
    tail = list(range(k_main + lane, K296, 32))
    np.add.at(reads, unrolled + tail, 1)
    if lane in (0, 1, 7, 8, 31):
        lane_rows.append((lane, f"{unrolled[0]}, {unrolled[1]}, .., {unrolled[-1]}", ", ".join(map(str, tail))))
table(lane_rows, ("lane", "unrolled step (8 loads in flight)", "tail (one at a time)"))
check_true("every k of the W row read exactly once by the warp", np.all(reads == 1), f"Kdim {K296}, k_main {k_main}")

# %% [markdown]
# ## 4. Run all four against the reference
#
# Irregular small shapes (on the simulator TM = 4, TN = 16): empty experts, an expert over several row tiles,
# one expert with every row, Kdim past one GEMV step, M not a multiple of TN. The output is filled with NaN
# first: a row no block writes stays NaN and fails the comparison.

# %%
section("kernels vs reference")
if LARGE:
    CASES = [("empty experts, rows over many row tiles", [37, 0, 70, 1, 0, 17], 1031, 333),
             ("one expert has every row", [0, 0, 300, 0], 520, 130),
             ("Kdim 296 = one GEMV step + 40", [2, 0, 1], K296, 200),
             ("decode: 8 rows over 64 experts", list(np.bincount(R.choice(64, 8, replace=False), minlength=64)),
              1024, 512)]
else:
    CASES = [("empty experts, one over 3 row tiles, M 5", [1, 0, 9, 0, 1], 37, 5),
             ("one expert has every row, M 17 = 2 column tiles", [0, 0, 5, 0], 20, 17),
             ("Kdim 296 = one GEMV step + 40, M 9", [1, 0, 1], K296, 9)]
timing = []
for c_i, (name, counts, K, M) in enumerate(CASES):
    xs, W, off = problem(counts, K, M)
    want = mg.grouped_linear_ref(xs, W, off)                                   # [N, M]
    scale = float(np.abs(want).max())
    N, E = xs.shape[0], len(counts)
    shown = counts if len(counts) <= 8 else f"{len(counts)} experts"
    print(f"\ncase {c_i + 1}, {name}: counts {shown}, N {N}, Kdim {K}, M {M}; "
          f"grid ({mg.row_tile_bound(N, E)}, {-(-M // TN)}) x {THREADS} threads{'' if KERNELS else ' (not launched)'}")
    for v in (1, 2, 3, 4):
        out = kd.backend.full((N, M), np.nan, np.float32)                      # [N, M] poisoned
        with stopwatch() as t:
            mg.grouped_linear(xs, W, off, out=out, variant=v)
        timing.append((f"{c_i + 1}: {name.split(',')[0]}", f"v{v}", f"{t.ms:.0f}"))
        check(f"case {c_i + 1}: v{v} vs grouped_linear_ref (NaN-poisoned out)", out, want, atol=1e-5 * scale, rtol=1e-5)

if KERNELS:
    section("what the launcher does: one launch for the table, one per GEMM, no host read")
    M_s = 5
    xs, W, off = problem(ex_counts, 8, M_s)                                    # the worked example's rows
    v_s = mg.default_variant(N_ex, E_ex, 8)                                     # 4: few rows, short K
    cols = mg.SK_COLS if v_s == 4 else TN                                      # v4's blocks are warps of patches
    with spy() as s:
        out = mg.grouped_linear(xs, W, off)                                    # [N, M] default variant
    for name, grid, block in s.launches:
        print(f"  launched {name}[grid={grid}, block={block}]")
    check_true(f"grid from shapes (default v{v_s}): (row_tile_bound(N, E), ceil(M / {cols})); nothing read on the "
               "host", s.launches[-1][1] == (mg.row_tile_bound(N_ex, E_ex), -(-M_s // cols)) and s.host_reads == 0,
               f"{len(s.launches)} launches, {s.host_reads} host reads")
    check("default-variant launch vs grouped_linear_ref", out, mg.grouped_linear_ref(xs, W, off), atol=1e-5,
          rtol=1e-5)

    # what the bound is for: a grid of N // TM row tiles (as if no expert had a partial tile) misses rows
    xs_d, W_d, off_d = (kd.backend.asarray(a) for a in (xs, W, off))          # on the device (cuda)
    tiles = mg.tile_table(off_d)                                               # [E+1]
    short = kd.backend.full((N_ex, M_s), np.nan, np.float32)                   # [N, M] poisoned
    kd.backend.launch(mg._grouped_gemm_kernel, (N_ex // TM, -(-M_s // TN)), THREADS, xs_d, W_d, off_d, tiles, short)
    missed = np.flatnonzero(np.isnan(host(short)).any(axis=1))                 # rows left NaN
    first = tile_work(ex_tiles, ex_off, N_ex // TM)[1]                         # first row of the first tile left out
    check_true(f"a grid of only N // TM = {N_ex // TM} row tiles leaves rows {first}.. unwritten (NaN shows them)",
               np.array_equal(missed, np.arange(first, N_ex)), f"rows {missed.tolist()} stay NaN")
print()
table(timing, ("case", "variant", f"{kd.backend.name} ms"))

# %% [markdown]
# ## 5. Which variant the launcher picks: `default_variant(rows, experts, kdim)`
#
# v3 (the GEMV) while `rows <= experts / GEMV_ROWS_PER_EXPERT` (= experts / 4): most experts then have one row or
# none, and streaming W rows with many loads in flight beats staging tiles through shared memory. Above that v4
# (skinny patches) while `kdim <= SKINNY_MAX_K` (256) and `rows <= SKINNY_MAX_ROWS` (256), else v2. Below: a Kimi
# K2 layer (384 experts, top-8, Kdim 7168 for gate/up) at T = 1 (a decode step), 4, 16 and 64 tokens, and the
# shipped default pair's DDTree-64 verify (65 tokens x top-2 = 130 rows over 8 experts, ~16 rows per expert;
# gate/up reads Kdim = H = 256, down Kdim = I = 192). The check compares each pick with the fastest variant
# measured on an H200 (docs/PERFORMANCE.md: Kimi 2026-12-02, the default pair 2026-12-04; the table in section 7).

# %%
section("default_variant")
H200_FASTEST = {"Kimi decode step": 3, "Kimi T = 4": 3, "Kimi T = 16": 2, "Kimi T = 64": 2,
                "default pair verify, gate/up": 4, "default pair verify, down": 4}   # measured on an H200
rows = []
picks = {}
for label, T_, k_, E_, K_ in [("Kimi decode step", 1, 8, 384, 7168), ("Kimi T = 4", 4, 8, 384, 7168),
                              ("Kimi T = 16", 16, 8, 384, 7168), ("Kimi T = 64", 64, 8, 384, 7168),
                              ("default pair verify, gate/up", 65, 2, 8, 256),
                              ("default pair verify, down", 65, 2, 8, 192)]:
    n = T_ * k_
    picks[label] = mg.default_variant(n, E_, K_)
    rows.append((label, f"{T_} x top-{k_}", n, E_, K_, f"{n / E_:.2f}", f"v{picks[label]}",
                 f"v{H200_FASTEST[label]}"))
table(rows, ("case", "tokens", "rows", "experts", "Kdim", "rows / expert", "default", "fastest on H200"))
check_true("the default picks the H200's fastest variant in every case above",
           all(picks[label] == v for label, v in H200_FASTEST.items()),
           ", ".join(f"{label}: v{picks[label]}" for label in picks))
check_true("the GEMV switch sits at rows = experts / 4 (96 rows -> v3, 97 -> v2 at 384 experts, Kdim 7168)",
           mg.default_variant(96, 384, 7168) == 3 and mg.default_variant(97, 384, 7168) == 2)
check_true("v4 only for a short K and few rows: (130, 8, 256) -> v4, (130, 8, 1024) -> v2, (257, 8, 256) -> v2",
           mg.default_variant(130, 8, 256) == 4 and mg.default_variant(130, 8, 1024) == 2
           and mg.default_variant(257, 8, 256) == 2)

# %% [markdown]
# ## 6. The MoE layer end to end
#
# `Target._moe` (`kdtree_numba/model/target.py`) chains the stages without reading anything back to the host:
#
#     idx, w = route(logits, bias, k, ...)                       # [T, k] experts and weights (tutorial 04)
#     counts, offsets, order, slot, tiles = group_by_expert_tiled(idx, E, TM)
#                                                                # expert-major order of the T*k assignments, and
#                                                                # the tile table [E+1] (shared by both GEMMs) from
#                                                                # the same launch: tile_table's sums, per block
#     xs  = gather_rows(h, order, k)                             # [T*k, H] the token rows h[order // k]
#     gu  = grouped_linear(xs,  experts_gu,   offsets, tiles)    # [T*k, 2I]
#     act = swiglu(gu)                                           # [T*k, I]   (tutorial 03)
#     ys  = grouped_linear(act, experts_down, offsets, tiles)    # [T*k, H]
#     out = combine(ys, w, slot)                                 # [T, H] out[t] = sum_j w[t, j] ys[slot[t*k + j]]
#
# (In the model the simulator runs the GEMMs in NumPy, `sim_kernel=False`, for speed; here every stage runs its
# kernel, at a tiny shape.) Against a plain per-token loop in float64: each token adds up, over its k experts,
# `w * down(swiglu(gate_up(x)))`.

# %%
section("the MoE layer: route -> group (+ tiles) -> gather -> grouped gate/up -> swiglu -> grouped down -> combine")
T, E, k, Hd, I = (64, 64, 8, 512, 256) if LARGE else (4, 6, 2, 16, 8)
Rm = rng(args, 1306)                                                           # the same draws on every backend
h = Rm.standard_normal((T, Hd)).astype(np.float32)                             # [T, H] the layer's input
logits = Rm.standard_normal((T, E)).astype(np.float32)                         # [T, E] router logits
bias = (0.1 * Rm.standard_normal(E)).astype(np.float32)                        # [E] selection bias
w_gu = (Rm.standard_normal((E, 2 * I, Hd)) / np.sqrt(Hd)).astype(np.float32)   # [E, 2I, H] fused gate | up
w_down = (Rm.standard_normal((E, Hd, I)) / np.sqrt(I)).astype(np.float32)      # [E, H, I]
hd = kd.backend.asarray(h)                                                     # [T, H] on the device
with spy() as s, stopwatch() as t:
    idx, w = moe_routing.route(logits, bias, k)                                # [T, k] each
    counts, offsets, order, slot, tiles = moe_routing.group_by_expert_tiled(idx, E, mg.TM)   # tiles [E+1]
    xs = moe_routing.gather_rows(hd, order, k)                                 # [T*k, H] expert-major
    gu = mg.grouped_linear(xs, w_gu, offsets, tiles=tiles)                     # [T*k, 2I]
    act = swiglu.swiglu(gu)                                                    # [T*k, I]
    ys = mg.grouped_linear(act, w_down, offsets, tiles=tiles)                  # [T*k, H]
    moe_out = moe_routing.combine(ys, w, slot)                                 # [T, H]
print(f"T {T}, E {E}, top-{k}, H {Hd}, I {I}: {T * k} rows, counts {host(counts).tolist() if E <= 16 else '...'}, "
      f"{t.ms:.0f} ms")
for name, grid, block in s.launches:
    print(f"  launched {name}[grid={grid}, block={block}]")
if not LARGE:
    idx_h, w_h, order_h = host(idx), host(w), host(order)
    table([(tok, idx_h[tok].tolist(), "[" + ", ".join(f"{v:.3f}" for v in w_h[tok]) + "]") for tok in range(T)],
          ("token", "experts", "weights"))
    print(f"order (assignments t*k + j, expert-major) {order_h.tolist()} -> xs rows are tokens "
          f"{(order_h // k).tolist()}")
if KERNELS:
    check_true("the whole chain reads nothing back to the host", s.host_reads == 0,
               f"{len(s.launches)} launches, {s.host_reads} host reads")

idx_ref, w_ref = moe_routing.route_ref(logits, bias, k, 1, 1, True, 1.0)       # [T, k] each
check("route kernel vs route_ref: expert ids (exact)", idx, idx_ref)
silu = lambda g: g / (1.0 + np.exp(-g))                                         # noqa: E731
want = np.zeros((T, Hd))                                                       # [T, H] float64
for tok in range(T):
    x64 = h[tok].astype(np.float64)                                            # [H]
    for j in range(k):
        e = idx_ref[tok, j]
        g_u = w_gu[e].astype(np.float64) @ x64                                 # [2I]
        want[tok] += float(w_ref[tok, j]) * (w_down[e].astype(np.float64) @ (silu(g_u[:I]) * g_u[I:]))
scale = float(np.abs(want).max())
check(f"MoE chain == per-token loop (float64), atol 1e-4 x {scale:.2f}", moe_out, want, atol=1e-4 * scale,
      rtol=1e-4)
check("grouped gate/up vs grouped_linear_ref on the routed rows", gu,
      mg.grouped_linear_ref(host(xs), w_gu, host(offsets)), atol=1e-5 * float(np.abs(host(gu)).max()), rtol=1e-5)

# %% [markdown]
# ## 7. On the H200: decode is memory-bound
#
# Measured on an H200 (docs/PERFORMANCE.md, 2026-12-02; command `PYTHONPATH=$PWD python3 benchmarks/bench_moe.py
# --tokens 1,4,16,64`), **not by this tutorial**: one MoE layer's routed experts at Kimi K2's shape (H 7168,
# I 2048, 384 experts, top-8, fp32), gate/up GEMM + SwiGLU + down GEMM, random routing. "per-expert cuBLAS": the
# offsets read on the host, then one cuBLAS GEMM per expert with rows (the path the grouped kernels replaced; it
# moves a lot between runs). "% of floor": the memory floor (expert bytes touched / copy bandwidth) over the
# best variant's time.
#
# Why memory-bound: a decode step touches 8 experts x 3 x 7168 x 2048 x 4 B = 1.41 GB of weights and does only
# 2 flops per weight (0.5 flop/byte): at ~4.2 TB/s that is 0.34 ms of reading against 0.014 ms of fp32 arithmetic
# at ~51 TFLOP/s. The time is the bytes of the experts touched divided by the bandwidth; more tokens touch more
# distinct experts (about `E (1 - (1 - k/E)^T)`), so the time grows with them.

# %%
section("measured on an H200 (docs/PERFORMANCE.md, 2026-12-02) - quoted, not measured here")
H200 = [  # T, per-expert cuBLAS, v1, v2, v3, best graph-replayed, best % of floor  (ms, ms, ms, ms, ms, str, %)
    (1, 0.676, 1.022, 0.906, 0.759, "0.628 (v3)", 44),
    (4, 2.119, 3.441, 3.007, 2.734, "2.602 (v3)", 48),
    (16, 6.805, 10.963, 9.411, 9.619, "9.273 (v2)", 47),
    (64, 20.169, 30.456, 25.363, 36.752, "25.236 (v2)", 47),
]
Hk, Ik, Ek, kk, COPY_BW, FP32_FLOPS = 7168, 2048, 384, 8, 4.2e12, 51e12       # Kimi K2; H200 ceilings (same doc)
expert_bytes = 3 * Hk * Ik * 4                                                 # one expert's gate/up + down, fp32
rows = []
consistent = True
for T_, old, v1, v2, v3, graph, pct in H200:
    active = Ek * (1 - (1 - kk / Ek) ** T_)                                    # distinct experts, uniform routing
    floor_ms = active * expert_bytes / COPY_BW * 1e3
    best = min(v1, v2, v3)
    est = 100 * floor_ms / best
    consistent &= abs(est - pct) <= 5
    rows.append((T_, f"{old:.3f}", f"{v1:.3f}", f"{v2:.3f}", f"{v3:.3f}", graph, f"{pct} %",
                 f"{active:.0f}", f"{floor_ms:.3f}", f"{est:.0f} %"))
table(rows, ("T", "per-expert cuBLAS ms", "v1 ms", "v2 ms", "v3 ms", "best, graph ms", "% of floor",
             "experts touched (est.)", "floor ms (est.)", "% (est.)"))
flops_ms = 2 * kk * expert_bytes / 4 / FP32_FLOPS * 1e3
print(f"T = 1: {kk * expert_bytes / 1e9:.2f} GB of experts -> {kk * expert_bytes / COPY_BW * 1e3:.3f} ms at "
      f"{COPY_BW / 1e12:.1f} TB/s; {2 * kk * expert_bytes / 4 / 1e9:.2f} GFLOP -> {flops_ms:.3f} ms at "
      f"{FP32_FLOPS / 1e12:.0f} TFLOP/s")
print("'(est.)' columns: computed here from the shapes (expected distinct experts, 4.2 TB/s), next to the quoted "
      "'% of floor' (the benchmark's seeded routing and measured bandwidth)")
check_true("the quoted % of floor matches bytes touched / 4.2 TB/s (within 5 points)", consistent)

# %%
finish()
