"""SimTrainer: protocol conformance, per-rank memory by hand, timing by hand, OOM, recompute decision, determinism."""

from __future__ import annotations

import dataclasses
import math
import random
from typing import Any

import pytest
import simpy
from trainer_conformance import ALL_CHECKS, TrainerSubject

from vime.algo.dp_schedule import build_dp_schedule
from vime.config import parse_args
from vime.errors import ConfigError, OutOfMemoryError, TrainerError
from vime.protocols import ENGINE_TAGS, TAG_KV_CACHE
from vime.sim import clock
from vime.sim.hardware import load_hardware
from vime.sim.memory import GiB, SimAllocator, SimCluster
from vime.sim.models import load_model
from vime.sim.trainer import Layout, SimTrainer
from vime.sim.trainer.footprint import trainer_context_bytes
from vime.sim.trainer.sleep_extras import state_check_seconds
from vime.types import TrainBatch

H100 = load_hardware("H100-SXM-80G")


def loss_traffic_s(model: Any, tokens: int, tp: int) -> float:
    """vime's policy loss beyond Megatron's cross-entropy on one training micro-batch, by hand: 4 + 40 B per logit
    element forward (the transposed logits' copy, the entropy), 10 backward, at the streaming rate."""
    return tokens * model.vocab_size / tp * (4 + 40 + 10) / (H100.hbm_bytes_per_s * H100.efficiency.decode_bw_util)


def entropy_bytes(model: Any, tokens: int, tp: int) -> int:
    """The policy loss's entropy temporaries on one training micro-batch, by hand: the shifted fp32 logits, their
    exp and the product, 3 × 4 B per logit element of this rank's vocabulary slice."""
    return int(3 * 4 * model.vocab_size / tp * tokens)
QWEN3_4B = load_model("Qwen3-4B")
SMALL = load_model("Qwen3-0.6B")


def _args(*flags: str) -> Any:
    return parse_args(list(flags), command="simulate")


def _seed_args(**changes: Any) -> Any:
    """The seed's configuration; offload_train=False also un-colocates it (the parser requires that)."""
    if changes.get("offload_train") is False:
        changes = {"colocate": False, "rollout_num_gpus": 8, **changes}
    args = _args()
    return args.replace(**changes) if changes else args


def _batch(args: Any, rollout_id: int = 0, *, seed: int = 0, response_max: int = 1024,
           lengths: list[int] | None = None) -> TrainBatch:
    n = args.rollout_batch_size * args.n_samples_per_prompt
    rng = random.Random(seed)
    if lengths is None:
        prompts = [rng.randint(64, 512) for _ in range(n)]
        responses = [rng.randint(1, response_max) for _ in range(n)]
    else:
        prompts = [1] * n
        responses = [x - 1 for x in lengths]
    totals = [p + r for p, r in zip(prompts, responses, strict=True)]
    schedule = build_dp_schedule(totals, dp_size=args.data_parallel_size, micro_batch_size=args.micro_batch_size,
                                 global_batch_size=args.global_batch_size)
    rewards = [rng.choice([0.9354, -0.9354]) for _ in range(n)]
    return TrainBatch(rollout_id=rollout_id, tokens=[[0] * t for t in totals], response_lengths=responses,
                      loss_masks=[[1] * r for r in responses], raw_rewards=[1.0] * n, rewards=rewards,
                      total_lengths=totals, sample_indices=list(range(n)),
                      group_indices=[i // args.n_samples_per_prompt for i in range(n)], schedule=schedule)


def _trainer(args: Any, model=QWEN3_4B, hw=H100, gpus: int = 8, **kw: Any) -> tuple[SimTrainer, SimCluster]:
    cl = SimCluster.create(simpy.Environment(), hw, gpus)
    kw.setdefault("seed", args.seed)
    return SimTrainer(args.cluster, args.parallel, args.algo, model, cl, start_rollout_id=args.start_rollout_id,
                      **kw), cl


def _run(cl: SimCluster, coro: Any) -> Any:
    return clock.run(coro, env=cl.env)


# --------------------------------------------------------------------------------------------
# Conformance
# --------------------------------------------------------------------------------------------


def _subject(pinned: str) -> TrainerSubject:
    args = _args("--no-offload-train", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2",
                 "--rollout-batch-size", "4", "--n-samples-per-prompt", "4", "--micro-batch-size", "2",
                 "--no-colocate")
    tr, cl = _trainer(args, SMALL, gpus=2, pinned=pinned)
    _run(cl, tr.init())
    return TrainerSubject(tr, lambda coro: _run(cl, coro), lambda rid: _batch(args, rid, seed=rid),
                          SMALL.num_params() * 2)


@pytest.mark.parametrize("pinned", ["persistent", "cold"])
@pytest.mark.parametrize("check", ALL_CHECKS, ids=lambda c: c.__name__)
def test_sim_trainer_conforms(check, pinned):
    check(lambda: _subject(pinned))


# --------------------------------------------------------------------------------------------
# Memory
# --------------------------------------------------------------------------------------------


def test_seed_layout_is_tp2_dp4_with_megatron_rank_order():
    tr, _ = _trainer(_seed_args())
    lay = tr.layout
    assert (lay.tp, lay.pp, lay.cp, lay.dp) == (2, 1, 1, 4)
    assert [lay.coords(r)[:3] for r in range(4)] == [(0, 0, 0), (1, 0, 0), (0, 0, 1), (1, 0, 1)]
    assert lay.ranks_of_dp(3) == [6, 7]


def test_per_rank_state_by_hand_for_the_seed():
    """Qwen3-4B, TP 2: bf16 params 2 B, fp32 grads 4 B, fp32 master + m + v 12 B sharded over DP 4."""
    args = _seed_args(offload_train=False)
    tr, cl = _trainer(args)
    _run(cl, tr.init())
    p = (151936 * 2560 + 36 * (2560 * 4096 + 2 * 2560 * 1024 + 4096 * 2560 + 3 * 2560 * 9728)) // 2 \
        + 36 * (2 * 2560 + 256) + 2560
    for gpu in cl.gpus:
        assert gpu.used("actor", "params") == 2 * p
        assert gpu.used("actor", "grads") == 4 * p
        assert gpu.used("actor", "optimizer") == 12 * math.ceil(p / 4)
        assert gpu.used("actor", "context") == trainer_context_bytes(H100)
    assert cl.host.used("actor", "weight_backup") == 8 * 2 * p  # seed step 41: every rank backs up its shard


def test_without_distributed_optimizer_every_rank_holds_the_whole_adam_state():
    tr, _ = _trainer(_seed_args(use_distributed_optimizer=False))
    assert tr.state_bytes_per_gpu()["optimizer"] == [12 * QWEN3_4B.params_per_rank(2)] * 8


def test_offload_train_sleeps_after_init_and_wake_restores_it():
    tr, cl = _trainer(_seed_args())  # the seed colocates, so offload_train is on
    _run(cl, tr.init())
    assert tr.lifecycle.state.value == "asleep"
    assert cl.gpus[0].used("actor") == trainer_context_bytes(H100)
    awake = {k: v[0] for k, v in tr.state_bytes_per_gpu().items()}
    _run(cl, tr.wake_up())
    assert {t: cl.gpus[0].used("actor", t) for t in awake} == awake
    before = [g.used() for g in cl.gpus]
    _run(cl, tr.train(0, _batch(_seed_args())))
    # the activations' blocks stay in PyTorch's cache (the tag at its largest micro-batch) until the sleep
    assert [g.used() - g.used("actor", "activations") for g in cl.gpus] == before
    assert all(g.used("actor", "activations") > 0 for g in cl.gpus)
    _run(cl, tr.sleep())
    assert [g.used() for g in cl.gpus] == [trainer_context_bytes(H100)] * 8


def test_cold_pinned_host_memory_is_freed_on_wake_except_the_backup():
    tr, cl = _trainer(_seed_args(), pinned="cold")
    _run(cl, tr.init())
    backup = cl.host.used("actor", "weight_backup")
    assert cl.host.used() > backup
    _run(cl, tr.wake_up())
    assert cl.host.used() == backup


def test_activation_peak_is_one_micro_batch_and_grows_with_its_tokens():
    def peak(response_max: int) -> int:
        args = _seed_args(offload_train=False)
        tr, cl = _trainer(args)
        _run(cl, tr.init())
        _run(cl, tr.train(0, _batch(args, response_max=response_max)))
        return max(cl.gpus[g].peak("actor", "activations") for g in range(8))

    short, long = peak(128), peak(1024)
    assert 0 < short < long
    per_token = QWEN3_4B.activation_bytes_per_token(2)
    tokens = 8 * (512 + 1024)  # at most one micro-batch of 8 longest samples
    assert long <= per_token * tokens + entropy_bytes(QWEN3_4B, tokens, 2) + 1


def test_activation_oom_happens_at_the_micro_batch_that_does_not_fit():
    """Rank 0's second micro-batch is enormous: the OOM is at the end of its first micro-batch, tag activations."""
    args = _args("--no-colocate", "--no-offload-train", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus",
                 "2", "--tensor-model-parallel-size", "2", "--rollout-batch-size", "2", "--n-samples-per-prompt",
                 "1", "--micro-batch-size", "1", "--rollout-max-context-len", "65536",
                 "--rollout-max-response-len", "60000")
    tr, cl = _trainer(args, gpus=2)
    _run(cl, tr.init())
    small, huge = 1000, 60000
    batch = _batch(args, lengths=[small, huge])
    assert batch.micro_batch_indices[0] == [[0], [1]]
    t0 = cl.env.now
    flops = 3 * QWEN3_4B.sequence_flops(small) / (2 * H100.train_flops) + loss_traffic_s(QWEN3_4B, small, 2)
    comm = 3 * 4 * 36 * H100.allgather_seconds(small * 2560 * 2, 2)  # fwd + 2× bwd
    cl.recorder.on_phase("train", True, t0, 7)
    with pytest.raises(OutOfMemoryError) as info:
        _run(cl, tr.train(7, batch))
    err = info.value
    assert (err.gpu, err.owner, err.tag, err.phase) == (0, "actor", "activations", "train")
    assert err.time == pytest.approx(t0 + flops + comm, rel=1e-12)
    # the first micro-batch's blocks stay cached and are reused: the request is what the second needs beyond them
    held = cl.gpus[0].used("actor", "activations")
    assert held > 0 and err.requested + held == tr.activation_bytes(huge) + entropy_bytes(QWEN3_4B, huge, 2)


def test_colocated_engine_kv_makes_the_trainer_wake_oom():
    tr, cl = _trainer(_seed_args())
    _run(cl, tr.init())
    engine = SimAllocator("engine3", cl.gpus[6:8], H100, host=cl.host, known_tags=ENGINE_TAGS)
    engine.allocate(TAG_KV_CACHE, 70 * GiB)  # an engine that was never put to sleep
    cl.recorder.on_phase("train", True, cl.env.now, 0)
    with pytest.raises(OutOfMemoryError) as info:
        _run(cl, tr.wake_up())
    assert info.value.gpu == 6 and info.value.owner == "actor" and info.value.phase == "train"
    assert all(g.used("actor") == trainer_context_bytes(H100) for g in cl.gpus)


def test_memory_plan_matches_the_simulated_peak():
    args = _seed_args(offload_train=False)
    tr, cl = _trainer(args)
    _run(cl, tr.init())
    batch = _batch(args, lengths=[700] * 256)  # every micro-batch: 8 × 700 tokens
    _run(cl, tr.train(0, batch))
    plan = tr.memory_plan(8 * 700)
    assert cl.gpus[0].peak() == plan["total"]
    assert cl.gpus[0].peak("actor", "activations") == plan["activations"]


def test_the_policy_loss_entropy_sits_on_a_training_micro_batch_but_not_on_a_log_prob_forward():
    """The training loss takes the entropy of the fp32 logits with everything the forward kept still alive; the
    log-prob forward keeps no activations and takes no entropy: its logits and their fp32 copy only."""
    args = _args("--num-steps-per-rollout", "2", "--no-offload-train", "--no-colocate", "--rollout-num-gpus", "8",
                 "--micro-batch-size", "1")
    tr, cl = _trainer(args, SMALL)
    _run(cl, tr.init())
    batch = _batch(args, lengths=[4224] * 256)
    peaks = {}
    _run(cl, tr.compute_log_prob(0, batch))
    peaks["log_prob"] = cl.gpus[0].peak("actor", "activations")
    assert peaks["log_prob"] == int(SMALL.logits_bytes_per_token(2) * 4224)  # TP 2, one sequence
    _run(cl, tr.train(0, batch))
    peaks["train"] = cl.gpus[0].peak("actor", "activations")
    assert peaks["train"] == tr.activation_bytes(4224, [4224]) + entropy_bytes(SMALL, 4224, 2)
    assert entropy_bytes(SMALL, 4224, 2) == 3 * 4 * 151936 // 2 * 4224


# --------------------------------------------------------------------------------------------
# Time
# --------------------------------------------------------------------------------------------


def test_pipeline_parallel_adds_the_1f1b_bubble():
    """PP 2, 4 equal micro-batches: (4 + 2 − 1) stage slots of 3 × forward / PP each (and the loss's traffic)."""
    args = _args("--no-colocate", "--no-offload-train", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2",
                 "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "2",
                 "--rollout-batch-size", "4", "--n-samples-per-prompt", "1", "--micro-batch-size", "1")
    tr, cl = _trainer(args, SMALL, gpus=2, reuse_log_probs=True)
    _run(cl, tr.init())
    t0 = cl.env.now
    _run(cl, tr.train(0, _batch(args, lengths=[512] * 4)))
    train_span = next(s for s in cl.recorder.spans if s.name == "train_step0")
    stage = 3 * SMALL.sequence_flops(512) / (2 * H100.train_flops) + loss_traffic_s(SMALL, 512, 1)
    assert train_span.t1 - train_span.t0 == pytest.approx((4 + 2 - 1) * stage, rel=1e-12)
    assert train_span.t0 == t0


def test_data_parallel_groups_across_nodes_use_the_network():
    def optimizer_time(nodes: int) -> float:
        args = _seed_args(actor_num_nodes=nodes, actor_num_gpus_per_node=8 // nodes, rollout_num_gpus=8)
        tr, cl = _trainer(args)
        _run(cl, tr.init())
        _run(cl, tr.wake_up())
        _run(cl, tr.train(0, _batch(args)))
        span = next(s for s in cl.recorder.spans if s.name == "optimizer_step")
        return span.t1 - span.t0

    one, two = optimizer_time(1), optimizer_time(2)
    p = QWEN3_4B.params_per_rank(2)
    net = H100.internode_bytes_per_s * H100.efficiency.allreduce_bw_util
    nvl = H100.nvlink_bytes_per_s * H100.efficiency.allreduce_bw_util
    assert two - one == pytest.approx(0.75 * 6 * p * (1 / net - 1 / nvl), rel=1e-9)


def test_train_time_by_hand_for_one_sequence():
    """TP 2, DP 1, one micro-batch of one 2048-token sequence, no recompute."""
    args = _args("--no-colocate", "--no-offload-train", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2",
                 "--rollout-batch-size", "1", "--n-samples-per-prompt", "1", "--micro-batch-size", "1")
    tr, cl = _trainer(args, gpus=2, reuse_log_probs=True)
    _run(cl, tr.init())
    t0 = cl.env.now
    metrics = _run(cl, tr.train(0, _batch(args, lengths=[2048])))
    L, h = 2048, 2560
    dense = QWEN3_4B.num_params() - 36 * (2 * h + 256) - h
    fwd_flops = 2 * dense * L + 4 * 36 * 32 * 128 * L * (L + 1) / 2
    compute = 3 * fwd_flops / (2 * H100.bf16_flops * H100.efficiency.train_mfu) + loss_traffic_s(QWEN3_4B, L, 2)
    bus = H100.nvlink_bytes_per_s * H100.efficiency.allreduce_bw_util
    tp_comm = 3 * 4 * 36 * ((0.5 * L * h * 2) / bus + H100.efficiency.collective_latency_s)  # fwd + 2× bwd; 4 SP collectives per layer
    p = QWEN3_4B.params_per_rank(2)
    optimizer = p * 30 / (H100.hbm_bytes_per_s * H100.efficiency.decode_bw_util)  # DP 1: no reduce
    backup = 2 * p / (H100.host_link_d2h_bytes_per_s * H100.efficiency.host_copy_util)
    # resident (--no-offload-train): PyTorch's cache emptied after training, the largest activations unmapped
    empty = cl.gpus[0].peak("actor", "activations") / GiB * H100.vmm.torch_free_s_per_gib
    assert empty > 0
    assert cl.env.now - t0 == pytest.approx(compute + tp_comm + optimizer + backup + empty, rel=1e-9)
    assert metrics.extra["perf/train_time"] == pytest.approx(cl.env.now - t0, rel=1e-12)


def test_longer_responses_train_longer_and_more_gpus_train_faster():
    def train_time(response_max: int, gpus: int) -> float:
        args = _seed_args(actor_num_gpus_per_node=gpus, rollout_num_gpus=gpus, offload_train=False)
        tr, cl = _trainer(args, gpus=gpus)
        _run(cl, tr.init())
        return _run(cl, tr.train(0, _batch(args, response_max=response_max))).extra["perf/train_time"]

    assert train_time(256, 8) < train_time(1024, 8)
    assert train_time(1024, 8) < train_time(1024, 4)


def test_log_prob_recompute_only_when_the_reuse_decision_says_so():
    """Seed step 38: reused for the seed ([8]); a separate forward with 4 steps per rollout ([2, 2, 2, 2])."""
    seed_args = _seed_args(offload_train=False)
    four = _args("--num-steps-per-rollout", "4", "--no-offload-train", "--no-colocate", "--rollout-num-gpus", "8")
    out = {}
    for label, args in (("seed", seed_args), ("four", four)):
        tr, cl = _trainer(args)
        _run(cl, tr.init())
        batch = _batch(args)
        m = _run(cl, tr.train(0, batch))
        out[label] = (batch.num_microbatches, m.recomputed_log_probs,
                      [s.name for s in cl.recorder.spans if s.track == "actor"])
    assert out["seed"][0] == [8] and out["seed"][1] is False and "compute_log_prob" not in out["seed"][2]
    assert out["four"][0] == [2, 2, 2, 2] and out["four"][1] is True
    assert out["four"][2].count("compute_log_prob") == 1 and out["four"][2].count("optimizer_step") == 4


def test_persistent_offload_buffers_make_the_second_sleep_cheaper_than_cold():
    def second_sleep(pinned: str) -> float:
        tr, cl = _trainer(_seed_args(), pinned=pinned)
        _run(cl, tr.init())  # first sleep
        _run(cl, tr.wake_up())
        t0 = cl.env.now
        _run(cl, tr.sleep())
        return cl.env.now - t0

    cold, persistent = second_sleep("cold"), second_sleep("persistent")
    offloaded = max(QWEN3_4B.params_per_rank(2) * 2 + math.ceil(QWEN3_4B.params_per_rank(2) / 4) * 12, 0)
    assert cold - persistent == pytest.approx(offloaded / GiB * H100.vmm.pinned_alloc_s_per_gib, rel=1e-9)


def test_export_stages_each_bucket_on_every_gpu_until_the_consumer_moves_on():
    tr, cl = _trainer(_seed_args(offload_train=False))  # not colocated: no CUDA IPC staging buffer
    _run(cl, tr.init())
    seen: list[tuple[int, list[int]]] = []

    async def consume() -> int:
        n = 0
        async for bucket in tr.export_weights(GiB):
            seen.append((bucket.nbytes, [g.used("actor", "weight_buffer") for g in cl.gpus]))
            n += 1
        return n

    t0 = cl.env.now
    n = _run(cl, consume())
    assert n >= math.ceil(QWEN3_4B.num_params() * 2 / GiB)  # no bucket exceeds 1 GiB (no tensor does)
    assert all(used == [nbytes] * 8 for nbytes, used in seen)
    assert all(g.used("actor", "weight_buffer") == 0 for g in cl.gpus)
    staged = sum(nb for nb, _ in seen)
    m = QWEN3_4B  # the HF conversion (the QKV cut on the GPU, every rank all of it at PP 1), then the buckets
    convert = (2 * m.num_layers * m.hidden_size * (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim
               * m.dtype_bytes / H100.hbm_bytes_per_s)
    # + the trainer's host work: once per export and per HF tensor (carried from the measured H200 profile)
    convert += H100.efficiency.export_call_s + H100.efficiency.export_per_tensor_s * len(m.hf_weight_shapes())
    assert H100.efficiency.export_per_tensor_s > 0
    expected = convert + staged / 2 / H100.h2d_bytes_per_s + sum(H100.allgather_seconds(nb, 2) for nb, _ in seen)
    assert cl.env.now - t0 == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ConfigError):
        _run(cl, consume_one(tr, 0))


def test_export_cuts_the_fused_qkv_weights_on_the_gpu():
    """The QKV cut costs a read and a write of the fused weights at HBM speed (the real trainer stages them
    fused, vime.real.weights.ipc.DeviceCut): a slower HBM slows the export by exactly that."""
    from dataclasses import replace

    def export_seconds(hbm: float) -> float:
        hw = replace(H100, hbm_bytes_per_s=hbm)
        tr, cl = _trainer(_seed_args(), hw=hw)
        _run(cl, tr.init())
        t0 = cl.env.now
        _run(cl, consume_all(tr, GiB))
        return cl.env.now - t0

    m = QWEN3_4B
    qkv = m.num_layers * m.hidden_size * (m.num_attention_heads + 2 * m.num_kv_heads) * m.head_dim * m.dtype_bytes
    hbm = H100.hbm_bytes_per_s
    assert export_seconds(hbm / 2) - export_seconds(hbm) == pytest.approx(2 * qkv / hbm, rel=1e-6)  # PP 1: all of it


async def consume_all(tr: SimTrainer, bucket_bytes: int) -> None:
    async for _ in tr.export_weights(bucket_bytes):
        pass


async def consume_one(tr: SimTrainer, bucket_bytes: int) -> None:
    async for _ in tr.export_weights(bucket_bytes):
        break


# --------------------------------------------------------------------------------------------
# Metrics, determinism, misuse
# --------------------------------------------------------------------------------------------


def test_first_step_loss_is_the_token_mean_of_minus_advantage():
    """Seed step 40 with ratio 1: loss_token = −A, averaged over loss-masked tokens."""
    args = _seed_args(offload_train=False)
    tr, cl = _trainer(args)
    _run(cl, tr.init())
    batch = _batch(args)
    m = _run(cl, tr.train(0, batch))
    tokens = sum(batch.response_lengths)
    assert m.loss == pytest.approx(sum(-a * n for a, n in zip(batch.rewards, batch.response_lengths,
                                                                 strict=True)) / tokens, rel=1e-12)
    assert m.pg_clipfrac == 0.0 and m.tokens == tokens


def test_same_inputs_same_results():
    def once() -> tuple[Any, ...]:
        args = _seed_args()
        tr, cl = _trainer(args)

        async def main() -> Any:
            await tr.init()
            await tr.wake_up()
            m = await tr.train(3, _batch(args, 3, seed=3))
            await tr.sleep()
            return m

        m = _run(cl, main())
        return (m, [(s.track, s.name, s.t0, s.t1) for s in cl.recorder.spans],
                [tuple(vars(x).values()) for x in cl.recorder.samples])

    assert once() == once()


def test_misuse_before_init_and_mismatched_batches():
    args = _seed_args(offload_train=False)
    tr, cl = _trainer(args)
    with pytest.raises(TrainerError, match="init"):
        _run(cl, tr.train(0, _batch(args)))
    _run(cl, tr.init())
    with pytest.raises(TrainerError, match="twice"):
        _run(cl, tr.init())
    other = _seed_args(tensor_model_parallel_size=4)
    with pytest.raises(TrainerError, match="DP=2"):
        _run(cl, tr.train(0, _batch(other)))


def test_checkpoints_cost_their_bytes_and_unknown_paths_resume_at_start_rollout_id():
    args = _seed_args(offload_train=False, num_rollout=100, start_rollout_id=12)
    tr, cl = _trainer(args)
    _run(cl, tr.init())
    p = QWEN3_4B.params_per_rank(2)
    assert tr.checkpoint_bytes() == 8 * 2 * p // 4 + 8 * 12 * math.ceil(p / 4)
    t0 = cl.env.now
    assert _run(cl, tr.load_checkpoint("/ckpt/from-a-real-run")) == 12
    assert cl.env.now - t0 == pytest.approx(tr.checkpoint_bytes() / 2e9)
    _run(cl, tr.save_checkpoint(20, "/ckpt/iter_20"))
    assert _run(cl, tr.load_checkpoint("/ckpt/iter_20")) == 21


def test_kl_reference_model_lives_beside_the_policy_and_runs_its_own_forward():
    """As vime's real trainer keeps it (vime/real/megatron/reference.py): a second bf16 copy in the params tag —
    GPU memory while awake, copied out and back with the policy's weights at sleep/wake, not in the weight
    backup — and its log-probs one forward over the batch, timed as perf/ref_log_probs_time."""
    args = _seed_args(offload_train=False, use_kl_loss=True, kl_loss_coef=0.01)
    tr, cl = _trainer(args, reuse_log_probs=True)
    _run(cl, tr.init())
    p = QWEN3_4B.params_per_rank(2)
    assert cl.gpus[0].used("actor", "params") == 2 * 2 * p  # policy + reference, bf16 each
    assert cl.host.used("actor", "weight_backup") == 8 * 2 * p  # the backup holds the policy only
    m = _run(cl, tr.train(0, _batch(args)))
    names = [s.name for s in cl.recorder.spans if s.track == "actor"]
    assert names.count("compute_ref_log_prob") == 1 and names.count("ref_log_probs") == 1
    ref = next(s for s in cl.recorder.spans if s.name == "ref_log_probs")
    fwd = next(s for s in cl.recorder.spans if s.name == "compute_ref_log_prob")
    assert (ref.t0, ref.t1) == (fwd.t0, fwd.t1)  # no weight swap around the forward
    old = next(s for s in cl.recorder.spans if s.name == "compute_log_prob") if "compute_log_prob" in names else None
    assert old is None or fwd.t1 - fwd.t0 == pytest.approx(old.t1 - old.t0, rel=1e-9)
    assert m.extra["perf/ref_log_probs_time"] == pytest.approx(ref.t1 - ref.t0) and ref.t1 > ref.t0
    tr2, _ = _trainer(_seed_args(offload_train=False))
    assert not tr2.needs_ref_log_probs()
    assert tr2.state_bytes_per_gpu()["params"] == [2 * p] * 8


def test_the_reference_model_makes_the_trainer_sleep_and_wake_copy_it_too():
    def cycle(**kl: Any) -> tuple[float, float]:
        tr, cl = _trainer(_seed_args(**kl))
        _run(cl, tr.init())
        t0 = cl.env.now
        _run(cl, tr.wake_up())
        t1 = cl.env.now
        _run(cl, tr.sleep())
        return t1 - t0, cl.env.now - t1

    wake, sleep = cycle()
    wake_kl, sleep_kl = cycle(use_kl_loss=True, kl_loss_coef=0.01)
    extra = 2 * QWEN3_4B.params_per_rank(2)  # one rank's bf16 reference shard; the ranks copy at once
    assert wake_kl - wake == pytest.approx(extra / H100.h2d_bytes_per_s, rel=0.05)
    assert sleep_kl > sleep


def test_a_host_placed_reference_trades_its_gpu_copy_for_one_copy_in_per_train_call():
    """--ref-placement host: the reference's shard is pinned on the host, not in the params tag; each train call
    copies it in before its forward (held in PyTorch's cache under that forward's logits) and the trainer's sleep
    and wake no longer carry it."""
    p = QWEN3_4B.params_per_rank(2)

    def run(placement: str) -> tuple[Any, Any, Any]:
        args = _seed_args(offload_train=False, use_kl_loss=True, kl_loss_coef=0.01, ref_placement=placement)
        tr, cl = _trainer(args, reuse_log_probs=True)
        _run(cl, tr.init())
        params = cl.gpus[0].used("actor", "params")
        m = _run(cl, tr.train(0, _batch(args)))
        return tr, cl, (params, m.extra["perf/ref_log_probs_time"])

    gpu_tr, gpu_cl, (gpu_params, gpu_ref) = run("gpu")
    host_tr, host_cl, (host_params, host_ref) = run("host")
    assert (gpu_params, host_params) == (2 * 2 * p, 2 * p)
    assert host_cl.host.used("actor", "reference") == 8 * 2 * p and gpu_cl.host.used("actor", "reference") == 0
    assert host_ref - gpu_ref == pytest.approx(2 * p / H100.h2d_bytes_per_s, rel=1e-6)
    # the copy-in sits in the activations' cache (at least the shard, the training reuses the blocks), and the
    # trainer's peak on the GPU is lower by up to the shard
    assert host_cl.gpus[0].peak("actor", "activations") >= 2 * p
    assert 0 < gpu_cl.gpus[0].peak() - host_cl.gpus[0].peak() <= 2 * p  # the trainer alone on its GPUs here
    assert host_tr.state_bytes_per_gpu()["params"] == gpu_tr.policy_param_bytes_per_gpu()


def test_full_recompute_trades_activation_memory_for_time():
    def run(recompute: str) -> tuple[int, float]:
        args = _seed_args(offload_train=False)
        tr, cl = _trainer(args, recompute=recompute)  # type: ignore[arg-type]
        _run(cl, tr.init())
        m = _run(cl, tr.train(0, _batch(args)))
        return cl.gpus[0].peak("actor", "activations"), m.extra["perf/actor_train_time"]

    (mem_none, t_none), (mem_full, t_full) = run("none"), run("full")
    assert mem_full < mem_none / 2 and t_full > t_none
    with pytest.raises(ConfigError):
        _trainer(_seed_args(), recompute="most")  # type: ignore[arg-type]


def test_layout_errors_are_clear():
    with pytest.raises(ConfigError, match="cluster has 4"):
        _trainer(_seed_args(), gpus=4)

    odd = dataclasses.replace(_seed_args().parallel, tensor_model_parallel_size=3)
    with pytest.raises(ConfigError, match="not a multiple"):
        Layout.of(_seed_args().cluster, odd, 8)


_HASHSEED_SCRIPT = """
import json, random, sys
import simpy
sys.path.insert(0, {here!r})
from test_sim_trainer import _batch, _seed_args, _trainer, _run
args = _seed_args()
tr, cl = _trainer(args)
async def main():
    await tr.init()
    await tr.wake_up()
    m = await tr.train(1, _batch(args, 1, seed=1))
    await tr.sleep()
    return m
m = _run(cl, main())
print(json.dumps({{"metrics": vars(m), "recorder": cl.recorder.to_dict()}}))
"""


def test_output_is_identical_across_hash_seeds():
    """Byte-identical recorder and metrics under different PYTHONHASHSEED values (DESIGN: determinism)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    script = _HASHSEED_SCRIPT.format(here=str(Path(__file__).parent))
    outs = []
    for seed in ("0", "4242"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        outs.append(proc.stdout)
    assert outs[0] == outs[1] and len(outs[0]) > 1000


def test_both_offload_backends_park_the_state_tags_as_the_real_trainer_does():
    """vime's real trainer (vime/real/megatron/offload.py) puts only params, grads and optimizer under either
    backend's region (grads without a host copy) and empties the CUDA cache at sleep: both park params +
    optimizer and drop grads and activations; torch_memory_saver pins its host buffers anew each time."""
    parked = {}
    for backend in ("cumem", "torch_memory_saver"):
        args = _args("--train-offload-backend", backend)
        tr, cl = _trainer(args)
        _run(cl, tr.init())
        _run(cl, tr.wake_up())
        _run(cl, tr.train(0, _batch(args)))
        assert sum(tr.allocator.tag_bytes("activations")) > 0  # PyTorch's cache, until the sleep empties it
        t0 = cl.env.now
        _run(cl, tr.sleep())
        assert sum(tr.allocator.tag_bytes("activations")) == 0
        span = [s for s in cl.recorder.spans if s.name == "allocator.sleep"][-1]
        assert span.args["offload"] == ["params", "optimizer"]
        parked[backend] = (span.args["offloaded_bytes"], cl.env.now - t0)
    state = tr.state_bytes_per_gpu()
    assert parked["cumem"][0] == parked["torch_memory_saver"][0] == sum(state["params"]) + sum(state["optimizer"])
    assert parked["torch_memory_saver"][1] > parked["cumem"][1]  # cold pinning on every pause


def _export_all(tr: SimTrainer, cl: SimCluster, bucket_bytes: int = GiB) -> list[int]:
    async def consume() -> list[int]:
        return [b.nbytes async for b in tr.export_weights(bucket_bytes)]

    return _run(cl, consume())


def test_colocated_export_keeps_one_staging_buffer_of_the_largest_bucket_from_the_first_sync_on():
    """vime/real/weights/ipc.py: one buffer sized to the largest bucket, allocated by the first export outside
    the offload regions and reused; it stays through sleep, wake and training (issue 17)."""
    args = _seed_args()
    tr, cl = _trainer(args)
    _run(cl, tr.init())  # colocated: asleep afterwards
    assert all(g.used("actor", "weight_buffer") == 0 for g in cl.gpus)
    sizes = _export_all(tr, cl)
    assert len(sizes) > 1 and len(set(sizes)) > 1  # buckets differ, so "the largest" means something
    assert [g.used("actor", "weight_buffer") for g in cl.gpus] == [max(sizes)] * 8
    _run(cl, tr.wake_up())
    _run(cl, tr.train(0, _batch(args)))
    _run(cl, tr.sleep())
    assert [g.used("actor", "weight_buffer") for g in cl.gpus] == [max(sizes)] * 8
    _export_all(tr, cl)  # a second sync reuses it
    assert [g.used("actor", "weight_buffer") for g in cl.gpus] == [max(sizes)] * 8
    assert max(g.peak("actor", "weight_buffer") for g in cl.gpus) == max(sizes)
    _export_all(tr, cl, 2 * GiB)  # larger buckets: the small buffer goes, the larger one replaces it
    grown = max(_export_all(tr, cl, 2 * GiB))
    assert grown > max(sizes) and [g.used("actor", "weight_buffer") for g in cl.gpus] == [grown] * 8


def test_first_train_step_leaves_the_profile_residue_mapped_through_every_later_sleep():
    args = _seed_args()
    residue = 3 * GiB // 2
    hw = dataclasses.replace(H100, software=dataclasses.replace(H100.software, train_step_residue_bytes=residue))
    tr, cl = _trainer(args, hw=hw)
    _run(cl, tr.init())
    _run(cl, tr.wake_up())
    assert all(g.used("actor", "step_residue") == 0 for g in cl.gpus)
    _run(cl, tr.train(0, _batch(args)))
    first = tr.step_residue_bytes(_batch(args))
    embedding = 8 * tr.model.vocab_size // tr.layout.tp * tr.model.hidden_size  # two fp32 embedding-sized tensors
    assert first >= residue + embedding  # + the largest micro-batch's scores where attention is unfused
    assert [g.used("actor", "step_residue") for g in cl.gpus] == [first] * 8
    _run(cl, tr.sleep())  # not an offload tag: it stays while the engines generate
    assert [g.used("actor", "step_residue") for g in cl.gpus] == [first] * 8
    _run(cl, tr.wake_up())
    _run(cl, tr.train(1, _batch(args, 1)))  # once, not once per step
    assert [g.used("actor", "step_residue") for g in cl.gpus] == [first] * 8
    bare, cl0 = _trainer(args)  # a profile without the figure: nothing
    _run(cl0, bare.init())
    _run(cl0, bare.wake_up())
    _run(cl0, bare.train(0, _batch(args)))
    assert all(g.used("actor", "step_residue") == 0 for g in cl0.gpus)


def test_the_residue_grows_with_the_embedding_and_the_largest_score_block():
    """footprint.step_residue_bytes: base + 8 B per embedding element (per TP slice) + one layer's fp32 scores of
    the micro-batch with the most (unfused attention only); a profile without a base models none."""
    from vime.sim.trainer.footprint import step_residue_bytes

    hw = load_hardware("H200-141G-measured")
    base = hw.software.train_step_residue_bytes
    small, mid = load_model("Qwen3-0.6B"), load_model("Qwen3-1.7B")
    mbs4 = [[1152] * 4] * 3
    assert hw.software.train_attention == "unfused"
    scores = 4 * 4 * 16 * 1152 ** 2
    assert step_residue_bytes(small, hw, mbs4) == base + 8 * 151936 * 1024 + scores
    # the 1.7B keeps 1.16 GiB more than the 0.6B at the same micro-batches (3.63 vs 2.48 GiB of torch cache measured)
    assert step_residue_bytes(mid, hw, mbs4) - step_residue_bytes(small, hw, mbs4) == 8 * 151936 * 1024
    # the largest block counts, once: 8 x 1152 doubles the scores of 4 x 1152, a longer short batch does too
    assert step_residue_bytes(small, hw, [[1152] * 8, [1152] * 4]) - base - 8 * 151936 * 1024 == 2 * scores
    assert step_residue_bytes(small, hw, [[1152] * 4, [1700] * 2]) > step_residue_bytes(small, hw, mbs4)
    assert step_residue_bytes(small, hw, mbs4, tp=2) < step_residue_bytes(small, hw, mbs4)
    flash = dataclasses.replace(hw, software=dataclasses.replace(hw.software, train_attention="flash"))
    assert step_residue_bytes(small, flash, mbs4) == base + 8 * 151936 * 1024
    none = dataclasses.replace(hw, software=dataclasses.replace(hw.software, train_step_residue_bytes=0))
    assert step_residue_bytes(small, none, mbs4) == 0


def test_the_residue_must_be_whole_non_negative_bytes():
    from vime.sim.hardware_parts import Software

    for bad in (-1, 1.5, True, 1 << 41):
        with pytest.raises(ConfigError, match="train_step_residue_bytes"):
            Software(train_step_residue_bytes=bad)  # type: ignore[arg-type]


def test_the_h200_preset_carries_the_fitted_residue_of_record():
    import json
    from pathlib import Path

    fit = json.loads((Path(__file__).resolve().parents[2] / "bench" / "data" / "trainer_residue.json").read_text())
    assert load_hardware("H200-141G-measured").software.train_step_residue_bytes == fit["train_step_residue_bytes"] > 0


def test_the_policy_loss_traffic_is_added_unless_the_profile_was_fitted_on_it():
    """A profile measured on Megatron's own loss ("megatron") gets vime's extra vocabulary traffic, under the host
    floor; one fitted on vime's actor ("vime") already holds it; a log-prob forward moves only the transposed copy."""
    args = _args("--no-colocate", "--no-offload-train", "--actor-num-gpus-per-node", "2", "--rollout-num-gpus", "2",
                 "--tensor-model-parallel-size", "2", "--rollout-batch-size", "1", "--n-samples-per-prompt", "1",
                 "--micro-batch-size", "1")
    tr, _ = _trainer(args, gpus=2)
    lengths = [2048]
    train_fwd, train_bwd = tr._microbatch_seconds(lengths, backward=True)
    logp_fwd, _ = tr._microbatch_seconds(lengths, backward=False)
    tr.hw = dataclasses.replace(H100, software=dataclasses.replace(H100.software, train_loss="vime"))
    base_fwd, base_bwd = tr._microbatch_seconds(lengths, backward=True)
    base_logp, _ = tr._microbatch_seconds(lengths, backward=False)
    assert train_fwd + train_bwd - base_fwd - base_bwd == pytest.approx(loss_traffic_s(QWEN3_4B, 2048, 2), rel=1e-9)
    stream = H100.hbm_bytes_per_s * H100.efficiency.decode_bw_util
    assert logp_fwd - base_logp == pytest.approx(2048 * QWEN3_4B.vocab_size / 2 * 4 / stream, rel=1e-9)
    with pytest.raises(ConfigError, match="software.train_loss"):
        dataclasses.replace(H100.software, train_loss="fused")


def test_sleep_and_wake_pay_the_state_check_and_the_wake_onto_released_memory_by_hand():
    """What the real actor does around the allocator (vime.real.megatron.actor): a sum of every kept tensor at the
    sleep and after the wake; and a wake right after another process released memory on its GPUs (the engines'
    sleep) runs slower, per GiB released up to a ceiling (both carried from the measured H200)."""
    eff = H100.efficiency
    assert eff.state_check_per_tensor_s > 0 and eff.state_check_bytes_per_s > 0
    assert eff.released_wake_s_per_gib > 0 and eff.released_wake_max_s > 0
    m = QWEN3_4B  # the seed: TP 2, DP 4, distributed optimizer; Megatron's layout: 8 tensors a layer, embedding, norm
    tensors = 4 * (m.num_layers * 8 + 2)  # each parameter, its fp32 main copy, Adam's two moments
    kept = m.params_per_rank(2) * 2 + math.ceil(m.params_per_rank(2) / 4) * 12
    check = tensors * eff.state_check_per_tensor_s + kept / eff.state_check_bytes_per_s
    for neighbour_gib in (0, 20, 200):
        tr, cl = _trainer(_seed_args())
        _run(cl, tr.init(sleep=True))
        for gpu in cl.gpus[:2]:  # a neighbour takes memory and gives it back while the trainer sleeps
            for _ in range(0, neighbour_gib, 20):
                gpu.alloc("engine", "kv_cache", 20 * GiB)
                gpu.free("engine", "kv_cache")
        alloc = tr.allocator.wake_seconds()
        t0 = cl.env.now
        _run(cl, tr.wake_up())
        released = min(neighbour_gib * eff.released_wake_s_per_gib, eff.released_wake_max_s)
        assert cl.env.now - t0 == pytest.approx(alloc + check + released, rel=1e-9)
        alloc = tr.allocator.sleep_seconds(["params", "optimizer"], ["grads", "activations"])
        t0 = cl.env.now
        _run(cl, tr.sleep())
        assert cl.env.now - t0 == pytest.approx(alloc + check, rel=1e-9)  # nothing trained: no cached activations
    assert 200 * eff.released_wake_s_per_gib > eff.released_wake_max_s > 20 * eff.released_wake_s_per_gib


def test_the_sleep_after_training_unmaps_the_cached_activations():
    """PyTorch keeps the largest micro-batch's activation blocks cached until the sleep's empty_cache hands them back."""
    args = _seed_args()
    tr, cl = _trainer(args)
    _run(cl, tr.init())
    _run(cl, tr.wake_up())
    t0 = cl.env.now
    _run(cl, tr.sleep())
    untrained = cl.env.now - t0
    _run(cl, tr.wake_up())
    _run(cl, tr.train(0, _batch(args)))
    cached = tr.extras.cached_activations
    assert cached > 10 * GiB  # the seed's micro-batches of 4B activations
    t0 = cl.env.now
    _run(cl, tr.sleep())
    # at PyTorch's empty_cache rate, not the VMM path's unmap (they differ: bench/empty_cache_rate.py)
    assert H100.vmm.torch_free_s_per_gib == H100.vmm.empty_cache_s_per_gib != H100.vmm.unmap_release_s_per_gib
    assert cl.env.now - t0 - untrained == pytest.approx(cached / GiB * H100.vmm.empty_cache_s_per_gib, rel=1e-6)
    assert tr.extras.cached_activations == 0


def test_a_wake_that_maps_nothing_back_pays_the_check_but_not_the_released_memory():
    """--train-offload-plan activations keeps params, grads and optimizer resident: nothing to map back (the H200's
    plan040 run woke in 0.12 s, its state check alone)."""
    eff = H100.efficiency
    args = _seed_args(train_offload_plan="activations")
    tr, cl = _trainer(args)
    _run(cl, tr.init(sleep=True))
    cl.gpus[0].alloc("engine", "kv_cache", 40 * GiB)
    cl.gpus[0].free("engine", "kv_cache")
    t0 = cl.env.now
    _run(cl, tr.wake_up())
    assert cl.env.now - t0 == pytest.approx(state_check_seconds(tr), rel=1e-9)
    assert state_check_seconds(tr) > 0 and eff.released_wake_s_per_gib > 0


def test_a_resident_trainer_empties_pytorchs_cache_after_training_and_an_offloaded_one_at_its_sleep():
    """Activations' blocks stay cached (the tag at its largest micro-batch) until an empty_cache: the sleep's, or,
    with --no-offload-train, the one vime's real trainer makes at the end of each train call; handed back then."""
    held = {}
    for resident in (False, True):
        args = _seed_args(offload_train=not resident)
        tr, cl = _trainer(args)
        _run(cl, tr.init())
        if not resident:
            _run(cl, tr.wake_up())
        _run(cl, tr.train(0, _batch(args)))
        held[resident] = (sum(tr.allocator.tag_bytes("activations")), cl.gpus[0].not_ready("engine0", 0.01)[1])
    assert held[False][0] > 0 and held[False][1] == 0  # cached until the sleep, nothing handed back yet
    assert held[True][0] == 0 and held[True][1] > 0  # emptied after training, and handed back to the driver
