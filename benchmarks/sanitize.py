"""Run the GPU tests, or one whole DDTree generation, under NVIDIA's compute-sanitizer (the device machine).

    compute-sanitizer --tool memcheck  --report-api-errors no python3 benchmarks/sanitize.py -m gpu tests -x
    compute-sanitizer --tool racecheck --report-api-errors no python3 benchmarks/sanitize.py -m gpu tests/kernels
    compute-sanitizer --tool memcheck  --report-api-errors no python3 benchmarks/sanitize.py --generate

CuPy's memory pool is replaced first by the driver's stream-ordered allocator (cudaMallocAsync), so every array is
its own allocation and an access past an array's end is caught there (CuPy's pool carves arrays out of large
chunks, where a small overrun lands in a neighbour and memcheck cannot see it). Stream-ordered frees matter: with
plain cudaMalloc/cudaFree (``set_allocator(None)``) a temporary freed right after an asynchronous launch on the
backend's non-blocking stream was reported as an out-of-bounds read (2026-12-01, test_mma) - the harness, not the
kernel. ``--generate``: greedy DDTree on the tiny target with a random DFlash drafter, budget
16, 24 tokens, direct and graph-replayed, checked against plain decoding. Arguments otherwise go to pytest.
(Run from the repository root with PYTHONPATH=$PWD KDTREE_BACKEND=cuda.)
"""
import sys

import cupy

cupy.cuda.set_allocator(cupy.cuda.MemoryAsyncPool().malloc)

if sys.argv[1:] == ["--generate"]:
    import kdtree_numba as kd
    from kdtree_numba.model import dflash

    target = kd.tiny_target(0)
    drafter = dflash.random_drafter(target, block_size=5)
    prompt = [(7 * i + 3) % 200 for i in range(24)]
    want = kd.generate(target, prompt, 24).tokens
    for replay in (False, True):
        g = kd.generate(target, prompt, 24, drafter=drafter, budget=16, replay=replay)
        assert g.tokens == want, f"replay={replay}: DDTree differs from plain decoding"
        print(f"replay={replay}: {len(g.tokens)} tokens in {len(g.rounds)} rounds, equal to plain decoding")
    sys.exit(0)

import pytest  # noqa: E402

sys.exit(pytest.main(sys.argv[1:]))
