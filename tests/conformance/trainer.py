"""Conformance checks for any `vime.protocols.Trainer` (simulated or real), driven through a factory.

The factory returns a `TrainerSubject` whose trainer is initialised and awake, a coroutine
runner (virtual clock or asyncio.run), a batch maker for a rollout id, and the number of bytes a
full weight export must yield (the model in the dtype the trainer exports), and where a
checkpoint may be written. Each `check_*` builds a fresh subject (an implementation too costly to
start per check may hand back the same trainer, brought back to awake).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

import pytest

from vime.errors import LifecycleError
from vime.protocols import Trainer, TrainerState, TrainMetrics, WeightBucket


@dataclass
class TrainerSubject:
    trainer: Any
    run: Callable[[Coroutine[Any, Any, Any]], Any]
    make_batch: Callable[[int], Any]
    export_bytes: int
    #: Where check_checkpoint_round_trip saves (a real trainer writes files there; the simulator only keys on it).
    checkpoint_dir: str = "ckpt"


Factory = Callable[[], TrainerSubject]


async def _collect(trainer: Any, bucket_bytes: int) -> list[WeightBucket]:
    return [b async for b in trainer.export_weights(bucket_bytes)]


def check_is_trainer(make: Factory) -> None:
    s = make()
    assert isinstance(s.trainer, Trainer)
    assert s.trainer.lifecycle.state is TrainerState.AWAKE


def check_train_reports_the_batch(make: Factory) -> None:
    s = make()
    batch = s.make_batch(5)
    metrics = s.run(s.trainer.train(5, batch))
    assert isinstance(metrics, TrainMetrics)
    assert metrics.rollout_id == 5
    assert metrics.num_steps == len(batch.num_microbatches)
    assert metrics.tokens == sum(sum(m) for m in batch.loss_masks)
    assert all(math.isfinite(v) for v in (metrics.loss, metrics.grad_norm, metrics.entropy, metrics.pg_clipfrac))


def check_lifecycle_misuse_raises(make: Factory) -> None:
    s = make()
    batch = s.make_batch(0)
    with pytest.raises(LifecycleError):
        s.run(s.trainer.wake_up())
    s.run(s.trainer.sleep())
    assert s.trainer.lifecycle.state is TrainerState.ASLEEP
    with pytest.raises(LifecycleError):
        s.run(s.trainer.train(0, batch))
    with pytest.raises(LifecycleError):
        s.run(s.trainer.sleep())
    s.run(s.trainer.wake_up())
    assert s.run(s.trainer.train(0, batch)).rollout_id == 0


def check_export_buckets(make: Factory, bucket_bytes: int = 64 * 1024**2) -> None:
    """Buckets respect the size (a larger tensor travels alone), cover the model once, work asleep."""
    s = make()
    awake = s.run(_collect(s.trainer, bucket_bytes))
    s.run(s.trainer.sleep())
    asleep = s.run(_collect(s.trainer, bucket_bytes))
    for buckets in (awake, asleep):
        assert [b.index for b in buckets] == list(range(len(buckets)))
        assert sum(b.nbytes for b in buckets) == s.export_bytes
        names = [n for b in buckets for n in b.names]
        assert len(names) == len(set(names))
        for b in buckets:
            assert len(b.names) == len(b.shapes) == len(b.dtype_names) > 0
            assert b.nbytes <= bucket_bytes or len(b.names) == 1
    assert [b.names for b in awake] == [b.names for b in asleep]


def check_checkpoint_round_trip(make: Factory) -> None:
    s = make()
    path = f"{s.checkpoint_dir}/iter_3"
    s.run(s.trainer.save_checkpoint(3, path))
    assert s.run(s.trainer.load_checkpoint(path)) == 4


ALL_CHECKS: tuple[Callable[[Factory], None], ...] = (
    check_is_trainer,
    check_train_reports_the_batch,
    check_lifecycle_misuse_raises,
    check_export_buckets,
    check_checkpoint_round_trip,
)
