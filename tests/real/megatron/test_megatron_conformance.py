"""The Trainer conformance suite (tests/conformance/trainer.py) against MegatronTrainer: one TP=1 rank on CPU and Ray."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from conformance import trainer as conformance
from megatron_rollouts import synthetic_batch

from vime.protocols import TrainerState
from vime.real.megatron import model as mmodel
from vime.real.megatron.actor import ActorConfig
from vime.real.megatron.trainer import MegatronTrainer

pytestmark = pytest.mark.megatron


def hf_bytes(hf_dir: Path) -> int:
    """Bytes of the HF checkpoint's tensors (float32, tied embeddings stored once): what a full export carries."""
    from safetensors import safe_open

    total = 0
    for f in sorted(hf_dir.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as fh:
            for name in fh.keys():  # noqa: SIM118 - safe_open has keys(), not iteration
                t = fh.get_tensor(name)
                total += t.numel() * t.element_size()
    return total


@pytest.fixture(scope="module")
def trainer(ray_local, tiny_hf_dir):
    """One small trainer for every check (starting Megatron actors costs seconds; the checks reset its state)."""
    cfg = ActorConfig(hf_config=mmodel.load_hf_config(str(tiny_hf_dir)), hf_checkpoint=str(tiny_hf_dir),
                      tensor_model_parallel_size=1, lr=1e-3, seed=7)
    t = MegatronTrainer.launch(cfg, 1, actor_num_cpus=0.25)
    yield t
    t.shutdown()


@pytest.mark.parametrize("check", conformance.ALL_CHECKS, ids=lambda c: c.__name__)
def test_megatron_trainer_conformance(check: Any, trainer: MegatronTrainer, tiny_hf_dir: Path,
                                      tmp_path: Path) -> None:
    export_bytes = hf_bytes(tiny_hf_dir)

    def subject() -> conformance.TrainerSubject:
        if trainer.lifecycle.state is TrainerState.ASLEEP:  # a previous check ended asleep: a fresh trainer is awake
            asyncio.run(trainer.wake_up())
        return conformance.TrainerSubject(trainer, asyncio.run, lambda rid: synthetic_batch(rid, global_batch_size=8),
                                          export_bytes, checkpoint_dir=str(tmp_path))

    check(subject)
