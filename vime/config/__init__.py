"""Command-line configuration: one parser for `vime train` and `vime simulate`, derived values, validation.

The options are declared once, as fields of small dataclasses grouped by concern (cluster,
parallel, train, rollout, data, algo, engine, weight sync, simulation, output). `build_parser`
turns them into argparse options with the names slime / vllm-project/vime users know
(``--tensor-model-parallel-size 2``); `parse_args` reads a command line, checks every
cross-flag constraint in one place (`_validate`), computes the derived values once (seed
step 1) and returns a read-only `Args` whose attribute names are the slime names
(``args.rollout_batch_size``, ``args.global_batch_size``, ``args.data_parallel_size`` ...).

The parser's defaults are the seed's scenario (section 0): 8 colocated GPUs, Megatron TP 2 →
DP 4, four 2-GPU vLLM engines, 32 prompts × 8 samples, prompt ≤ 512, response ≤ 1024,
context 4096, global batch 256, micro-batch 8, one training step per rollout, GRPO, eps_clip 0.2,
kl 0, 100 rollouts. So ``vime simulate`` without flags simulates the seed.
"""


from vime.config.args import Args, defaults, parse_args
from vime.config.lengths import (
    DEFAULT_PROMPT_MIN_FRACTION,
    DEFAULT_RESPONSE_MEDIAN_FRACTION,
    DEFAULT_RESPONSE_SIGMA,
    LengthSpec,
    default_prompt_spec,
    default_response_spec,
    parse_length_spec,
)
from vime.config.options import (
    ADVANTAGE_ESTIMATORS,
    COMMANDS,
    GROUPS,
    LOSS_TYPES,
    ROUTER_POLICIES,
    AlgoConfig,
    AsyncConfig,
    ClusterConfig,
    DataConfig,
    DerivedConfig,
    EngineConfig,
    GiB,
    LoggingConfig,
    OutputConfig,
    ParallelConfig,
    RolloutConfig,
    SimConfig,
    TrainConfig,
    WeightSyncConfig,
    parse_bytes,
)
from vime.config.parser import build_parser
from vime.config.rules import SIMULATE_DEFAULT_NUM_ROLLOUT

__all__ = [
    "ADVANTAGE_ESTIMATORS", "COMMANDS", "DEFAULT_PROMPT_MIN_FRACTION", "DEFAULT_RESPONSE_MEDIAN_FRACTION",
    "DEFAULT_RESPONSE_SIGMA", "GROUPS", "LOSS_TYPES", "ROUTER_POLICIES", "SIMULATE_DEFAULT_NUM_ROLLOUT",
    "AlgoConfig", "Args", "AsyncConfig", "ClusterConfig", "DataConfig", "DerivedConfig", "EngineConfig", "GiB", "LengthSpec", "LoggingConfig",
    "OutputConfig", "ParallelConfig", "RolloutConfig", "SimConfig", "TrainConfig", "WeightSyncConfig",
    "build_parser", "default_prompt_spec", "default_response_spec", "defaults", "parse_args", "parse_bytes",
    "parse_length_spec",
]
