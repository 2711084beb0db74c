"""One function's GPU work captured as a CUDA graph, to be replayed: how the decode programs (replay.py,
ddtree_replay.py, prefill_replay.py) turn a step's host launches (a plain step of the default target ran 178 kernels
- numba's, CuPy's and cuBLAS's - by ncu on 2026-12-02) into one graph launch.

``CapturedStep(fn)`` runs ``fn`` once under CuPy stream capture on the backend stream (numba's kernels launch on
that stream, so they are captured with CuPy's own work); ``replay()`` launches the graph. What ``fn`` allocates
during the capture is taken from CuPy's pool by an allocator that keeps each block for the graph's lifetime: the
graph replays those addresses, so nothing else may reuse them. ``fn`` must have run directly once before (numba
compiles each kernel at its first launch, which a capture cannot hold) and must not read anything on the host.
Example: ``step = CapturedStep(lambda: sampling.choose_tokens(x, T, seed, stream, out=out), "the sampler")``,
then ``step.replay()`` picks tokens again from whatever ``x`` and the settings hold at the replay, into ``out``.
"""
from __future__ import annotations

from .. import backend


class CapturedStep:
    """``fn`` captured once as a CUDA graph on the backend stream; ``replay()`` launches it (cuda only).
    ``what`` names the captured work in the error a failed capture raises."""

    def __init__(self, fn, what: str = "the decode step"):
        cp = backend.cp
        pool = cp.get_default_memory_pool()
        self._blocks = []                       # every block the capture allocated: alive as long as the graph

        def keep(nbytes):
            block = pool.malloc(nbytes)
            self._blocks.append(block)
            return block

        stream = backend.stream
        try:
            backend.bind_stream()
            with cp.cuda.using_allocator(keep):
                stream.begin_capture()
                try:
                    fn()
                finally:
                    graph = stream.end_capture()
            if cp.cuda.get_current_stream().ptr != stream.ptr:      # CuPy work went elsewhere: not in the graph
                raise RuntimeError("the thread's current CuPy stream changed during the capture")
        except Exception as e:
            raise RuntimeError(f"replay: capturing {what} as a CUDA graph failed ({type(e).__name__}: {e}); "
                               f"generate with replay=False") from e
        self.graph = graph

    def replay(self) -> None:
        self.graph.launch(backend.stream)
