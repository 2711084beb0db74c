"""Tensor-core issue rates from numba: ``mma.sync`` m16n8k8 TF32 (what kernels/mma.py and the attention kernels use)
against m16n8k16 FP16 and BF16, through the same inline-PTX intrinsic (``mma.mma_intrinsic``), and cuBLAS's fp32
GEMM in the same process.

    PYTHONPATH=$PWD KDTREE_BACKEND=cuda python3 benchmarks/bench_mma.py

What it tells: the ceiling of a 3xTF32 product (three MMAs per fp32-grade product, so a third of the TF32 rate)
that issue 14's attention kernels run on, and what a split into two 16-bit halves would have instead. Every warp
runs 8 independent accumulator chains (no chain waits on its own previous MMA for long), 8 warps a block, 8
blocks an SM; operands are constants (the rate does not depend on the values). Result: ``bench_mma.json`` under
$OUT (or ./bench_results).
Example (H100, 2026-12-05): TF32 291.0 TFLOP/s, FP16 573.8 (1.97x), BF16 598.6 (2.06x): a 3xTF32 ceiling of 97
TFLOP/s of fp32-grade products, 1.89x cuBLAS fp32's 51.2 (the attention kernels do not run into it: they are
latency-bound, docs/PERFORMANCE.md, thirty-first session).
"""
import numpy as np
from numba import cuda, float32

from _common import args, gemm_tflops, kd, save, table

from kdtree_numba.kernels import mma  # noqa: E402

F16 = ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
       "{$0, $1, $2, $3}, {$4, $5, $6, $7}, {$8, $9}, {$10, $11, $12, $13};")
BF16 = F16.replace(".f16.f16.", ".bf16.bf16.")
CHAINS = 8                                       # independent accumulator sets a warp keeps in flight
WARPS = 8                                        # warps a block
ACC = 4 * CHAINS                                 # accumulators a lane (numba wants a constant local array size)


def rate_kernel(op):
    """A kernel of ``n`` rounds of CHAINS independent MMAs a warp (``op``: an intrinsic of mma.mma_intrinsic),
    writing each thread's accumulator sum so nothing is dropped. Grid: any; block: 32 x WARPS threads."""
    @cuda.jit
    def kernel(out, n, a):
        x = float32(a[cuda.threadIdx.x % 32])
        c = cuda.local.array(ACC, float32)
        for i in range(ACC):
            c[i] = float32(0.0)
        for _ in range(n):
            for j in range(CHAINS):
                c[4 * j], c[4 * j + 1], c[4 * j + 2], c[4 * j + 3] = op(
                    x, x, x, x, x, x, c[4 * j], c[4 * j + 1], c[4 * j + 2], c[4 * j + 3])
        s = float32(0.0)
        for i in range(ACC):
            s += c[i]
        out[cuda.grid(1)] = s
    return kernel


def tflops(op, flops_per_mma: int, rounds: int, reps: int) -> float:
    """TFLOP/s of ``op`` over 8 blocks an SM (the fastest of ``reps`` event-timed launches after a warm-up)."""
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT
    blocks = 8 * sms
    kernel = rate_kernel(op)
    out = cuda.device_array(blocks * 32 * WARPS, np.float32)
    a = cuda.to_device(np.full(32, 1e-3, np.float32))
    kernel[blocks, 32 * WARPS](out, 4, a)                          # compile, warm up
    cuda.synchronize()
    best = float("inf")
    for _ in range(reps):
        e0, e1 = cuda.event(), cuda.event()
        e0.record()
        kernel[blocks, 32 * WARPS](out, rounds, a)
        e1.record()
        e1.synchronize()
        best = min(best, cuda.event_elapsed_time(e0, e1) * 1e-3)
    return blocks * WARPS * rounds * CHAINS * flops_per_mma / best / 1e12


def main() -> None:
    a = args(__doc__)
    if kd.backend.name != "cuda":                  # --quick without a GPU: the simulator has no tensor cores
        print(f"bench_mma: nothing to smoke-test on the {kd.backend.name} backend (tensor-core instructions only "
              "run on a GPU)")
        return
    rounds = 256 if a.quick else 2048
    reps = 3 if a.quick else 5
    base = tflops(mma._mma_tf32, 2 * 16 * 8 * 8, rounds, reps)
    cublas = gemm_tflops(2048 if a.quick else 8192)
    rows = [["tf32 m16n8k8 (kernels/mma.py)", f"{base:.1f}", "1.00x", f"{base / 3:.1f}", f"{base / 3 / cublas:.2f}x"]]
    for name, ptx in (("f16 m16n8k16", F16), ("bf16 m16n8k16", BF16)):
        r = tflops(mma.mma_intrinsic(ptx), 2 * 16 * 8 * 16, rounds, reps)
        rows.append([name, f"{r:.1f}", f"{r / base:.2f}x", f"{r / 3:.1f}", f"{r / 3 / cublas:.2f}x"])
    table(f"mma.sync issue rates from numba ({kd.backend.name}); cuBLAS fp32 GEMM {cublas:.1f} TFLOP/s, same process",
          ["instruction", "TFLOP/s", "vs tf32", "3-MMA split ceiling TFLOP/s", "ceiling vs cuBLAS fp32"], rows)
    save("bench_mma")


if __name__ == "__main__":
    main()
