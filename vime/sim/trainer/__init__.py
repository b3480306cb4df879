"""Simulated Megatron actor group: `SimTrainer` (protocol calls, lifecycle) over its cost and bytes model."""

from vime.sim.trainer.actor import OWNER, SimTrainer
from vime.sim.trainer.cost_model import ActorCostModel
from vime.sim.trainer.costs import (
    ADAM_STEP_BYTES,
    CHECKPOINT_BYTES_PER_S,
    NORM_COMPOSITE_EXTRA_BWD_BYTES,
    NORM_COMPOSITE_EXTRA_FWD_BYTES,
    ROPE_UNFUSED_EXTRA_BYTES,
    SWIGLU_UNFUSED_EXTRA_BWD_BYTES,
    SWIGLU_UNFUSED_EXTRA_FWD_BYTES,
    TORCH_ADAMW_STEP_BYTES,
    UNFUSED_SCORE_BWD_BYTES,
    UNFUSED_SCORE_FWD_BYTES,
    compute_seconds,
    optimizer_step_bytes,
    software_stream_bytes_per_token,
    streaming_bytes_per_s,
)
from vime.sim.trainer.footprint import (
    GRAD_BYTES,
    OPTIMIZER_BYTES,
    PARAM_BYTES,
    TAG_CONTEXT,
    TAG_STEP_RESIDUE,
    TAG_WEIGHT_BACKUP,
    TAG_WEIGHT_BUFFER,
    TORCH_ADAMW_TRANSIENT_BYTES,
    UNFUSED_SCORE_KEPT_BYTES,
    grad_bytes,
    optimizer_transient_bytes,
    rope_bytes,
    score_bytes,
    software_terms,
    trainer_context_bytes,
)
from vime.sim.trainer.layout import Layout

__all__ = [
    "ADAM_STEP_BYTES", "CHECKPOINT_BYTES_PER_S", "GRAD_BYTES", "NORM_COMPOSITE_EXTRA_BWD_BYTES",
    "NORM_COMPOSITE_EXTRA_FWD_BYTES", "OPTIMIZER_BYTES", "OWNER", "PARAM_BYTES", "ROPE_UNFUSED_EXTRA_BYTES",
    "SWIGLU_UNFUSED_EXTRA_BWD_BYTES", "SWIGLU_UNFUSED_EXTRA_FWD_BYTES", "TAG_CONTEXT", "TAG_STEP_RESIDUE", "TAG_WEIGHT_BACKUP",
    "TAG_WEIGHT_BUFFER", "TORCH_ADAMW_STEP_BYTES", "TORCH_ADAMW_TRANSIENT_BYTES", "UNFUSED_SCORE_BWD_BYTES",
    "UNFUSED_SCORE_FWD_BYTES", "UNFUSED_SCORE_KEPT_BYTES", "ActorCostModel", "Layout", "SimTrainer",
    "compute_seconds", "grad_bytes", "trainer_context_bytes", "optimizer_step_bytes", "optimizer_transient_bytes", "rope_bytes",
    "score_bytes", "software_stream_bytes_per_token", "software_terms", "streaming_bytes_per_s",
]
