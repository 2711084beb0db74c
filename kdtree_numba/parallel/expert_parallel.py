"""Expert parallelism (EP) for the MoE layers: each of N ranks holds E / N of the routed experts.

Rank r holds experts r*E/N .. (r+1)*E/N - 1 (a contiguous slice; E divisible by N, else ValueError). Everything
else (embedding, attention, dense MLPs, router, shared expert, lm_head) is replicated.

The executed path, ``ep_moe`` (data replicated: every rank has all T tokens):
    idx, w = route(h @ gate)                          every rank, the same result         [T, k]
    order, offsets = group_by_expert(idx)             expert-major: rank r's rows are ONE contiguous slice
    ys[lo:hi] = down(swiglu(gu(h[order[lo:hi] // k])))    only this rank's experts; zero rows elsewhere [T*k, H]
    reduce="tokens" (default):      out = all_reduce(combine(ys, w, slot)) + shared(h)      [T, H] sent
    reduce="assignments":           out = combine(all_reduce(ys), w, slot, out=shared(h))   [T*k, H] sent
"tokens" sends k times less; its sum runs in another order than one rank's combine (equal to ~1e-7 relative).
"assignments" adds each row to zeros only, so it reproduces the single-rank ``Target._moe`` bit for bit. The
shared expert runs on every rank and is added once, after the reduction. The slice bounds lo, hi are read on the
host (one read of two ints per MoE layer: a cuda graph cannot capture this path yet).

The all-to-all path (DeepEP-style, tokens sharded: rank r holds only its own tokens) as a NumPy reference of the
bookkeeping, plus ``ep_moe_all_to_all`` that runs it over any Communicator:
    dispatch_plan(idx, E, N):  the send order (= the expert-major grouping: experts are contiguous per rank, so it
        is destination-major too), send_counts [N] and each sent row's expert.
    all_to_all_v of the counts/experts, then of the rows x[order // k]: rank r receives one block per source, in
        source order, each block in the source's send order.
    receive_plan(...): each received row's source and local expert, ``order`` (received rows -> expert-major for
        the grouped GEMMs; stable: within an expert, by source then the source's send order), ``offsets``, and
        its inverse ``slot`` that puts the expert outputs back in receive layout.
    all_to_all_v back: each source gets its rows' outputs in its own send order = its expert-major order, so the
        single-rank ``combine(ys, w, slot)`` finishes the layer.

``shard_target(target, rank, world, comm)``: a Target whose MoE layers run ``ep_moe``; ``kd.generate`` runs on it
unchanged (a subclass: ``Target.forward`` calls ``self._moe(L, h, out=x)`` per MoE layer; that is the hook used).
Example: E = 8, N = 2: rank 0 holds experts 0-3, rank 1 experts 4-7; a token routed to (2, 6) gets expert 2's
output from rank 0 and expert 6's from rank 1, each weighted there, summed by the all-reduce.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from .. import backend
from ..kernels import gemm_choice, moe_grouped_gemm, moe_routing, swiglu
from ..model.target import Target
from .communicator import Communicator, FakeGroup, check_rank, check_world

REDUCE_MODES = ("tokens", "assignments")


def expert_range(n_experts: int, rank: int, world: int) -> tuple[int, int]:
    """(first, end) of rank ``rank``'s experts; ValueError unless ``world`` divides ``n_experts``."""
    world = check_world(world)
    rank = check_rank(rank, world)
    if n_experts % world:
        raise ValueError(f"world: {world} ranks do not divide the {n_experts} routed experts (expert parallelism "
                         f"gives every rank the same number; use a world size that divides {n_experts})")
    per = n_experts // world
    return rank * per, (rank + 1) * per


def shard_experts(layer: dict, rank: int, world: int) -> dict:
    """A copy of a MoE layer's dict holding only rank ``rank``'s experts (``experts_gu [E/N, 2I, H]``,
    ``experts_down [E/N, H, I]``, copies) and ``expert_first``; the other entries are shared, not copied."""
    if "gate" not in layer:
        raise ValueError("layer: not a MoE layer (no router 'gate')")
    e0, e1 = expert_range(layer["experts_gu"].shape[0], rank, world)
    xp = backend.cp if backend.is_device(layer["experts_gu"]) else np
    out = dict(layer)
    out["experts_gu"] = xp.ascontiguousarray(layer["experts_gu"][e0:e1]).copy()          # [E/N, 2I, H]
    out["experts_down"] = xp.ascontiguousarray(layer["experts_down"][e0:e1]).copy()      # [E/N, H, I]
    out["expert_first"] = e0
    return out


def _local_experts(layer: dict, cfg, comm: Communicator) -> tuple[int, int]:
    """(first expert, count) of this rank's shard, checked against the config and the communicator."""
    E = cfg.n_routed_experts
    e0, e1 = expert_range(E, comm.rank, comm.world_size)
    n_loc = layer["experts_gu"].shape[0]
    first = layer.get("expert_first", 0 if n_loc == E else None)
    if n_loc != e1 - e0 or first != e0 or layer["experts_down"].shape[0] != n_loc:
        raise ValueError(f"layer: holds {n_loc} experts from {first}, but rank {comm.rank} of {comm.world_size} "
                         f"owns experts {e0}..{e1 - 1} (shard with shard_experts(layer, {comm.rank}, "
                         f"{comm.world_size}))")
    return e0, n_loc


def _route(h, layer, cfg):
    """(idx [T, k], weights [T, k], the shared expert's gate/up or None): the single-rank layer's router GEMM."""
    logits, shared_gu = Target._router_and_shared_gu(layer, h, cfg.n_routed_experts)
    idx, w = moe_routing.route(logits, layer["bias"], cfg.num_experts_per_tok, cfg.n_group, cfg.topk_group,
                               cfg.norm_topk_prob, cfg.routed_scaling_factor)
    return idx, w, shared_gu


def _experts(xs, layer, offsets, rows: int, experts: int):
    """The local experts' SwiGLU MLPs over expert-major rows ``xs`` (local ``offsets [E/N + 1]``); ``rows``,
    ``experts``: the whole layer's, so each GEMM runs the variant the single-rank layer would
    (moe_grouped_gemm.default_variant of its rows, experts and inner dimension)."""
    tiles = moe_grouped_gemm.tile_table(offsets, sim_kernel=False)
    gu_w, down_w = layer["experts_gu"], layer["experts_down"]                        # [E/N, 2I, H], [E/N, H, I]
    gu = moe_grouped_gemm.grouped_linear(xs, gu_w, offsets, tiles=tiles, sim_kernel=False,
                                         variant=moe_grouped_gemm.default_variant(rows, experts, gu_w.shape[2]))
    return moe_grouped_gemm.grouped_linear(swiglu.swiglu(gu), down_w, offsets, tiles=tiles, sim_kernel=False,
                                           variant=moe_grouped_gemm.default_variant(rows, experts, down_w.shape[2]))


def ep_moe(h, layer: dict, cfg, comm: Communicator, reduce: str = "tokens", out=None):
    """One MoE layer over this rank's experts (``layer`` from ``shard_experts``; module docstring); returns
    ``[T, H]``, the same on every rank and equal to the single-rank ``Target._moe(layer, h, out)``: added onto
    ``out`` (the residual stream) when given, shared expert first, as the single-rank layer adds them."""
    if reduce not in REDUCE_MODES:
        raise ValueError(f"reduce: expected one of {REDUCE_MODES}, got {reduce!r}")
    e0, n_loc = _local_experts(layer, cfg, comm)
    xp = backend.xp
    k = cfg.num_experts_per_tok
    T, H = h.shape
    idx, w, shared_gu = _route(h, layer, cfg)                                         # [T, k] each, all ranks
    _, offsets, order, slot = moe_routing.group_by_expert(idx, cfg.n_routed_experts)
    off = np.asarray(backend.to_host(offsets[e0:e0 + n_loc + 1]), np.int64)           # host read: the slice
    lo, hi = int(off[0]), int(off[-1])
    ys = backend.zeros((T * k, H), np.float32)                                        # [T*k, H] expert-major
    if hi > lo:
        xs = xp.take(h, order[lo:hi] // k, axis=0)                                    # [hi-lo, H] local rows
        ys[lo:hi] = _experts(xs, layer, backend.asarray((off - lo).astype(np.int32)), T * k, cfg.n_routed_experts)
    if reduce == "assignments":
        return moe_routing.combine(comm.all_reduce(ys), w, slot, out=Target._shared_expert(layer, shared_gu, out))
    y = comm.all_reduce(moe_routing.combine(ys, w, slot))                             # [T, H]
    if out is None:
        out = y
    else:
        out += y
    return Target._shared_expert(layer, shared_gu, out)


# ------------------------------------------------------------------------------------------------ all-to-all
@dataclasses.dataclass
class DispatchPlan:
    """One source rank's send side. ``order [A]``: assignment ids (a = t*k + j) in send order; ``slot [A]``: its
    inverse (where assignment a is sent); ``send_counts [N]``: rows to each rank; ``experts [A]``: the global
    expert of each sent row. A = T*k."""
    order: np.ndarray
    slot: np.ndarray
    send_counts: np.ndarray
    experts: np.ndarray


@dataclasses.dataclass
class ReceivePlan:
    """One destination rank's side. The receive buffer holds ``recv_counts[s]`` rows from each source s, in
    source order. Per received row: ``sources [R]``, ``experts [R]`` (local ids). ``order [R]``: received rows
    in expert-major order; ``offsets [E/N + 1]`` its expert bounds; ``slot [R]``: the inverse of ``order``."""
    recv_counts: np.ndarray
    sources: np.ndarray
    experts: np.ndarray
    order: np.ndarray
    offsets: np.ndarray
    slot: np.ndarray


def dispatch_plan(idx, n_experts: int, world: int) -> DispatchPlan:
    """NumPy reference of the send side (module docstring); ``idx [T, k]`` host int."""
    idx = np.asarray(idx)
    per = expert_range(n_experts, 0, world)[1]
    counts, offsets, order, slot = moe_routing.group_by_expert_ref(idx, n_experts)
    send_counts = np.diff(offsets[::per]).astype(np.int64)                       # [N] rows per destination
    return DispatchPlan(order, slot, send_counts, idx.reshape(-1)[order].astype(np.int32))


def receive_plan(recv_experts: list, rank: int, n_experts: int, world: int) -> ReceivePlan:
    """NumPy reference of the receive side from the global expert ids received from each source (in source
    order: what ``all_to_all_v`` of ``DispatchPlan.experts`` split by ``send_counts`` delivers)."""
    e0, e1 = expert_range(n_experts, rank, world)
    if len(recv_experts) != world:
        raise ValueError(f"recv_experts: expected one array per source rank ({world}), got {len(recv_experts)}")
    blocks = [np.asarray(e, np.int64).reshape(-1) for e in recv_experts]
    for s, b in enumerate(blocks):
        if b.size and (b.min() < e0 or b.max() >= e1):
            raise ValueError(f"recv_experts: source {s} sent expert {int(b[(b < e0) | (b >= e1)][0])}, but rank "
                             f"{rank} owns experts {e0}..{e1 - 1}")
    recv_counts = np.array([b.size for b in blocks], np.int64)
    sources = np.repeat(np.arange(world, dtype=np.int32), recv_counts)
    local = (np.concatenate(blocks) - e0).astype(np.int32) if blocks else np.zeros(0, np.int32)
    _, offsets, order, slot = moe_routing.group_by_expert_ref(local[:, None], e1 - e0)
    return ReceivePlan(recv_counts, sources, local, order, offsets, slot)


def _split(a, counts):
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    return [a[int(bounds[i]):int(bounds[i + 1])] for i in range(len(counts))]


def ep_moe_all_to_all(h, layer: dict, cfg, comm: Communicator):
    """One MoE layer with tokens sharded: ``h [T_r, H]`` are this rank's own tokens; returns their ``[T_r, H]``
    output (module docstring). Bookkeeping on the host (dispatch_plan / receive_plan), rows moved by
    ``all_to_all_v``, experts run by the grouped GEMMs of the backend."""
    e0, _ = _local_experts(layer, cfg, comm)
    xp = backend.xp
    E, k, world = cfg.n_routed_experts, cfg.num_experts_per_tok, comm.world_size
    idx, w, shared_gu = _route(h, layer, cfg)                                      # [T_r, k] this rank's tokens
    send = dispatch_plan(backend.to_host(idx), E, world)
    order_dev = backend.asarray(send.order)
    xs_send = xp.take(h, order_dev // k, axis=0)                                   # [A, H] destination-major
    recv_e = comm.all_to_all_v([backend.asarray(e) for e in _split(send.experts, send.send_counts)])
    recv = receive_plan([backend.to_host(e) for e in recv_e], comm.rank, E, world)
    xr = comm.all_to_all_v(_split(xs_send, send.send_counts))                      # per source [rows, H]
    xr = xp.concatenate(xr, axis=0)                                                # [R, H] receive layout
    H = h.shape[1]
    ys = backend.zeros((xr.shape[0], H), np.float32)
    if xr.shape[0]:
        xs = xp.take(xr, backend.asarray(recv.order), axis=0)                      # [R, H] expert-major
        ys = _experts(xs, layer, backend.asarray(recv.offsets), xs.shape[0], len(recv.offsets) - 1)
    ys_recv = xp.take(ys, backend.asarray(recv.slot), axis=0)                      # [R, H] receive layout
    back = comm.all_to_all_v(_split(ys_recv, recv.recv_counts))                    # per destination, send order
    ys_sent = xp.concatenate(back, axis=0)                                         # [A, H] = expert-major
    return moe_routing.combine(ys_sent, w, backend.asarray(send.slot), out=Target._shared_expert(layer, shared_gu))


# ------------------------------------------------------------------------------------------------ Target level
class ExpertParallelTarget(Target):
    """A Target whose MoE layers hold one rank's experts and run ``ep_moe`` over ``comm``; every other weight
    array is shared with the source target (not copied). ``kd.generate`` runs on it unchanged; every rank must
    make the same calls in the same order (greedy decoding and a deterministic drafter do). A sharded target of 2+
    ranks turns the process's GEMM timing off (``gemm_choice.TUNE = False``: the fixed rule, the same kernels on
    every rank), so the replicated layers agree bit for bit across ranks."""

    def __init__(self, target: Target, rank: int, world: int, comm: Communicator, reduce: str = "tokens"):
        if not isinstance(target, Target):
            raise ValueError(f"target: expected a kdtree_numba Target, got {type(target).__name__}")
        if isinstance(target, ExpertParallelTarget):
            raise ValueError("target: already sharded; shard the unsharded target")
        world = check_world(world)
        rank = check_rank(rank, world)
        expert_range(target.config.n_routed_experts, rank, world)                    # divisibility
        if comm is None or comm.world_size != world or comm.rank != rank:
            got = "None" if comm is None else f"rank {comm.rank} of {comm.world_size}"
            raise ValueError(f"comm: expected a communicator for rank {rank} of {world}, got {got}")
        if reduce not in REDUCE_MODES:
            raise ValueError(f"reduce: expected one of {REDUCE_MODES}, got {reduce!r}")
        with backend.use(target.backend):
            layers = [shard_experts(L, rank, world) if "gate" in L else L for L in target.layers]
            super().__init__(target.config, target.w, layers)
        self.tokenizer = target.tokenizer
        self.rank, self.world, self.comm, self.reduce = rank, world, comm, reduce
        if world > 1:               # the ranks replicate the router, attention and LM head and must compute them
            gemm_choice.TUNE = False  # bit for bit alike: a kernel timed fastest per process may differ by rank

    def _moe(self, L, h, out=None):
        return ep_moe(h, L, self.config, self.comm, reduce=self.reduce, out=out)

    def state_dict(self):
        raise ValueError(f"state_dict: rank {self.rank} holds only {self.config.n_routed_experts // self.world} "
                         f"of the {self.config.n_routed_experts} experts; save the unsharded target")

    def with_backend(self, name: str):
        if name == self.backend:
            return self
        raise ValueError(f"name: a sharded target stays on its backend {self.backend!r}")


def shard_target(target: Target, rank: int, world: int, comm: Communicator | None = None,
                 reduce: str = "tokens") -> ExpertParallelTarget:
    """Rank ``rank`` of ``world``'s expert-parallel view of ``target`` (only MoE experts are split). ``comm``
    may be omitted for world 1 (a one-rank FakeCommunicator)."""
    if comm is None and check_world(world) == 1:
        comm = FakeGroup(1).communicators()[0]
    return ExpertParallelTarget(target, rank, world, comm, reduce)
