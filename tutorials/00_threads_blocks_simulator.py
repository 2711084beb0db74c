"""Tutorial 00: threads, blocks, grids - and numba's CUDA simulator that runs them on a laptop.

Run:  KDTREE_BACKEND=sim python tutorials/00_threads_blocks_simulator.py [--size small|large] [--out DIR]
"""
# %% [markdown]
# # 00 - Threads, blocks and the simulator
#
# A CUDA kernel is one function run by many threads at once. The threads are organised in two levels:
#
# * a **block** of `blockDim.x` threads (up to 1024) that run on one streaming multiprocessor, can share a small
#   fast scratchpad (`cuda.shared.array`) and can wait for each other (`cuda.syncthreads()`, a *barrier*);
# * a **grid** of `gridDim.x` blocks. Blocks are independent: they cannot wait for each other.
#
# Each thread knows where it is: `cuda.blockIdx.x`, `cuda.threadIdx.x`, `cuda.blockDim.x`. The usual "global index"
#
#     i = cuda.grid(1) = blockIdx.x * blockDim.x + threadIdx.x
#
# numbers the threads of the whole grid 0, 1, 2, ... A launch `kernel[grid, block](args)` starts `grid * block`
# threads; we pick `grid = ceil(n / block)` so that there is at least one thread per element, and threads past
# the end (`i >= n`) do nothing.
#
# Every stage of kdtree_numba is written this way. The kernels in this file are written right here, to show the
# two patterns the package uses everywhere: *one thread per element* and *one block per row with a shared-memory
# reduction*.

# %%
import os

import numpy as np

from _common import (banner, check, check_raises, check_true, finish, host, parse_args, rng, section, stopwatch,
                     table)

import kdtree_numba as kd  # already imported by _common: the backend is chosen now

# `from numba import cuda` must come AFTER importing kdtree_numba: with KDTREE_BACKEND=sim the package sets
# NUMBA_ENABLE_CUDASIM=1, which numba reads when numba.cuda is first imported. And kernels must reference `cuda`
# as a module global (the simulator cannot see it through closures or local imports).
from numba import cuda  # noqa: E402

args = parse_args(__doc__)
banner("Tutorial 00 - threads, blocks and the simulator", args)
R = rng(args)
LARGE = args.size == "large"

# %% [markdown]
# ## How kdtree_numba picks its backend
#
# One backend per process, read from `KDTREE_BACKEND` when `kdtree_numba` is first imported:
#
# | value   | arrays | stages run as |
# |---------|--------|---------------|
# | `cuda`  | CuPy   | numba.cuda kernels on the GPU |
# | `sim`   | NumPy  | the same kernels on numba's CUDA simulator (one OS thread per CUDA thread: slow, exact) |
# | `numpy` | NumPy  | each stage's plain NumPy reference (`*_ref`) |
# | `auto` (default) | | `cuda` if CuPy sees a GPU, else `numpy` |
#
# `kd.backend.use("numpy")` switches a block of code to the references (tests compare kernel and reference in one
# process this way). Switching to any *other* backend raises: numba decides simulator-or-GPU once per process.

# %%
section("the backend")
print(f"KDTREE_BACKEND           = {os.environ.get('KDTREE_BACKEND', '(unset -> auto)')}")
print(f"kd.backend.process_name  = {kd.backend.process_name}")
print(f"kd.backend.name          = {kd.backend.name}")
print(f"NUMBA_ENABLE_CUDASIM     = {os.environ.get('NUMBA_ENABLE_CUDASIM', '(unset)')}")
with kd.backend.use("numpy"):
    print(f"inside kd.backend.use('numpy'): kd.backend.name = {kd.backend.name}")
print(f"after the block:                kd.backend.name = {kd.backend.name}")
other = "cuda" if kd.backend.process_name == "sim" else "sim"
check_raises(f"use({other!r}) refused in a {kd.backend.process_name} process",
             lambda: kd.backend.use(other).__enter__())

KERNELS_RUN = kd.backend.process_name != "numpy"
if not KERNELS_RUN:
    print("\nnote: this process runs the numpy backend, where numba.cuda kernels cannot launch (no GPU, no "
          "simulator).\n      Below, each kernel's result is replaced by its NumPy reference; rerun with "
          "KDTREE_BACKEND=sim to see the kernels run.")


def launch(kernel, grid, block, *arrays):
    """Launch one of this tutorial's kernels on the backend's arrays (CuPy on the GPU, NumPy on the simulator).
    kd.backend.launch does what the package's launchers do: numba views of CuPy arrays, the backend's stream."""
    kd.backend.launch(kernel, grid, block, *arrays)
    kd.backend.synchronize()


# %% [markdown]
# ## Who runs where: every thread writes down its coordinates
#
# `n = 10` elements, blocks of 4 threads -> `grid = ceil(10 / 4) = 3` blocks = 12 threads; threads 10 and 11
# (block 2, threads 2 and 3) fall off the end and return at once.

# %%
@cuda.jit
def whoami_kernel(block_of, thread_of, global_of):
    i = cuda.grid(1)                       # == cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if i < global_of.shape[0]:             # the bounds guard every element-wise kernel needs
        block_of[i] = cuda.blockIdx.x
        thread_of[i] = cuda.threadIdx.x
        global_of[i] = i


section("thread coordinates")
n, block = 10, 4
grid = (n + block - 1) // block
b_of, t_of, g_of = (kd.backend.full((n,), -1, np.int32) for _ in range(3))
if KERNELS_RUN:
    launch(whoami_kernel, grid, block, b_of, t_of, g_of)
else:
    b_of, t_of, g_of = np.arange(n) // block, np.arange(n) % block, np.arange(n)
b_of, t_of, g_of = host(b_of), host(t_of), host(g_of)
print(f"launch whoami_kernel[grid={grid}, block={block}] over n={n} elements:")
table([(e, b_of[e], t_of[e], g_of[e]) for e in range(n)], ("element", "blockIdx.x", "threadIdx.x", "cuda.grid(1)"))
check("cuda.grid(1) == blockIdx*blockDim + threadIdx", g_of, b_of * block + t_of)
check("every element written exactly by thread i", g_of, np.arange(n, dtype=np.int32))

# %% [markdown]
# ## Pattern 1: one thread per element (vector add)
#
#     out[i] = a[i] + b[i]        thread i (of the whole grid) computes element i
#
# The NumPy reference is one line: `a + b`.

# %%
@cuda.jit
def vector_add_kernel(a, b, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = a[i] + b[i]


section("vector add")
n = 1 << 22 if LARGE else 37                 # irregular: not a multiple of the block size
block = 256 if LARGE else 8
grid = (n + block - 1) // block
a = R.standard_normal(n).astype(np.float32)
b = R.standard_normal(n).astype(np.float32)
want = a + b                                  # the reference
out = kd.backend.full((n,), np.nan, np.float32)   # poisoned: an element no thread writes stays NaN
with stopwatch() as t:
    if KERNELS_RUN:
        launch(vector_add_kernel, grid, block, kd.backend.asarray(a), kd.backend.asarray(b), out)
    else:
        out = want.copy()
print(f"vector_add_kernel[grid={grid}, block={block}]: {grid * block} threads for {n} elements "
      f"({grid * block - n} idle), {t.ms:.1f} ms")
check("vector add kernel vs a + b", out, want, atol=0, rtol=0)
if kd.backend.process_name == "sim":
    print(f"simulator speed: ~{grid * block / (t.ms / 1e3):,.0f} threads/s (one OS thread per CUDA thread)")

# %% [markdown]
# ## Pattern 2: one block per row, a reduction in shared memory
#
# Summing needs threads to *combine* their values. Inside a block they can: each thread puts its value into a
# shared array, then a **tree reduction** halves the number of active threads each step
#
#     stride = 16, 8, 4, 2, 1:   if tid < stride: partial[tid] += partial[tid + stride];  syncthreads()
#
# The barrier after each step makes sure every thread's write is visible before anyone reads it in the next
# step. After log2(32) = 5 steps `partial[0]` holds the block's sum; thread 0 writes it out. Here each block sums
# one row of a matrix (threads stride over the columns first: thread `tid` adds columns tid, tid+32, ...),
# exactly the shape of `kernels/rmsnorm.py`.
#
# Shared-array sizes are compile-time constants (module globals), like `BLOCK` below.

# %%
BLOCK = 32        # threads per block of the reduction = size of its shared array


@cuda.jit
def row_sum_kernel(x, out):
    row = cuda.blockIdx.x                          # one block per row
    tid = cuda.threadIdx.x
    partial = cuda.shared.array(BLOCK, np.float32)  # one slot per thread, visible to the whole block
    acc = np.float32(0.0)
    for c in range(tid, x.shape[1], BLOCK):        # strided loop: thread tid takes columns tid, tid + 32, ...
        acc += x[row, c]
    partial[tid] = acc
    cuda.syncthreads()                             # all partial sums written
    stride = BLOCK // 2
    while stride > 0:                              # tree reduction: 16, 8, 4, 2, 1
        if tid < stride:
            partial[tid] += partial[tid + stride]
        cuda.syncthreads()                         # this step's writes visible before the next step reads
        stride //= 2
    if tid == 0:
        out[row] = partial[0]


section("row sums with a shared-memory reduction")
rows, cols = (4096, 7168) if LARGE else (5, 69)
x = R.standard_normal((rows, cols)).astype(np.float32)
want = x.astype(np.float64).sum(axis=1)
out = kd.backend.full((rows,), np.nan, np.float32)
with stopwatch() as t:
    if KERNELS_RUN:
        launch(row_sum_kernel, rows, BLOCK, kd.backend.asarray(x), out)
    else:
        out = want.astype(np.float32)
print(f"row_sum_kernel[grid={rows}, block={BLOCK}] over x {x.shape}: {t.ms:.1f} ms "
      f"({rows} blocks x 6 barriers each)")
check("row sums kernel vs float64 NumPy", out, want, atol=1e-4, rtol=1e-5)
if not LARGE:
    table([(r, f"{host(out)[r]:+.6f}", f"{want[r]:+.6f}") for r in range(rows)], ("row", "kernel", "NumPy"))

# %% [markdown]
# ## The same idea inside the package
#
# `kernels/rmsnorm.py` is the row reduction above plus a scale: `_rmsnorm_kernel` runs one block per token row.
# Its launcher `rmsnorm(x, w, eps)` validates the arguments, then either runs `rmsnorm_ref` (numpy backend) or
# launches the kernel with `backend.launch(kernel, grid, block, ...)` and a block size of
# `backend.block_size(gpu=256, sim=16)` threads. So one call runs the kernel, and the same call inside
# `kd.backend.use("numpy")` runs the reference:

# %%
section("a package stage on both paths")
from kdtree_numba.kernels import rmsnorm  # noqa: E402

x = R.standard_normal((3, 20)).astype(np.float32)
w = R.uniform(0.5, 1.5, 20).astype(np.float32)
y_kernel = host(rmsnorm.rmsnorm(x, w, 1e-6))
with kd.backend.use("numpy"):
    y_ref = host(rmsnorm.rmsnorm(x, w, 1e-6))
check("rmsnorm: process backend vs use('numpy')", y_kernel, y_ref, atol=1e-6, rtol=1e-5)
check_true("backend restored after use()", kd.backend.name == kd.backend.process_name, f"name = {kd.backend.name}")

# %% [markdown]
# ## What the simulator is good for, and what it is not
#
# * It runs one block at a time, one OS thread per CUDA thread (roughly 9,000 simple threads per second), and each
#   barrier costs a thread switch for every thread. Keep simulator shapes tiny: a few blocks of <= 64 threads.
# * Out-of-bounds indexing raises `IndexError` naming the thread - stricter than a GPU, useful for debugging.
# * It hides races (a non-atomic `+=` from many threads comes out right) and lacks warp shuffles, so the GPU
#   (`KDTREE_BACKEND=cuda`, `compute-sanitizer`) remains the final judge.

# %%
finish()
