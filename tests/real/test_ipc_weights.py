"""CUDA-IPC weight export on CPU: bucket arithmetic, staging-buffer reuse, handle folding, the GPU → engine mapping, and a publish round trip (seed steps 45–52)."""

from __future__ import annotations

import asyncio
import base64
import pickle

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from vime.config.options import ClusterConfig
from vime.errors import ConfigError, TrainerError
from vime.placement import plan_placement
from vime.protocols import WeightBucket
from vime.real.megatron.trainer import MegatronTrainer
from vime.real.weights import ipc as iw
from vime.weight_sync import publish_weights


def _model_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """HF-named tensors of mixed dtypes and odd sizes (so alignment padding matters), one scalar."""
    g = torch.Generator().manual_seed(seed)
    return {
        "model.embed_tokens.weight": torch.randn(37, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.self_attn.qkv.weight": torch.randn(48, 16, generator=g).to(torch.bfloat16),
        "model.layers.0.input_layernorm.weight": torch.randn(16, generator=g),
        "model.layers.0.mlp.down_proj.weight": torch.randn(16, 33, generator=g).to(torch.float16),
        "model.layers.0.scale": torch.randn((), generator=g),
        "model.norm.weight": torch.randn(7, generator=g).to(torch.bfloat16),
    }


# --- plan arithmetic ------------------------------------------------------------------------------


def test_buckets_pad_to_the_alignment_and_split_at_the_limit():
    specs = [("a", "float32", [250]), ("b", "float32", [250]), ("c", "float32", [250])]  # 1000 B each
    plan = iw.plan_buckets(specs, 2048)
    assert [[s.name for s in lay.slots] for lay in plan] == [["a", "b"], ["c"]]
    assert [s.offset for s in plan[0].slots] == [0, 1024]  # b starts at the next 256-byte boundary
    assert plan[0].span == 2024 and plan[0].nbytes == 2000
    assert plan[1].slots[0].offset == 0 and plan[1].index == 1
    # Padding counts against the limit: at 2023 bytes a and b no longer fit together.
    assert [len(lay.slots) for lay in iw.plan_buckets(specs, 2023)] == [1, 1, 1]


def test_a_tensor_larger_than_the_bucket_travels_alone_and_whole():
    specs = [("small", "bfloat16", [10]), ("big", "float32", [100]), ("tail", "bfloat16", [10])]
    plan = iw.plan_buckets(specs, 100)
    assert [[s.name for s in lay.slots] for lay in plan] == [["small"], ["big"], ["tail"]]
    assert plan[1].span == 400


@pytest.mark.parametrize("specs, size, err, match", [
    ([("a", "float32", [4])], 0, ConfigError, "must be positive"),
    ([("a", "float32", [4]), ("a", "float32", [4])], 64, TrainerError, "exported twice"),
    ([("a", "floatx", [4])], 64, ConfigError, "not a torch dtype"),
])
def test_bad_plans_are_refused(specs, size, err, match):
    with pytest.raises(err, match=match):
        iw.plan_buckets(specs, size)


@given(sizes=st.lists(st.tuples(st.sampled_from(["bfloat16", "float32", "float16", "int64"]),
                                st.integers(0, 3000)), min_size=1, max_size=30),
       bucket=st.integers(1, 8192))
def test_plan_invariants(sizes, bucket):
    specs = [(f"t{i}", dt, [n]) for i, (dt, n) in enumerate(sizes)]
    plan = iw.plan_buckets(specs, bucket)
    slots = [s for lay in plan for s in lay.slots]
    assert [s.name for s in slots] == [n for n, _, _ in specs]  # every tensor once, in order
    assert [lay.index for lay in plan] == list(range(len(plan)))
    for lay in plan:
        assert lay.span <= bucket or len(lay.slots) == 1
        ends = 0
        for s in lay.slots:
            assert s.offset % iw.ALIGN == 0 and s.offset >= ends  # aligned, never overlapping
            assert s.nbytes == torch.empty(s.shape, dtype=iw.dtype_of(s.dtype)).nbytes
            ends = s.offset + s.nbytes
    # Greedy: the next bucket's first tensor did not fit after the previous bucket's last.
    for a, b in zip(plan, plan[1:], strict=False):
        assert -(-a.span // iw.ALIGN) * iw.ALIGN + b.slots[0].nbytes > bucket


# --- staging buffer -------------------------------------------------------------------------------


def test_staging_buffer_is_reused_and_grows_only_when_needed():
    buf = iw.StagingBuffer("cpu")
    buf.reserve(1000)
    first = buf.buffer.data_ptr()
    buf.reserve(1000)
    buf.reserve(10)
    assert buf.allocations == 1 and buf.buffer.data_ptr() == first
    buf.reserve(5000)
    assert buf.allocations == 2 and buf.capacity >= 5000


def test_views_outside_the_buffer_and_mismatched_tensors_are_refused():
    state = _model_state()
    plan = iw.plan_buckets(iw.specs_of(state), 1 << 20)
    buf = iw.StagingBuffer("cpu")
    with pytest.raises(TrainerError, match="reserve"):
        buf.views(plan[0])
    buf.reserve(plan[0].span)
    bad = dict(state)
    bad["model.norm.weight"] = torch.zeros(8, dtype=torch.bfloat16)
    with pytest.raises(TrainerError, match="re-plan"):
        buf.pack(plan[0], bad)
    del bad["model.norm.weight"]
    with pytest.raises(TrainerError, match="lacks"):
        buf.pack(plan[0], bad)


def test_exporter_reuses_one_buffer_across_buckets_and_steps_and_needs_acks():
    state = _model_state()
    ex = iw.IpcExporter("cpu")
    plan = ex.begin(state, 1500)
    assert len(plan) >= 3
    base = ex.staging.buffer.data_ptr()
    ex.stage(0)
    with pytest.raises(TrainerError, match="not acknowledged"):
        ex.stage(1)  # bucket 0 may still be read by an engine
    with pytest.raises(TrainerError, match="already open"):
        ex.begin(state, 1500)
    for i in range(1, len(plan)):
        views = ex.stage(i, ack=i - 1)
        assert all(base <= v.data_ptr() < base + ex.staging.capacity for v in views.values())
    with pytest.raises(TrainerError, match="not acknowledged"):
        ex.end()
    ex.end(ack=len(plan) - 1)
    with pytest.raises(TrainerError, match="before begin"):
        ex.stage(0)
    # the next step: the same bytes are reused, no new allocation
    ex.begin(_model_state(seed=1), 1500)
    ex.stage(0)
    ex.end(abort=True)  # a failed publication closes without the ack
    assert ex.staging.allocations == 1 and ex.staging.buffer.data_ptr() == base


@pytest.mark.parametrize("bias", [False, True])
def test_qkv_cut_where_it_is_staged_equals_the_host_split(bias):
    """The IPC export stages Megatron's fused QKV whole and cuts q, k, v from the staged copy: the bytes
    equal the host split, the plan sees HF shapes, and the fused tensor is moved once for its three pieces."""
    from vime.real.megatron import model as mmodel

    spec = mmodel.ModelSpec(model_type="qwen2", vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=1,
                            num_heads=4, num_kv_heads=2, head_dim=8, rms_norm_eps=1e-6, rope_theta=1e4,
                            max_position_embeddings=64, tie_word_embeddings=True, qk_norm=False, qkv_bias=bias)
    name = f"decoder.layers.0.self_attention.linear_qkv.{'bias' if bias else 'weight'}"
    fused = torch.randn((4 + 2 * 2) * 8, *(() if bias else (16,)), generator=torch.Generator().manual_seed(3))
    host = dict(mmodel.megatron_to_hf(spec, name, fused))
    cut = dict(mmodel.megatron_to_hf(spec, name, fused, cut_on_device=True))
    assert list(cut) == list(host) and all(isinstance(c, iw.DeviceCut) for c in cut.values())
    assert iw.specs_of(cut) == iw.specs_of(host)
    ex = iw.IpcExporter("cpu")
    plan = ex.begin(cut, host[next(iter(host))].numel() * 4)  # q fills a bucket: k and v come in later ones
    assert len(plan) >= 2 and [s.name for s in plan[0].slots] == [next(iter(host))]
    staged = {n: v.clone() for n, v in ex.stage(0).items()}  # the next bucket reuses the buffer
    assert ex.staging._fused[0] is fused  # kept for k and v
    for i in range(1, len(plan)):
        staged.update({n: v.clone() for n, v in ex.stage(i, ack=i - 1).items()})
    ex.end(ack=len(plan) - 1)
    assert ex.staging._fused is None  # the fused copy does not outlive the export
    for n, t in host.items():
        assert torch.equal(staged[n], t), n
        assert torch.equal(cut[n].materialize(), t), n


# --- handles, mapping -----------------------------------------------------------------------------


def test_rank_handles_fold_into_one_dict_per_tensor():
    per_rank = [("GPU-a", ["a0", "a1"]), ("GPU-b", ["b0", "b1"]), ("GPU-a", ["x0", "x1"])]
    assert iw.merge_rank_handles(per_rank, 2) == [{"GPU-a": "a0", "GPU-b": "b0"}, {"GPU-a": "a1", "GPU-b": "b1"}]
    with pytest.raises(TrainerError, match="same bucket plan"):
        iw.merge_rank_handles([("GPU-a", ["a0"])], 2)


@pytest.mark.parametrize("gpus, per_engine", [(8, 4), (8, 2), (4, 1), (2, 2)])
def test_each_engine_gpu_reads_the_trainer_rank_on_that_gpu(gpus, per_engine):
    plan = plan_placement(ClusterConfig(actor_num_nodes=1, actor_num_gpus_per_node=gpus, colocate=True,
                                rollout_num_gpus_per_engine=per_engine), use_gpus=True)
    ranks = iw.engine_gpu_ranks(plan.actor_bundles, plan.engine_bundles)
    assert len(ranks) == gpus // per_engine
    for k, group in enumerate(ranks):
        assert group == list(range(k * per_engine, (k + 1) * per_engine))


def test_engines_without_a_colocated_trainer_rank_are_refused():
    plan = plan_placement(ClusterConfig(actor_num_nodes=1, actor_num_gpus_per_node=2, colocate=False, rollout_num_gpus=2,
                                rollout_num_gpus_per_engine=1), use_gpus=True)
    with pytest.raises(ConfigError, match="colocated with a trainer rank"):
        iw.engine_gpu_ranks(plan.actor_bundles, plan.engine_bundles)


def test_coverage_check_names_the_missing_gpu():
    b = WeightBucket(names=["w"], dtype_names=["float32"], shapes=[[1]], nbytes=4, ipc_handles=[{"GPU-a": 1}])
    iw.check_coverage(b, {"GPU-a"})
    with pytest.raises(TrainerError, match="GPU-b"):
        iw.check_coverage(b, {"GPU-a", "GPU-b"})
    b.ipc_handles = []
    with pytest.raises(TrainerError, match="handle sets"):
        iw.check_coverage(b, {"GPU-a"})


def test_ipc_bucket_goes_out_in_the_update_info_format():
    from vime.real.vllm.client import VLLMEngine

    layout = iw.plan_buckets([("w", "bfloat16", [2, 3]), ("b", "float32", [3])], 1 << 20)[0]
    bucket = iw.fill_bucket(layout, [("GPU-a", [("h", 0), ("h", 1)]), ("GPU-b", [("h", 2), ("h", 3)])])
    info = VLLMEngine.update_info(bucket)
    assert info["names"] == ["w", "b"] and info["dtype_names"] == ["bfloat16", "float32"]
    assert info["shapes"] == [[2, 3], [3]]
    handles = pickle.loads(base64.b64decode(info["ipc_handles_pickled"]))
    assert handles == [{"GPU-a": ("h", 0), "GPU-b": ("h", 2)}, {"GPU-a": ("h", 1), "GPU-b": ("h", 3)}]


# --- round trip through the trainer's export and publish_weights ----------------------------------


class _Method:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def run():
            return self.fn(*args)
        return run()


class _FakeRank:
    """What a MegatronActor does for an IPC export, on CPU, with a given HF state."""

    def __init__(self, state):
        self.state = state
        self.ex = iw.IpcExporter("cpu")
        self.ipc_export_begin = _Method(lambda size: (self.ex.begin(self.state, size), None))
        self.ipc_export_stage = _Method(self.ex.stage)
        self.ipc_export_end = _Method(lambda ack, abort: self.ex.end(ack, abort=abort))


class _FakeEngine:
    """Loads every bucket it is given by copying, as vLLM's load_weights does; records the order of calls."""

    def __init__(self, log):
        self.log = log
        self.weights: dict[str, torch.Tensor] = {}

    async def pause(self, mode):
        self.log.append("pause")

    async def flush_cache(self):
        self.log.append("flush")

    async def start_weight_update(self):
        self.log.append("start")

    async def update_weights(self, bucket):
        await asyncio.sleep(0)  # let the other engine run in between: the bucket must still be intact
        for name, t in bucket.tensors.items():
            self.weights[name] = t.clone()
        self.log.append(f"load{bucket.index}")

    async def finish_weight_update(self, version):
        self.log.append(f"finish{version}")

    async def resume(self):
        self.log.append("resume")


def _trainer(ranks):
    t = MegatronTrainer(ranks, _Cfg(), ranks=[{"setup_s": 0.0, "tp_rank": 0, "dp_rank": 0}] * len(ranks),
                        weight_transport="ipc")
    return t


class _Cfg:
    tensor_model_parallel_size = 1


@pytest.mark.parametrize("bucket_bytes", [700, 1500, 1 << 20])
def test_published_weights_equal_the_model_and_the_buffer_is_reused(bucket_bytes):
    state = _model_state()
    ranks = [_FakeRank(state), _FakeRank(state)]
    trainer = _trainer(ranks)
    log: list[str] = []
    engines = [_FakeEngine(log), _FakeEngine(log)]
    report = asyncio.run(publish_weights(trainer, engines, 2, flush_cache=True, bucket_bytes=bucket_bytes))
    n = len(iw.plan_buckets(iw.specs_of(state), bucket_bytes))
    assert report.buckets == n and report.bytes_per_engine == sum(t.nbytes for t in state.values())
    for e in engines:
        assert set(e.weights) == set(state)
        for name, t in state.items():
            assert e.weights[name].dtype == t.dtype and torch.equal(e.weights[name], t), name
    assert [x for x in log if x.startswith("load")] == [f"load{i}" for i in range(n) for _ in engines]
    for r in ranks:
        assert r.ex.staging.allocations == 1 and r.ex.state is None and r.ex.outstanding is None
    # a second step with new weights: same buffers, engines get the new values
    new = _model_state(seed=5)
    for r in ranks:
        r.state = new
    before = [r.ex.staging.buffer.data_ptr() for r in ranks]
    asyncio.run(publish_weights(trainer, engines, 3, flush_cache=False, bucket_bytes=bucket_bytes))
    assert [r.ex.staging.buffer.data_ptr() for r in ranks] == before
    assert all(r.ex.staging.allocations == 1 for r in ranks)
    assert all(torch.equal(e.weights[k], new[k]) for e in engines for k in new)


def test_a_failed_publication_closes_the_export_on_every_rank():
    state = _model_state()
    ranks = [_FakeRank(state)]
    trainer = _trainer(ranks)

    class Broken(_FakeEngine):
        async def update_weights(self, bucket):
            raise RuntimeError("engine died")

    with pytest.raises(RuntimeError, match="engine died"):
        asyncio.run(publish_weights(trainer, [Broken([])], 2, flush_cache=True, bucket_bytes=700))
    assert ranks[0].ex.state is None and ranks[0].ex.outstanding is None
