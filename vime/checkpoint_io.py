"""The orchestrator's evaluation and checkpoint calls (seed steps around the loop): eval sets, save, load on start-up."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from vime.checkpoint import checkpoint_path, read_rollout_state, resolve_checkpoint, write_rollout_state

if TYPE_CHECKING:
    from vime.config import TrainConfig
    from vime.protocols import Trainer
    from vime.rollout.data_source import EvalSet
    from vime.rollout.generate import Rollout


class EvalAndCheckpoints:
    """`vime.orchestrator.Orchestrator`'s evaluation and checkpoints, apart from the step's sequence."""

    train_cfg: TrainConfig
    trainer: Trainer
    rollout: Rollout
    data_source: Any
    eval_sources: dict[str, EvalSet]
    weight_version: int
    initial_weight_version: int

    async def evaluate(self, rollout_id: int) -> dict[str, float]:
        """Generate on every evaluation set (no filter, no training) with the eval sampling params;
        metrics per set: ``NAME/reward``, ``NAME/response_len``, ``NAME/samples``."""
        sampling = {k: v for k, v in (("max_new_tokens", self.train_cfg.eval_max_response_len),
                                      ("temperature", self.train_cfg.eval_temperature),
                                      ("top_p", self.train_cfg.eval_top_p),
                                      ("top_k", self.train_cfg.eval_top_k)) if v is not None}
        out: dict[str, float] = {}
        for name, eval_set in self.eval_sources.items():
            result = await self.rollout.generate_rollout(rollout_id, eval_set.source, evaluation=True,
                                                         target_groups=eval_set.groups, sampling=sampling)
            samples = result.samples
            rewards = [float(s.reward) for s in samples if isinstance(s.reward, (int, float))]
            out[f"{name}/reward"] = sum(rewards) / len(rewards) if rewards else 0.0
            out[f"{name}/response_len"] = sum(s.response_length for s in samples) / len(samples) if samples else 0.0
            out[f"{name}/samples"] = float(len(samples))
        return out

    async def save(self, rollout_id: int) -> None:
        """Checkpoint through the trainer, plus the rollout state (data-source position, weight version)."""
        path = checkpoint_path(self.train_cfg.save, rollout_id)
        await self.trainer.save_checkpoint(rollout_id, path)
        write_rollout_state(self.train_cfg.save, path, {"rollout_id": rollout_id, "weight_version": self.weight_version,
                                                   "data_source": self.data_source.state_dict()})

    async def _load_checkpoint(self, report: Any) -> None:
        """With --load: the trainer's checkpoint and the rollout state; `report` (a StartupReport) gets the first rollout id."""
        if not self.train_cfg.load:
            return
        path = resolve_checkpoint(self.train_cfg.load)
        next_id = int(await self.trainer.load_checkpoint(path))
        state = read_rollout_state(path)
        if state is not None:
            self.data_source.load_state_dict(state["data_source"])
            # the version the saved rollout was trained from; start-up publishes the next one (seed step 8)
            self.weight_version = self.initial_weight_version = int(state["weight_version"])
            next_id = max(next_id, int(state["rollout_id"]) + 1)
        report.start_rollout_id = max(next_id, self.train_cfg.start_rollout_id)
