"""The simulated vLLM engine: server (protocol, faults), core (busy loop), scheduler, costs, KV plan, settings.

The split follows nano-vllm's: the scheduler is pure Python bookkeeping, the cost model is closed
form, and the server is the `RolloutEngine` surface a real vLLM client also implements.
"""

from vime.sim.engine.costs import IterationModel, bucket_seconds, sum_max_lines, sum_max_of_lines
from vime.sim.engine.kv import (
    DEFERRABLE,
    NON_DEFERRABLE,
    KVPlan,
    activation_peak_bytes,
    engine_allocator,
    plan_kv_cache,
)
from vime.sim.engine.scheduler import EngineStats
from vime.sim.engine.server import SimEngine
from vime.sim.engine.settings import BLOCK_SIZE, EngineSettings

__all__ = [
    "BLOCK_SIZE",
    "DEFERRABLE",
    "NON_DEFERRABLE",
    "EngineSettings",
    "EngineStats",
    "IterationModel",
    "KVPlan",
    "SimEngine",
    "activation_peak_bytes",
    "bucket_seconds",
    "engine_allocator",
    "plan_kv_cache",
    "sum_max_lines",
    "sum_max_of_lines",
]
