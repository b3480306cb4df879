"""Experiment trackers for `vime train`: each step's metrics (perf/…, rollout/…, train/…, eval/…) to wandb and TensorBoard, one step per rollout id.

Both receive the same flat metric names (`StepReport.metrics`). wandb runs in the mode
``--wandb-mode`` asks for (``offline`` writes a run directory that ``wandb sync`` uploads later,
with no network); TensorBoard writes an event file with tensorboard's own writer, so neither
needs torch. The packages are the ``[log]`` extra; a flag whose package is missing is refused
when the run starts, before any backend does work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vime.errors import ConfigError

if TYPE_CHECKING:
    from vime.config import LoggingConfig


class WandbTracker:
    """One wandb run: `log(metrics, step)` per rollout, `close()` at the end."""

    def __init__(self, cfg: LoggingConfig, run_config: Mapping[str, Any]) -> None:
        try:
            import wandb
        except ImportError as exc:
            raise ConfigError("--use-wandb needs the wandb package: pip install 'vime[log]'") from exc
        os.environ.setdefault("WANDB_SILENT", "true")
        kwargs = self.init_kwargs(cfg, run_config)
        os.makedirs(kwargs["dir"], exist_ok=True)
        self.run = wandb.init(**kwargs)
        self.path = getattr(self.run, "dir", kwargs["dir"])

    @staticmethod
    def init_kwargs(cfg: LoggingConfig, run_config: Mapping[str, Any]) -> dict[str, Any]:
        """What `wandb.init` is called with, from the --wandb-* flags."""
        return {"mode": cfg.wandb_mode, "dir": cfg.wandb_dir or os.getcwd(), "project": cfg.wandb_project,
                "group": cfg.wandb_group, "name": cfg.wandb_run_name, "config": dict(run_config),
                "reinit": "create_new"}

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        import wandb

        self.run.finish()
        # finish() can return before wandb's service has written the last records of an offline run
        # (its history came back empty 1 time in 6 here); teardown waits for the service to exit.
        wandb.teardown()


class TensorBoardTracker:
    """One TensorBoard event file in ``--tensorboard-dir`` (default $TENSORBOARD_DIR, else ./tensorboard)."""

    def __init__(self, cfg: LoggingConfig) -> None:
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as exc:
            raise ConfigError("--use-tensorboard needs the tensorboard package: pip install 'vime[log]'") from exc
        self.path = self.directory(cfg)
        os.makedirs(self.path, exist_ok=True)
        self.writer = EventFileWriter(self.path)

    @staticmethod
    def directory(cfg: LoggingConfig) -> str:
        """Where the event file goes: --tensorboard-dir, else $TENSORBOARD_DIR, else ./tensorboard."""
        return cfg.tensorboard_dir or os.environ.get("TENSORBOARD_DIR") or "tensorboard"

    def log(self, metrics: dict[str, float], step: int) -> None:
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=k, simple_value=float(v)) for k, v in sorted(metrics.items())]
        self.writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=values)))
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Trackers:
    """The trackers the flags turn on; `step(report)` logs a StepReport's metrics under its rollout id."""

    def __init__(self, trackers: Sequence[Any] = ()) -> None:
        self.trackers = list(trackers)

    @classmethod
    def from_config(cls, cfg: LoggingConfig, run_config: Mapping[str, Any]) -> Trackers:
        """The trackers ``--use-wandb`` / ``--use-tensorboard`` ask for; wandb records `run_config` (every option)."""
        make = {"wandb": lambda: WandbTracker(cfg, run_config), "tensorboard": lambda: TensorBoardTracker(cfg)}
        return cls([make[kind]() for kind in cls.kinds(cfg)])

    @staticmethod
    def kinds(cfg: LoggingConfig) -> list[str]:
        """The trackers the flags turn on, in order."""
        return [kind for kind, on in (("wandb", cfg.use_wandb), ("tensorboard", cfg.use_tensorboard)) if on]

    def step(self, report: Any) -> None:
        metrics = report.metrics()
        for t in self.trackers:
            t.log(metrics, int(report.rollout_id))

    def close(self) -> None:
        for t in self.trackers:
            t.close()
