"""The options, declared once as fields of small dataclasses grouped by concern; their flags are the field names."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

from vime.config.lengths import _SPEC_GRAMMAR, LengthSpec
from vime.faults import fault_flag_type

COMMANDS: tuple[str, ...] = ("train", "simulate")
GiB = 1024**3

#: Router policies of vllm-router (see shared/VLLM_API.md); consistent_hash routes by session id.
ROUTER_POLICIES = ("round_robin", "random", "consistent_hash", "rendezvous_hash", "power_of_two", "cache_aware")
ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")


_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Bytes from ``1073741824``, ``1GiB``, ``512MiB``, ``1.5G`` (binary units)."""
    m = _SIZE_RE.match(str(text))
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size (use bytes or e.g. 512MiB, 1GiB)")
    unit = (m.group(2) or "b").lower()[0]
    return int(float(m.group(1)) * {"b": 1, "k": 1024, "m": 1024**2, "g": GiB, "t": 1024**4}[unit])


def opt(default: Any, help: str, *, type: Any = None, choices: Sequence[Any] | None = None,
        flag: str | None = None, commands: Sequence[str] = COMMANDS, negatable: bool = False,
        nargs: str | None = None, metavar: str | None = None, action: str | None = None) -> Any:
    """A dataclass field that is also a command-line option (its flag is the field name with dashes).

    Booleans are ``store_true`` unless `negatable` (then ``--x/--no-x``, for flags that default
    on or that colocate turns on). `commands` limits the option to some subcommands.
    """
    meta = {"help": help, "type": type, "choices": tuple(choices) if choices else None, "flag": flag,
            "commands": tuple(commands), "negatable": negatable, "nargs": nargs, "metavar": metavar,
            "action": action}
    return field(default=default, metadata={"cli": meta})


@dataclass(frozen=True)
class ClusterConfig:
    """Where things run: training actors, rollout engines, and whether they share GPUs (seed section 0)."""

    title: ClassVar[str] = "cluster"
    actor_num_nodes: int = opt(1, "nodes for the training actors", type=int)
    actor_num_gpus_per_node: int = opt(8, "GPUs per node for the training actors", type=int)
    rollout_num_gpus: int | None = opt(None, "GPUs for rollout engines (colocate: = actor GPUs)", type=int)
    rollout_num_gpus_per_engine: int = opt(2, "GPUs per vLLM engine (its TP size)", type=int)
    colocate: bool = opt(True, "training and rollout share the same GPUs (turns both offloads on)",
                         negatable=True)
    offload_train: bool | None = opt(None, "put the trainer to sleep while engines generate",
                                     negatable=True)
    offload_rollout: bool | None = opt(None, "put the engines to sleep while the trainer trains",
                                       negatable=True)
    train_offload_backend: str = opt("cumem", "how the trainer sleeps: cumem (vime's CUDA VMM allocator, "
                                              "persistent pinned host buffers) or torch_memory_saver "
                                              "(pinned buffers allocated on every pause)",
                                     choices=("cumem", "torch_memory_saver"))
    train_offload_plan: str = opt("all", "which trainer tags leave the GPU while the engines generate: all (params "
                                         "and optimizer to host, grads and activations dropped), a comma list of "
                                         "params,grads,optimizer,activations (the rest stay resident), or auto "
                                         "(`vime simulate` chooses the tags and --gpu-memory-utilization that "
                                         "minimise T_step while fitting, and prints the plan)",
                                  metavar="auto|all|TAG,...")


@dataclass(frozen=True)
class ParallelConfig:
    """Megatron model parallelism; DP is what remains of the actor GPUs."""

    title: ClassVar[str] = "parallel"
    tensor_model_parallel_size: int = opt(2, "Megatron tensor-parallel size", type=int)
    pipeline_model_parallel_size: int = opt(1, "Megatron pipeline-parallel size", type=int)
    context_parallel_size: int = opt(1, "Megatron context-parallel size", type=int)
    use_distributed_optimizer: bool = opt(True, "shard optimizer state across DP ranks", negatable=True)
    expert_model_parallel_size: int = opt(1, "Megatron expert-parallel size: each MoE layer's routed experts split "
                                             "over this many ranks (MoE models; divides the expert count)", type=int)
    expert_tensor_parallel_size: int | None = opt(None, "Megatron expert tensor-parallel size: each expert's width "
                                                        "split over this many ranks (default: 1 with --expert-model-parallel-size "
                                                        "> 1, as slime's MoE recipes; else "
                                                        "--tensor-model-parallel-size, Megatron's)", type=int)
    recompute_granularity: str | None = opt(None, "Megatron activation recomputation: full (every layer's "
                                                  "activations recomputed in the backward; method uniform, "
                                                  "1 layer per checkpoint) or selective (core attention only)",
                                            choices=("full", "selective"))
    sequence_parallel: bool | None = opt(None, "Megatron sequence parallelism: norm/dropout activations split along "
                                                "the sequence over the TP ranks (default: on when "
                                                "--tensor-model-parallel-size > 1, as slime's scripts run; off on "
                                                "--backend real, whose trainer cannot run it)",
                                         negatable=True)
    bf16: bool = opt(False, "train in bfloat16 (Megatron's --bf16; default: bfloat16 on GPUs, float32 on CPU)")
    grad_reduce_in_bf16: bool = opt(False, "accumulate and reduce gradients in the training dtype (Megatron's "
                                           "--grad-reduce-in-bf16): 2-byte grads under bfloat16 instead of fp32 "
                                           "main grads, half their memory and traffic")
    fp16: bool = opt(False, "train in float16 with a dynamic loss scale (Megatron's --fp16)")


@dataclass(frozen=True)
class TrainConfig:
    """Batches, steps, checkpoints and the rollout loop (seed steps 1, 14, 31, 55)."""

    title: ClassVar[str] = "train"
    global_batch_size: int | None = opt(None, "samples per optimizer step (default: derived from "
                                              "--num-steps-per-rollout)", type=int)
    num_steps_per_rollout: int | None = opt(None, "optimizer steps per rollout (default 1)", type=int)
    micro_batch_size: int = opt(8, "samples per micro-batch per DP rank", type=int)
    calculate_per_token_loss: bool = opt(False, "average the loss over all tokens of the step "
                                                "instead of per sample first")
    lr: float = opt(1e-6, "learning rate", type=float)
    clip_grad: float = opt(1.0, "clip the gradient norm at this value (0: no clipping)", type=float)
    weight_decay: float = opt(0.0, "AdamW weight decay", type=float)
    adam_beta1: float = opt(0.9, "Adam beta1", type=float)
    adam_beta2: float = opt(0.98, "Adam beta2", type=float)
    adam_eps: float = opt(1e-8, "Adam epsilon", type=float)
    seed: int = opt(1234, "random seed (trainer, data order, simulator)", type=int)
    num_rollout: int = opt(100, "number of rollouts (RL steps) to run; `vime simulate` defaults to "
                                "2 simulated steps", type=int)
    num_epoch: int | None = opt(None, "epochs over --prompt-data: --num-rollout becomes N × (the dataset's "
                                      "lines // --rollout-batch-size), as slime", type=int)
    start_rollout_id: int = opt(0, "first rollout id (resume)", type=int)
    eval_interval: int | None = opt(None, "evaluate every N rollouts (and after the last)", type=int)
    eval_prompt_data: tuple[str, ...] = opt((), "evaluation sets as NAME PATH pairs (JSONL like --prompt-data); "
                                                "each set's metrics are logged as eval/NAME/...",
                                            nargs="+", metavar="NAME PATH")
    n_samples_per_eval_prompt: int = opt(1, "samples per evaluation prompt", type=int)
    eval_max_response_len: int | None = opt(None, "longest evaluation response (default: "
                                                  "--rollout-max-response-len)", type=int)
    eval_temperature: float | None = opt(None, "evaluation sampling temperature (default: --rollout-temperature)",
                                         type=float)
    eval_top_p: float | None = opt(None, "evaluation top-p (default: --rollout-top-p)", type=float)
    eval_top_k: int | None = opt(None, "evaluation top-k (default: --rollout-top-k)", type=int)
    save_interval: int | None = opt(None, "checkpoint every N rollouts (needs --save)", type=int)
    save: str | None = opt(None, "checkpoint directory to write (every --save-interval rollouts; without it once, "
                                 "after the last rollout)", metavar="PATH")
    load: str | None = opt(None, "checkpoint directory to resume from", metavar="PATH")
    fault: tuple[str, ...] = opt((), "inject a fault (repeatable): engine-crash, slow-engine, wake-fail, update-fail, "
                                     "trainer-crash or router-down, as KIND:key=value,... (see vime/faults.py); the "
                                     "report says what happened, what was lost and how to resume; --backend real "
                                     "injects engine-crash (in a rollout), router-down and trainer-crash",
                                 type=fault_flag_type,
                                 metavar="SPEC", action="append")
    hf_checkpoint: str | None = opt(None, "Hugging Face checkpoint (architecture + tokenizer)",
                                    metavar="PATH")


@dataclass(frozen=True)
class RolloutConfig:
    """What one rollout generates and how (seed steps 16–21)."""

    title: ClassVar[str] = "rollout"
    rollout_batch_size: int = opt(32, "prompts per rollout", type=int)
    n_samples_per_prompt: int = opt(8, "samples per prompt (the GRPO group size)", type=int)
    over_sampling_batch_size: int | None = opt(None, "prompts fetched per refill (default: "
                                                     "--rollout-batch-size)", type=int)
    rollout_max_prompt_len: int = opt(512, "longest prompt in tokens", type=int)
    rollout_max_response_len: int = opt(1024, "longest response in tokens (max_tokens)", type=int)
    rollout_max_context_len: int = opt(4096, "engine max_model_len", type=int)
    rollout_temperature: float = opt(1.0, "sampling temperature", type=float)
    rollout_top_p: float = opt(1.0, "sampling top-p", type=float)
    rollout_top_k: int = opt(-1, "sampling top-k (-1: off)", type=int)
    rollout_stop: list[str] | None = opt(None, "stop strings", nargs="*", metavar="TEXT")
    rollout_stop_token_ids: list[int] | None = opt(None, "stop token ids", type=int, nargs="*",
                                                   metavar="ID")
    rollout_skip_special_tokens: bool = opt(False, "drop special tokens when decoding responses")
    vllm_server_concurrency: int = opt(512, "in-flight generate requests per engine", type=int)
    router_policy: str = opt("round_robin", "vllm-router policy", choices=ROUTER_POLICIES)
    dynamic_sampling_filter_path: str | None = opt(None, "module.function that drops finished groups (imports and runs that code)",
                                                   metavar="PATH")
    custom_generate_function_path: str | None = opt(None, "module.function replacing generate() (imports and runs that code)",
                                                    metavar="PATH")
    use_score_centering: bool = opt(False, "request sampler top-k log-probs for score centering")
    score_centering_top_k: int = opt(0, "top-k log-probs per token for score centering", type=int)


@dataclass(frozen=True)
class DataConfig:
    """The prompt dataset and the reward (seed steps 16, 26)."""

    title: ClassVar[str] = "data"
    prompt_data: str | None = opt(None, "JSONL prompt dataset", metavar="PATH")
    input_key: str = opt("prompt", "dataset field holding the prompt")
    label_key: str = opt("label", "dataset field holding the label")
    rm_type: str | None = opt(None, "reward: math, exact, token (target id in the response), remote "
                                    "(HTTP reward model, with --rm-url) or sim (the simulator's seeded reward)")
    rm_url: str | None = opt(None, "URL of a remote reward model for --rm-type remote", metavar="URL")
    custom_rm_path: str | None = opt(None, "module.function computing the reward (imports and runs that code)",
                                  metavar="PATH")
    group_rm: bool = opt(False, "compute rewards once per finished group (batched)")
    reward_key: str | None = opt(None, "which score of a dict-valued reward trains (default: 'reward', else "
                                       "the first key)", metavar="KEY")
    apply_chat_template: bool = opt(False, "format every prompt with the tokenizer's chat template (prompts "
                                           "as text or message lists; needs a tokenizer in --hf-checkpoint)")
    rollout_shuffle: bool = opt(False, "shuffle the prompts, each epoch in its own seeded order")


@dataclass(frozen=True)
class AlgoConfig:
    """The RL objective (seed steps 30, 38–40)."""

    title: ClassVar[str] = "algorithm"
    advantage_estimator: str = opt("grpo", "advantage estimator", choices=ADVANTAGE_ESTIMATORS)
    grpo_std_normalization: bool = opt(True, "divide group-centred rewards by the group std",
                                       negatable=True)
    loss_type: str = opt("policy_loss", "training loss", choices=LOSS_TYPES)
    eps_clip: float = opt(0.2, "PPO clip range (lower)", type=float)
    eps_clip_high: float | None = opt(None, "PPO clip range (upper; default --eps-clip)", type=float)
    eps_clip_c: float | None = opt(None, "dual-clip constant (> 1; off by default)", type=float)
    kl_coef: float = opt(0.0, "KL penalty coefficient in the reward", type=float)
    use_kl_loss: bool = opt(False, "add a KL loss against the reference model")
    kl_loss_coef: float = opt(0.0, "KL loss coefficient", type=float)
    kl_loss_type: str = opt("low_var_kl", "KL estimator of the KL loss: k1, k2, k3 or low_var_kl (k3 clamped)",
                            choices=("k1", "k2", "k3", "low_var_kl"))
    ref_load: str | None = opt(None, "reference model for the KL loss, an HF checkpoint directory (default: "
                                     "the initial --hf-checkpoint)", metavar="PATH")
    ref_placement: str = opt("gpu", "where the KL reference's weights live: gpu (a second bf16 copy beside the "
                                    "policy, sleeping and waking with it) or host (pinned host memory, copied to "
                                    "the GPU for its forward in every train call and freed after: one bf16 model "
                                    "copy less on each GPU for one host-to-GPU copy per step)",
                             choices=("gpu", "host"))
    entropy_coef: float = opt(0.0, "entropy bonus: the loss subtracts this times the mean token entropy",
                              type=float)
    use_tis: bool = opt(False, "truncated importance sampling: weight each token's loss by "
                               "clamp(π_train / π_rollout, --tis-clip-low, --tis-clip)")
    tis_clip: float = opt(2.0, "upper bound of the TIS weight", type=float)
    tis_clip_low: float = opt(0.0, "lower bound of the TIS weight", type=float)
    use_rollout_logprobs: bool = opt(False, "use the engine's log-probs as the PPO old log-probs")
    get_mismatch_metrics: bool = opt(False, "log train/rollout log-prob mismatch (forces a recompute)")
    use_critic: bool = opt(False, "train a critic (PPO)")
    use_opd: bool = opt(False, "on-policy distillation")
    use_routing_replay: bool = opt(False, "MoE routing replay")
    use_rollout_routing_replay: bool = opt(False, "MoE routing replay from the rollout engines")


@dataclass(frozen=True)
class EngineConfig:
    """vLLM server settings (seed step 2) and the backend choice."""

    title: ClassVar[str] = "engine"
    backend: str = opt("real", "run on real GPUs or on the simulator", choices=("sim", "real"),
                       commands=("train",))
    gpu_memory_utilization: float = opt(0.9, "fraction of GPU memory vLLM may use", type=float)
    max_num_seqs: int = opt(256, "max running sequences per engine", type=int)
    max_num_batched_tokens: int = opt(8192, "token budget per engine iteration (chunked prefill)",
                                      type=int)
    enforce_eager: bool = opt(False, "vLLM without CUDA graphs (vLLM's --enforce-eager): every engine iteration "
                                     "launches its kernels one by one, and no graph memory is held (more KV cache)")
    no_async_scheduling: bool = opt(False, "vLLM without async scheduling (vLLM's --no-async-scheduling; what vLLM "
                                           "before 0.10 always did): each step's CPU work (scheduling, input "
                                           "preparation, output processing) runs after its GPU work, not beside it")
    #: what ``--vllm-<server-flag> [VALUE]`` words reach `vllm serve` (vime.config.passthrough); not a flag itself
    vllm_extra_args: tuple[str, ...] = opt((), "vLLM server flags passed through", commands=())
    enable_expert_parallel: bool = opt(False, "vLLM expert parallelism: each engine places whole experts on its "
                                              "--rollout-num-gpus-per-engine GPUs (dispatch/combine all-to-all "
                                              "instead of the MLP all-reduce; MoE models)")


@dataclass(frozen=True)
class WeightSyncConfig:
    """Trainer → engine weight publication (seed steps 8, 45–52)."""

    title: ClassVar[str] = "weight sync"
    update_weight_buffer_size: int = opt(GiB, "bytes per weight bucket (accepts 512MiB, 1GiB)",
                                         type=parse_bytes, metavar="BYTES")
    update_weight_mode: str = opt("tensor", "tensor: CUDA IPC / NCCL buckets; disk: HF safetensors "
                                            "in a versioned directory", choices=("tensor", "disk"))
    update_weight_dir: str | None = opt(None, "with --update-weight-mode disk: where versioned HF checkpoints "
                                              "<dir>/v<N>/ are written (default: a temporary directory, or "
                                              "$VIME_UPDATE_WEIGHT_DIR)", metavar="DIR")
    flush_cache_interval: int = opt(1, "flush engine prefix caches every N weight versions "
                                       "(≤ 0: only on the first publication)", type=int)


@dataclass(frozen=True)
class SimConfig:
    """What the simulator models; accepted by both commands, only used by the simulator."""

    title: ClassVar[str] = "simulation"
    hardware: str = opt("H100-SXM-80G", "GPU preset name or hardware JSON file", metavar="NAME|FILE")
    model: str = opt("Qwen3-4B", "model preset name or HF config.json", metavar="NAME|FILE")
    response_length: LengthSpec | None = opt(None, "response-length distribution: " + _SPEC_GRAMMAR
                                             + " (default lognormal, median 0.4 × max, sigma 0.6)",
                                             metavar="SPEC")
    prompt_length: LengthSpec | None = opt(None, "prompt-length distribution, same grammar (default "
                                                 "uniform:max/8,max)", metavar="SPEC")
    moe_load_imbalance: float = opt(1.15, "MoE models: tokens the busiest expert-parallel rank receives over the "
                                          "mean (router load imbalance; 1 = perfectly balanced)", type=float)


@dataclass(frozen=True)
class OutputConfig:
    """How the command reports."""

    title: ClassVar[str] = "output"
    json: bool = opt(False, "print machine-readable JSON")
    dry_run: bool = opt(False, "print the resolved configuration and exit")
    trace_out: str | None = opt(None, "write a Chrome/Perfetto trace of the run: phases, calls, memory (JSON)",
                                metavar="FILE")
    report: str | None = opt(None, "write a self-contained HTML report (opens offline): one run's phases, timeline and "
                                   "memory per GPU; with --sweep/--search the ranked configurations", metavar="FILE")
    compare_sim: bool = opt(False, "after the run, simulate the same arguments and draw the run beside its simulation in "
                                   "the --report page, with each phase's error (also printed)", commands=("train",))
    report: str | None = opt(None, "write a self-contained HTML report of the run", metavar="FILE")
    record_calls: bool = opt(False, "record every protocol call the orchestrator makes (engines, router, trainer) "
                                    "and report them with start-up and each step (--json: a \"calls\" list; "
                                    "what `vime compare` reads)")
    sweep: tuple[str, ...] = opt((), "sweep a flag over values, e.g. --sweep micro-batch-size=4,8,16 "
                                     "(repeatable: the cross product is simulated)",
                                 metavar="FLAG=V1,V2,...", commands=("simulate",), action="append")
    search: str | None = opt(None, "search GPU count, TP, GPUs per engine, micro-batch size and memory "
                                   "utilisation, and where they apply the expert-parallel size (MoE), the async "
                                   "mode (--no-colocate) and the KL reference's placement "
                                   "(configurations that cannot fit or cannot beat the best so far "
                                   "are pruned unsimulated) for the fastest step that fits (fastest), the fewest "
                                   "GPUs that meet --target-step-time (fewest-gpus), or the fewest GPU-seconds "
                                   "per sample (cheapest, within --target-step-time when given)",
                             choices=("fastest", "fewest-gpus", "cheapest"), commands=("simulate",))
    target_step_time: float | None = opt(None, "T_step goal in seconds for --search fewest-gpus (a limit for cheapest)",
                                         type=float, metavar="SECONDS", commands=("simulate",))
    max_gpus: int = opt(64, "largest GPU count --search considers", type=int, commands=("simulate",))
    max_points: int = opt(10000, "largest --sweep cross product run without complaint (a guard against typos "
                                 "that would simulate for hours)", type=int, commands=("simulate",))
    csv: bool = opt(False, "print a sweep or search table as CSV", commands=("simulate",))
    workers: int | None = opt(None, "parallel processes for sweeps (default: all cores)", type=int,
                              commands=("simulate",))
    ray_address: str | None = opt(None, "a running Ray cluster to use (`ray start`, see README): vime train places "
                                        "its engines and trainer ranks on its nodes (default: $RAY_ADDRESS when "
                                        "set, else a private Ray on this machine); vime simulate runs sweep points "
                                        "there instead of local processes", metavar="ADDRESS")


@dataclass(frozen=True)
class LoggingConfig:
    """Experiment trackers (the same metric names in both; one step per rollout; `vime simulate` logs its simulated steps)."""

    title: ClassVar[str] = "logging"
    use_wandb: bool = opt(False, "log every step to wandb")
    wandb_mode: str = opt("online", "wandb mode: online, offline (a local run directory; `wandb sync` uploads it) "
                                    "or disabled", choices=("online", "offline", "disabled"))
    wandb_project: str | None = opt(None, "wandb project")
    wandb_group: str | None = opt(None, "wandb group")
    wandb_run_name: str | None = opt(None, "wandb run name")
    wandb_dir: str | None = opt(None, "where wandb writes its run directory (default: here)", metavar="DIR")
    use_tensorboard: bool = opt(False, "write a TensorBoard event file")
    tensorboard_dir: str | None = opt(None, "TensorBoard log directory (default: $TENSORBOARD_DIR, else "
                                            "./tensorboard)", metavar="DIR")


@dataclass(frozen=True)
class AsyncConfig:
    """Asynchronous RL (issue 22): whether rollout and training overlap on separate GPUs, and how stale a sample may be."""

    title: ClassVar[str] = "async"
    async_mode: str = opt("sync", "sync: the seed's step (rollout, then train, then publish); one-step-off: rollout "
                                  "k+1 runs while the trainer trains on rollout k; fully-async: a continuous producer "
                                  "keeps the engines busy and the trainer takes full batches (both need --no-colocate)",
                          choices=("sync", "one-step-off", "fully-async"))
    max_staleness: int = opt(1, "--async-mode fully-async: most weight versions a trained sample may lag the trainer "
                                "(older samples are regenerated)", type=int)
    partial_rollout: str = opt("abort-resume", "--async-mode fully-async, at a weight update: abort-resume aborts "
                                               "in-flight requests and resumes them under the new weights (the response "
                                               "keeps one weight version per span); keep freezes them and finishes "
                                               "them under the new weights (no cache flush)",
                               choices=("abort-resume", "keep"))


@dataclass(frozen=True)
class DerivedConfig:
    """Values computed once from the options (seed steps 1, 2, 18, 31); not flags."""

    title: ClassVar[str] = "derived"
    command: str = "simulate"
    actor_num_gpus: int = 0
    data_parallel_size: int = 0
    rollout_num_engines: int = 0
    samples_per_rollout: int = 0
    num_microbatches_per_step: int = 0
    rollout_concurrency: int = 0


GROUPS: tuple[Any, ...] = (ClusterConfig, ParallelConfig, TrainConfig, RolloutConfig, DataConfig,
                            AlgoConfig, EngineConfig, WeightSyncConfig, SimConfig, OutputConfig, LoggingConfig, AsyncConfig)

_GROUP_ATTR = {ClusterConfig: "cluster", ParallelConfig: "parallel", TrainConfig: "train",
               RolloutConfig: "rollout", DataConfig: "data", AlgoConfig: "algo", EngineConfig: "engine",
               WeightSyncConfig: "weight_sync", SimConfig: "sim", OutputConfig: "output", LoggingConfig: "logging",
               AsyncConfig: "async_rl",
               DerivedConfig: "derived"}

# name -> group attribute, for flat access (args.rollout_batch_size). Names must be unique.
_INDEX: dict[str, str] = {}
for _g in (*GROUPS, DerivedConfig):
    for _f in fields(_g):
        assert _f.name not in _INDEX, f"option {_f.name} declared twice"
        _INDEX[_f.name] = _GROUP_ATTR[_g]


def _flag(f: dataclasses.Field[Any]) -> str:
    return f.metadata["cli"]["flag"] or "--" + f.name.replace("_", "-")


def _flags_of(name: str) -> str:
    return "--" + name.replace("_", "-")

