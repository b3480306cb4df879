"""A colocated run puts the trainer to sleep before its first step (seed steps 3, 43): also with the distributed optimizer."""

from __future__ import annotations

import asyncio

import pytest
from megatron_rollouts import synthetic_batch

from vime.real.megatron import model as mmodel
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.trainer import MegatronTrainer

pytestmark = pytest.mark.megatron


def test_sleep_before_the_first_step_with_the_distributed_optimizer(ray_local, tiny_hf_dir):
    cfg = ActorConfig(hf_config=mmodel.load_hf_config(str(tiny_hf_dir)), hf_checkpoint=str(tiny_hf_dir),
                      tensor_model_parallel_size=1, use_distributed_optimizer=True, lr=1e-3, seed=3)
    trainer = MegatronTrainer.launch(cfg, 1, actor_num_cpus=0.25)
    try:
        asyncio.run(trainer.sleep())  # used to assert inside megatron's DistributedOptimizer.state_dict()
        asyncio.run(trainer.wake_up())
        metrics = asyncio.run(trainer.train(0, synthetic_batch(0, global_batch_size=8)))
        assert metrics.grad_norm > 0
        asyncio.run(trainer.sleep())  # and after a step, with Adam state present
    finally:
        trainer.shutdown()
