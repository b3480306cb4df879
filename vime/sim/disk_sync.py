"""Weight sync through disk in the simulator (``--update-weight-mode disk``): the twins of `vime.real.weights.disk`'s wrappers.

The real run puts two wrappers around its backends (`vime.real.weights.disk`): the trainer's
``export_weights`` writes ``v<N>/`` and yields ONE bucket naming it; an engine's
``start_weight_update`` / ``update_weights`` only check the lifecycle and remember the directory,
and ``finish_weight_update(v)`` makes the server reload from it in place and stamps v. These two do
the same on simulated backends, with the profile's `vime.sim.hardware_parts.DiskCosts`:

- `SimDiskSyncTrainer.export_weights`: the trainer's call (`Efficiency.trainer_call_s`), then
  ``disk.write_seconds(model bytes)``, then one `WeightBucket` with every HF tensor's name and shape;
- `SimDiskSyncEngine.finish_weight_update(v)`: an HTTP round trip for ``/collective_rpc
  reload_weights`` plus ``disk.reload_seconds(bucket bytes)``, another for ``/update_weight_version``;
  the lifecycle goes through start → finish on the wrapped engine's table, as the real client's does.

The publication sequence (`vime.weight_sync.publish_weights`) and the protocols are unchanged, so
the orchestrator's calls are the same in both worlds; only where the time goes differs from tensor mode.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from vime.engine_delegate import DelegatingEngine
from vime.errors import ConfigError
from vime.protocols import WeightBucket
from vime.sim.memory import elapse

_DTYPE_NAMES = {4: "float32", 2: "bfloat16", 1: "float8_e4m3fn"}


class SimDiskSyncTrainer:
    """A simulated `vime.protocols.Trainer` whose `export_weights` writes one version and yields one bucket naming it.

    Everything else is the wrapped `SimTrainer`'s (attributes included, through ``__getattr__``).
    """

    def __init__(self, trainer: Any) -> None:
        self.inner = trainer
        self.written = 0

    @property
    def lifecycle(self) -> Any:
        return self.inner.lifecycle

    def __getattr__(self, name: str) -> Any:
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    async def train(self, rollout_id: int, batch: Any) -> Any:
        return await self.inner.train(rollout_id, batch)

    async def sleep(self) -> None:
        await self.inner.sleep()

    async def wake_up(self) -> None:
        await self.inner.wake_up()

    async def save_checkpoint(self, rollout_id: int, path: str) -> None:
        await self.inner.save_checkpoint(rollout_id, path)

    async def load_checkpoint(self, path: str) -> int:
        return int(await self.inner.load_checkpoint(path))

    async def export_weights(self, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
        """Write the next version (the profile's disk write cost) and yield the one bucket that names it (seed step 48)."""
        tr = self.inner
        tr.lifecycle.check("export_weights")
        env = tr.cluster.env
        t0 = float(env.now)
        await tr._call()
        shapes = tr.model.hf_weight_shapes()
        nbytes = tr.export_bytes()
        await elapse(env, tr.hw.disk.write_seconds(nbytes))
        self.written += 1
        tr.cluster.recorder.span(tr.name, "write_version", t0, float(env.now), nbytes=nbytes)
        dtype = _DTYPE_NAMES.get(tr.model.dtype_bytes, "bfloat16")
        yield WeightBucket(names=[n for n, _ in shapes], dtype_names=[dtype] * len(shapes),
                           shapes=[list(s) for _, s in shapes], nbytes=nbytes, index=0)


class SimDiskSyncEngine(DelegatingEngine):
    """A simulated `vime.protocols.RolloutEngine` that loads published weights "from disk" (wraps a `SimEngine`).

    It shares the wrapped engine's `lifecycle`; generation, sleep, wake, pause and flush are the engine's.
    """

    def __init__(self, engine: Any) -> None:
        self.inner = engine
        self.name = engine.name
        self.lifecycle = engine.lifecycle
        self._pending: WeightBucket | None = None
        self.loaded: list[int] = []

    # --- weights: the disk path ------------------------------------------------------------------
    async def start_weight_update(self) -> None:
        """Open the session locally (seed step 47, disk mode): the server is only contacted at finish."""
        self.inner._alive("start_weight_update")
        self.lifecycle.check_start_update()
        self.lifecycle.on_start_update()
        self._pending = None

    async def update_weights(self, bucket: WeightBucket) -> None:
        """Remember the version's bucket (seed steps 48–50, disk mode)."""
        self.lifecycle.check_update()
        if self._pending is not None:
            raise ConfigError(f"engine {self.name}: one disk publication is one directory, got a second bucket")
        self._pending = bucket

    async def finish_weight_update(self, version: int) -> None:
        """Reload from the version's directory in place and stamp `version` (seed step 51, disk mode)."""
        eng = self.inner
        lc = self.lifecycle
        lc.check_finish_update(version)
        bucket = self._pending
        if bucket is None:
            raise ConfigError(f"engine {self.name}: finish_weight_update({version}) with no directory; the "
                              f"trainer exported nothing")
        self._pending = None
        env = eng.env
        t0 = float(env.now)
        eng._alive("finish_weight_update")
        rtt = eng.settings.http_rtt_s
        await elapse(env, rtt + eng.hardware.disk.reload_seconds(bucket.nbytes))  # /collective_rpc reload_weights
        await elapse(env, rtt)  # /update_weight_version
        lc.on_finish_update(version)
        self.loaded.append(version)
        if eng.observer is not None:
            eng.observer.on_call(self.name, "reload_weights_from_disk", t0, float(env.now))


def wrap_disk_sync(engines: Sequence[Any], trainer: Any) -> tuple[list[Any], Any]:
    """The disk-mode wrappers around simulated engines and trainer (what `vime.real.session` does in disk mode)."""
    return [SimDiskSyncEngine(e) for e in engines], SimDiskSyncTrainer(trainer)


__all__ = ["SimDiskSyncEngine", "SimDiskSyncTrainer", "wrap_disk_sync"]
