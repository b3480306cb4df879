"""Disk weight sync (issue 8): versioned HF safetensors directories, the trainer and engine wrappers, the publication over a fake vLLM."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from fake_vllm import FakeVLLM
from safetensors.torch import load_file

from vime.errors import ConfigError, EngineError, LifecycleError
from vime.protocols import EngineLifecycle, TrainerLifecycle, WeightBucket
from vime.real.vllm.client import VLLMEngine
from vime.real.weights.disk import (
    INDEX_FILE,
    DiskSyncEngine,
    DiskSyncTrainer,
    DiskWeightBucket,
    prune_versions,
    version_dir,
    write_version,
)
from vime.weight_sync import publish_weights


def _weights(scale: float = 1.0) -> dict[str, torch.Tensor]:
    return {"model.embed_tokens.weight": torch.arange(12, dtype=torch.float32).reshape(4, 3) * scale,
            "model.norm.weight": torch.ones(3) * scale,
            "model.layers.0.mlp.up_proj.weight": torch.full((2, 3), scale, dtype=torch.bfloat16)}


def _read_dir(path: Path) -> dict[str, torch.Tensor]:
    index = json.loads((path / INDEX_FILE).read_text())
    out: dict[str, torch.Tensor] = {}
    for fname in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(path / fname)))
    assert set(out) == set(index["weight_map"])
    return out


def test_write_version_is_a_complete_checkpoint(tmp_path):
    template = tmp_path / "hf"
    template.mkdir()
    (template / "config.json").write_text('{"model_type": "qwen3"}')
    (template / "tokenizer.json").write_text("{}")
    (template / "model.safetensors").write_bytes(b"old weights, never copied")
    w = _weights()
    shards = [{k: w[k] for k in list(w)[:2]}, {k: w[k] for k in list(w)[2:]}]
    path, summary = write_version(tmp_path / "root", 3, shards, template=template)
    assert path == version_dir(tmp_path / "root", 3) == tmp_path / "root" / "v3"
    got = _read_dir(path)
    assert set(got) == set(w) and all(torch.equal(got[k], w[k]) for k in w)
    assert got["model.layers.0.mlp.up_proj.weight"].dtype == torch.bfloat16
    assert summary["names"] == list(w)
    assert summary["nbytes"] == sum(t.numel() * t.element_size() for t in w.values())
    assert summary["dtype_names"] == ["float32", "float32", "bfloat16"]
    assert sorted(p.name for p in path.iterdir()) == sorted(
        ["config.json", "tokenizer.json", INDEX_FILE, "model-00000.safetensors", "model-00001.safetensors"])
    assert [p.name for p in (tmp_path / "root").iterdir()] == ["v3"], "no temporary directory left behind"
    assert json.loads((path / INDEX_FILE).read_text())["metadata"]["vime_weight_version"] == 3


def test_write_version_refuses_duplicates_and_empty_exports_and_leaves_nothing(tmp_path):
    w = _weights()
    with pytest.raises(ConfigError, match="exported twice"):
        write_version(tmp_path, 1, [w, {"model.norm.weight": w["model.norm.weight"]}])
    with pytest.raises(ConfigError, match="no weights"):
        write_version(tmp_path, 2, [{}])
    assert list(tmp_path.iterdir()) == []


def test_prune_keeps_the_newest(tmp_path):
    for v in range(1, 6):
        write_version(tmp_path, v, [_weights(v)])
    (tmp_path / "other").mkdir()
    removed = prune_versions(tmp_path, 2, newest=5)
    assert sorted(p.name for p in removed) == ["v1", "v2", "v3"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "v4", "v5"]


# --------------------------------------------------------------------------------------------
# Wrappers over fakes that record the call order
# --------------------------------------------------------------------------------------------


class FakeTrainer:
    """Exports its weights in buckets with tensors (like MegatronTrainer on CPU)."""

    def __init__(self, events: list[str]) -> None:
        self.lifecycle = TrainerLifecycle()
        self.events = events
        self.scale = 1.0

    async def export_weights(self, bucket_bytes: int):
        self.events.append("export")
        w = _weights(self.scale)
        for i, (name, t) in enumerate(w.items()):
            yield WeightBucket([name], [str(t.dtype)], [list(t.shape)], t.numel() * t.element_size(),
                               tensors={name: t}, index=i)

    def shutdown(self) -> None:
        self.events.append("shutdown")


class FakeDiskEngine:
    """Stands in for VLLMEngine: the lifecycle calls it makes and what it loaded."""

    def __init__(self, name: str, events: list[str]) -> None:
        self.name = name
        self.lifecycle = EngineLifecycle(name)
        self.events = events
        self.loaded: dict[str, torch.Tensor] = {}

    async def pause(self, mode):
        self.events.append(f"{self.name}.pause({mode})")
        self.lifecycle.on_pause(mode)

    async def flush_cache(self):
        self.lifecycle.check_flush()
        self.events.append(f"{self.name}.flush")

    async def resume(self):
        self.events.append(f"{self.name}.resume")
        self.lifecycle.on_resume()

    async def reload_weights_from_disk(self, path: str, version: int) -> None:
        self.lifecycle.check_start_update()  # the same sequence VLLMEngine.reload_weights_from_disk runs
        self.lifecycle.on_start_update()
        self.lifecycle.check_finish_update(version)
        self.loaded = _read_dir(Path(path))
        self.events.append(f"{self.name}.reload({Path(path).name},{version})")
        self.lifecycle.on_finish_update(version)


def test_publication_writes_once_and_every_engine_reloads_then_stamps(tmp_path):
    events: list[str] = []
    inner = FakeTrainer(events)
    trainer = DiskSyncTrainer(inner, tmp_path / "w", first_version=1, keep=2)
    fakes = [FakeDiskEngine(f"e{i}", events) for i in range(2)]
    engines = [DiskSyncEngine(e) for e in fakes]
    assert engines[0].lifecycle is fakes[0].lifecycle

    async def main():
        reports = []
        for v in (1, 2, 3):
            inner.scale = float(v)
            events.append(f"-- v{v}")
            reports.append(await publish_weights(trainer, engines, v, flush_cache=True, bucket_bytes=64))
        return reports

    reports = asyncio.run(main())
    assert [r.buckets for r in reports] == [1, 1, 1], "a disk publication is one bucket naming a directory"
    assert reports[0].bytes_per_engine == sum(t.numel() * t.element_size() for t in _weights().values())
    first = events[:events.index("-- v2")]
    assert first == ["-- v1", "e0.pause(abort)", "e1.pause(abort)", "e0.flush", "e1.flush", "export",
                     "e0.reload(v1,1)", "e1.reload(v1,1)", "e0.resume", "e1.resume"]
    for f, e in zip(fakes, engines, strict=True):
        assert f.lifecycle.weight_version == 3 and not f.lifecycle.updating
        assert torch.equal(f.loaded["model.norm.weight"], torch.ones(3) * 3)
        assert [v for v, _ in e.loaded] == [1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "w").iterdir()) == ["v2", "v3"]
    assert trainer.lifecycle is inner.lifecycle
    trainer.shutdown()  # delegated to the wrapped trainer
    assert events[-1] == "shutdown"


def test_engine_refuses_tensor_buckets_and_mismatched_versions(tmp_path):
    events: list[str] = []
    eng = DiskSyncEngine(FakeDiskEngine("e0", events))

    async def tensor_bucket():
        await eng.start_weight_update()
        await eng.update_weights(WeightBucket(["a"], ["float32"], [[1]], 4, tensors={"a": torch.zeros(1)}))

    with pytest.raises(ConfigError, match="DiskSyncTrainer"):
        asyncio.run(tensor_bucket())

    path, _ = write_version(tmp_path, 5, [_weights()])

    async def wrong_version():
        eng.lifecycle.updating = False
        await eng.start_weight_update()
        await eng.update_weights(DiskWeightBucket([], [], [], 0, path=str(path), version=5))
        await eng.finish_weight_update(4)

    with pytest.raises(ConfigError, match="first_version"):
        asyncio.run(wrong_version())

    async def missing_dir():
        eng.lifecycle.updating = False
        await eng.start_weight_update()
        await eng.update_weights(DiskWeightBucket([], [], [], 0, path=str(tmp_path / "gone"), version=1))
        await eng.finish_weight_update(1)

    with pytest.raises(EngineError, match="does not exist"):
        asyncio.run(missing_dir())

    with pytest.raises(LifecycleError):
        asyncio.run(DiskSyncEngine(FakeDiskEngine("e1", events)).update_weights(
            DiskWeightBucket([], [], [], 0, path=str(path), version=1)))
    assert not any("reload" in e for e in events)


def test_engine_without_disk_reload_is_refused():
    class Plain:
        name = "plain"
        lifecycle = EngineLifecycle("plain")

    with pytest.raises(ConfigError, match="reload_weights_from_disk"):
        DiskSyncEngine(Plain())


def test_over_http_the_reload_is_a_collective_rpc_then_a_version_label(tmp_path):
    """Against a fake vLLM 0.32: the wire calls of one disk publication, in order."""
    fake = FakeVLLM()
    events: list[str] = []
    trainer = DiskSyncTrainer(FakeTrainer(events), tmp_path, template=None)

    async def main():
        async with VLLMEngine("engine0", "http://vllm", transport=fake.transport()) as raw:
            eng = DiskSyncEngine(raw)
            await publish_weights(trainer, [eng], 1, flush_cache=True, bucket_bytes=1 << 20)
            await publish_weights(trainer, [eng], 2, flush_cache=False, bucket_bytes=1 << 20)
            return await eng.weight_version()

    assert asyncio.run(main()) == "2"
    paths = fake.paths()
    assert paths[:5] == ["/pause", "/reset_prefix_cache", "/collective_rpc", "/update_weight_version", "/resume"]
    assert paths[5:9] == ["/pause", "/collective_rpc", "/update_weight_version", "/resume"]
    rpc = [c for c in fake.calls if c.path == "/collective_rpc"]
    assert [c.body["method"] for c in rpc] == ["reload_weights", "reload_weights"]
    assert [Path(c.body["kwargs"]["weights_path"]).name for c in rpc] == ["v1", "v2"]
    assert ("mode", "keep") in fake.calls[5].params, "no flush → pause keeps requests in place"
