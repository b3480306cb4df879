"""Where the actor ranks sit: TP × PP × CP × DP sizes and the GPU of every rank, in Megatron's rank order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from vime.errors import ConfigError

if TYPE_CHECKING:
    from vime.config import ClusterConfig, ParallelConfig


@dataclass(frozen=True)
class Layout:
    """Where the actor ranks sit: sizes of each parallel dimension and the GPU of every rank."""

    tp: int
    pp: int
    cp: int
    dp: int
    gpus: tuple[int, ...]  # cluster GPU index of global rank r
    gpus_per_node: int = 8

    @property
    def dp_crosses_nodes(self) -> bool:
        """Whether a DP×CP group (stride TP) spans more than one node: its collectives use the network."""
        return self.tp * self.cp * self.dp > self.gpus_per_node

    @property
    def tp_crosses_nodes(self) -> bool:
        return self.tp > self.gpus_per_node

    @property
    def world(self) -> int:
        return self.tp * self.pp * self.cp * self.dp

    def coords(self, rank: int) -> tuple[int, int, int, int]:
        """(tp, cp, dp, pp) coordinates of a global rank (Megatron order tp-cp-dp-pp)."""
        tp = rank % self.tp
        cp = (rank // self.tp) % self.cp
        dp = (rank // (self.tp * self.cp)) % self.dp
        pp = rank // (self.tp * self.cp * self.dp)
        return tp, cp, dp, pp

    def ranks_of_dp(self, dp_rank: int) -> list[int]:
        return [r for r in range(self.world) if self.coords(r)[2] == dp_rank]

    @classmethod
    def of(cls, placement: ClusterConfig, parallel: ParallelConfig, num_gpus: int) -> Layout:
        """The trainer's ranks from ``--actor-num-nodes/--actor-num-gpus-per-node`` and the parallel sizes."""
        tp = parallel.tensor_model_parallel_size
        pp = parallel.pipeline_model_parallel_size
        cp = parallel.context_parallel_size
        world = placement.actor_num_nodes * placement.actor_num_gpus_per_node
        if world % (tp * pp * cp):
            raise ConfigError(f"actor GPUs {world} (--actor-num-nodes × --actor-num-gpus-per-node) is not a "
                              f"multiple of TP×PP×CP = {tp}×{pp}×{cp}; change the parallel sizes")
        if world > num_gpus:
            raise ConfigError(f"the trainer needs {world} GPUs but the simulated cluster has {num_gpus}")
        return cls(tp, pp, cp, world // (tp * pp * cp), tuple(range(world)), placement.actor_num_gpus_per_node)
