"""The Megatron actor's weight calls (seed steps 41, 48–50): backup, HF export in buckets, CUDA-IPC staging, checkpoints."""

from __future__ import annotations

from typing import Any

import torch

from vime.protocols import WeightBucket
from vime.real.megatron.weights import ActorWeights


class WeightCalls:
    """`vime.real.megatron.actor.MegatronActor`'s weight calls, each handed to its `ActorWeights`."""

    def _weights(self) -> ActorWeights:
        raise NotImplementedError

    def backup_weights(self) -> None:
        """Copy this rank's parameter shards to the host backup that export reads (seed step 41)."""
        self._weights().backup()

    def hf_state(self, from_backup: bool = True) -> dict[str, torch.Tensor]:
        """HF-named full tensors (collective over TP: every TP rank must call it)."""
        return self._weights().hf_state(from_backup)

    def export_weights(self, bucket_bytes: int) -> list[WeightBucket]:
        """HF weights in buckets of at most `bucket_bytes` (seed step 48); collective, rank 0 gets them."""
        return self._weights().export_buckets(bucket_bytes)

    def ipc_export_begin(self, bucket_bytes: int) -> tuple[list[Any], str | None]:
        """Collective: plan the CUDA-IPC buckets of the backup; returns the plan and this rank's GPU UUID."""
        return self._weights().ipc_begin(bucket_bytes)

    def ipc_export_stage(self, index: int, ack: int | None) -> Any:
        """Stage bucket `index` once bucket `ack` is loaded by every engine (seed steps 48–50)."""
        return self._weights().ipc_stage(index, ack)

    def ipc_export_end(self, ack: int | None, abort: bool = False) -> None:
        self._weights().ipc_end(ack, abort)

    def ipc_export_info(self) -> dict[str, Any]:
        """The staging buffer's size, address and allocation count (tests check it is reused)."""
        return self._weights().ipc_info()

    def load_hf(self, path: str) -> None:
        """Load HF safetensors from `path` into this rank's shards."""
        self._weights().load_hf(path)

    def save_checkpoint(self, rollout_id: int, path: str) -> None:
        """Collective: HF weights, each rank's optimizer state, then `vime_state.json`."""
        self._weights().save_checkpoint(rollout_id, path)

    def load_checkpoint(self, path: str) -> int:
        """Load a `save_checkpoint` directory; returns the rollout id to resume from."""
        return self._weights().load_checkpoint(path)

    def last_load_info(self) -> str:
        """"optimizer restored" or "optimizer reset": what the last load_checkpoint did with Adam."""
        return self._weights().last_load
