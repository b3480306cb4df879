"""The trainer's IPC export path through real Megatron actors on Ray (CPU: staged tensors instead of handles): TP shards gathered, buckets published, staging reused (seed steps 45–52)."""

from __future__ import annotations

import asyncio

import pytest
import torch

from vime.real.megatron import model as mmodel
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.trainer import MegatronTrainer
from vime.real.weights import ipc as iw
from vime.weight_sync import publish_weights

pytestmark = pytest.mark.megatron


class _Engine:
    """Copies what it is given, as vLLM's load_weights does (the staging buffer is reused afterwards)."""

    def __init__(self) -> None:
        self.weights: dict[str, torch.Tensor] = {}
        self.loaded: list[int] = []

    async def pause(self, mode):
        pass

    async def flush_cache(self):
        pass

    async def start_weight_update(self):
        pass

    async def update_weights(self, bucket):
        assert bucket.ipc_handles is None and bucket.names == list(bucket.tensors)
        self.weights.update({n: t.clone() for n, t in bucket.tensors.items()})
        self.loaded.append(bucket.index)

    async def finish_weight_update(self, version):
        pass

    async def resume(self):
        pass


@pytest.fixture(scope="module")
def tp2(ray_local, tiny_hf_dir):
    cfg = ActorConfig(hf_config=mmodel.load_hf_config(str(tiny_hf_dir)), hf_checkpoint=str(tiny_hf_dir), seed=3,
                      tensor_model_parallel_size=2)
    trainer = MegatronTrainer.launch(cfg, 2, actor_num_cpus=0.25)
    yield trainer
    trainer.shutdown()


def test_ipc_export_publishes_the_gathered_weights_and_reuses_the_staging_buffers(tp2):
    assert tp2.weight_transport == "tensors"  # no GPU, no engines: the CPU path stays the default
    bucket_bytes = 48 * 1024

    async def reference():
        return {n: t for b in [b async for b in tp2.export_weights(bucket_bytes)] for n, t in b.tensors.items()}

    want = asyncio.run(reference())
    tp2.weight_transport = "ipc"
    try:
        engines = [_Engine(), _Engine()]
        report = asyncio.run(publish_weights(tp2, engines, 2, flush_cache=True, bucket_bytes=bucket_bytes))
        info = asyncio.run(tp2.call("ipc_export_info"))
        report2 = asyncio.run(publish_weights(tp2, engines, 3, flush_cache=False, bucket_bytes=bucket_bytes))
        info2 = asyncio.run(tp2.call("ipc_export_info"))
    finally:
        tp2.weight_transport = "tensors"
    plan = iw.plan_buckets(iw.specs_of(want), bucket_bytes)
    assert report.buckets == report2.buckets == len(plan) > 1
    assert report.bytes_per_engine == sum(t.nbytes for t in want.values())
    for e in engines:
        assert e.loaded == list(range(len(plan))) * 2
        assert e.weights.keys() == want.keys()
        for name, t in want.items():
            assert torch.equal(e.weights[name], t), name
    # every rank staged (TP rank 1 too) into one buffer, sized once for the largest bucket and kept
    assert [i["allocations"] for i in info2] == [1, 1]
    assert info2 == info and all(i["capacity"] >= max(lay.span for lay in plan) for i in info)
