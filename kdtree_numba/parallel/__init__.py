"""Multi-GPU pieces (issue #17): expert parallelism for the MoE layers over N ranks.

communicator.py      the collectives (all_reduce, all_gather, all_to_all_v): FakeCommunicator (N ranks as
                     threads of one process, for CI) and NcclCommunicator (one process per GPU, cupy.cuda.nccl)
expert_parallel.py   shard the routed experts, the EP MoE layer (all-reduce path), the all-to-all dispatch
                     bookkeeping (NumPy reference), and ``shard_target`` for ``kd.generate``
launcher.py          ``python -m kdtree_numba.parallel --world N``: a greedy DDTree generation on N ranks checked
                     against a 1-rank run
"""
from .communicator import Communicator, FakeCommunicator, FakeGroup, NcclCommunicator, run_ranks
from .expert_parallel import (ExpertParallelTarget, dispatch_plan, ep_moe, ep_moe_all_to_all, expert_range,
                              receive_plan, shard_experts, shard_target)

__all__ = ["Communicator", "FakeCommunicator", "FakeGroup", "NcclCommunicator", "run_ranks", "ExpertParallelTarget",
           "dispatch_plan", "ep_moe", "ep_moe_all_to_all", "expert_range", "receive_plan", "shard_experts",
           "shard_target"]
