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

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

from vime.errors import ConfigError

Command = Literal["train", "simulate"]
COMMANDS: tuple[str, ...] = ("train", "simulate")

#: Steps `vime simulate` runs when --num-rollout is not given.
SIMULATE_DEFAULT_NUM_ROLLOUT = 2

GiB = 1024**3

#: Router policies of vllm-router (see shared/VLLM_API.md); consistent_hash routes by session id.
ROUTER_POLICIES = ("round_robin", "random", "consistent_hash", "rendezvous_hash", "power_of_two", "cache_aware")
ADVANTAGE_ESTIMATORS = ("grpo", "gspo", "cispo", "reinforce_plus_plus_baseline")
LOSS_TYPES = ("policy_loss", "sft_loss", "custom_loss")

# --------------------------------------------------------------------------------------------
# Length distributions for the simulator (--response-length / --prompt-length)
# --------------------------------------------------------------------------------------------

LengthKind = Literal["fixed", "uniform", "lognormal", "trace"]
_SPEC_GRAMMAR = "fixed:N | uniform:A,B | lognormal:MU,SIGMA | trace:FILE.jsonl"

#: Default response-length model: lognormal with median 40 % of --rollout-max-response-len and
#: sigma 0.6, clipped at the maximum. For the seed (max 1024) the median is ~410 tokens, the mean
#: ~490 and ~6 % of responses hit the cap — the long-tailed mix of a math-reasoning GRPO run,
#: where a few long responses decide when a group (and the rollout) finishes.
DEFAULT_RESPONSE_MEDIAN_FRACTION = 0.4
DEFAULT_RESPONSE_SIGMA = 0.6
#: Default prompt-length model: uniform between 1/8 of --rollout-max-prompt-len and the maximum
#: (64..512 for the seed; the seed's worked example uses a 200-token prompt).
DEFAULT_PROMPT_MIN_FRACTION = 8


@dataclass(frozen=True)
class LengthSpec:
    """A token-length distribution parsed from ``fixed:N``, ``uniform:A,B``, ``lognormal:MU,SIGMA`` or ``trace:FILE``.

    ``fixed``: always N (N ≥ 1). ``uniform``: integers A..B inclusive (1 ≤ A ≤ B).
    ``lognormal``: exp(Normal(MU, SIGMA)) with SIGMA > 0 (MU in log-tokens, so the median is
    exp(MU)). ``trace``: lengths read from a JSONL file by the simulator. Every draw is capped
    at ``cap`` (the matching --rollout-max-*-len) by whoever samples it.
    """

    kind: LengthKind
    params: tuple[float, ...] = ()
    path: str | None = None
    cap: int | None = None

    def __str__(self) -> str:
        if self.kind == "trace":
            return f"trace:{self.path}"
        if self.kind == "lognormal":
            return f"lognormal:{self.params[0]:.6g},{self.params[1]:.6g}"
        return f"{self.kind}:" + ",".join(str(int(p)) for p in self.params)

    def to_dict(self) -> dict[str, Any]:
        return {"spec": str(self), "kind": self.kind, "params": list(self.params), "path": self.path,
                "cap": self.cap}


def parse_length_spec(text: str, *, flag: str = "--response-length", cap: int | None = None) -> LengthSpec:
    """Parse a length SPEC string; raises ConfigError naming `flag`, the value and the grammar."""
    def bad(why: str) -> ConfigError:
        return ConfigError(f"{flag} {text!r}: {why}; expected {_SPEC_GRAMMAR}")

    kind, sep, rest = text.strip().partition(":")
    kind = kind.strip().lower()
    if not sep or not rest.strip():
        raise bad("missing ':' and parameters")
    rest = rest.strip()
    if kind == "trace":
        return LengthSpec("trace", (), rest, cap)
    parts = [p.strip() for p in rest.split(",")]
    if kind == "fixed":
        if len(parts) != 1:
            raise bad("fixed takes one integer N")
        n = _spec_int(parts[0], bad)
        if n < 1:
            raise bad("N must be ≥ 1")
        return LengthSpec("fixed", (n,), None, cap)
    if kind == "uniform":
        if len(parts) != 2:
            raise bad("uniform takes two integers A,B")
        a, b = _spec_int(parts[0], bad), _spec_int(parts[1], bad)
        if not 1 <= a <= b:
            raise bad("need 1 ≤ A ≤ B")
        return LengthSpec("uniform", (a, b), None, cap)
    if kind == "lognormal":
        if len(parts) != 2:
            raise bad("lognormal takes two numbers MU,SIGMA")
        try:
            mu, sigma = float(parts[0]), float(parts[1])
        except ValueError:
            raise bad("MU and SIGMA must be numbers") from None
        if not (math.isfinite(mu) and math.isfinite(sigma)) or sigma <= 0:
            raise bad("MU must be finite and SIGMA > 0")
        return LengthSpec("lognormal", (mu, sigma), None, cap)
    raise bad(f"unknown kind {kind!r}")


def _spec_int(text: str, bad: Any) -> int:
    try:
        return int(text)
    except ValueError:
        raise bad(f"{text!r} is not an integer") from None


def default_response_spec(max_response_len: int) -> LengthSpec:
    """The documented default response-length model for a given --rollout-max-response-len."""
    mu = math.log(DEFAULT_RESPONSE_MEDIAN_FRACTION * max_response_len)
    return LengthSpec("lognormal", (round(mu, 6), DEFAULT_RESPONSE_SIGMA), None, max_response_len)


def default_prompt_spec(max_prompt_len: int) -> LengthSpec:
    """The documented default prompt-length model for a given --rollout-max-prompt-len."""
    low = max(1, max_prompt_len // DEFAULT_PROMPT_MIN_FRACTION)
    return LengthSpec("uniform", (low, max_prompt_len), None, max_prompt_len)


# --------------------------------------------------------------------------------------------
# Option declarations
# --------------------------------------------------------------------------------------------

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


@dataclass(frozen=True)
class ParallelConfig:
    """Megatron model parallelism; DP is what remains of the actor GPUs."""

    title: ClassVar[str] = "parallel"
    tensor_model_parallel_size: int = opt(2, "Megatron tensor-parallel size", type=int)
    pipeline_model_parallel_size: int = opt(1, "Megatron pipeline-parallel size", type=int)
    context_parallel_size: int = opt(1, "Megatron context-parallel size", type=int)
    use_distributed_optimizer: bool = opt(True, "shard optimizer state across DP ranks", negatable=True)


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
    seed: int = opt(1234, "random seed (trainer, data order, simulator)", type=int)
    num_rollout: int = opt(100, "number of rollouts (RL steps) to run; `vime simulate` defaults to "
                                "2 simulated steps", type=int)
    num_epoch: int | None = opt(None, "epochs over --prompt-data (sets the number of rollouts from the "
                                      "dataset size when given)", type=int)
    start_rollout_id: int = opt(0, "first rollout id (resume)", type=int)
    eval_interval: int | None = opt(None, "evaluate every N rollouts", type=int)
    save_interval: int | None = opt(None, "checkpoint every N rollouts (needs --save)", type=int)
    save: str | None = opt(None, "checkpoint directory to write", metavar="PATH")
    load: str | None = opt(None, "checkpoint directory to resume from", metavar="PATH")
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
    dynamic_sampling_filter_path: str | None = opt(None, "module.function that drops finished groups",
                                                   metavar="PATH")
    custom_generate_function_path: str | None = opt(None, "module.function replacing generate()",
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
    custom_rm_path: str | None = opt(None, "module.function computing the reward", metavar="PATH")
    group_rm: bool = opt(False, "compute rewards once per finished group (batched)")


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


@dataclass(frozen=True)
class OutputConfig:
    """How the command reports."""

    title: ClassVar[str] = "output"
    json: bool = opt(False, "print machine-readable JSON")
    dry_run: bool = opt(False, "print the resolved configuration and exit")
    trace_out: str | None = opt(None, "write a Chrome/Perfetto trace of the simulation (JSON)",
                                metavar="FILE", commands=("simulate",))
    report: str | None = opt(None, "write a self-contained HTML report of the simulation",
                             metavar="FILE", commands=("simulate",))
    sweep: tuple[str, ...] = opt((), "sweep a flag over values, e.g. --sweep micro-batch-size=4,8,16 "
                                     "(repeatable: the cross product is simulated)",
                                 metavar="FLAG=V1,V2,...", commands=("simulate",), action="append")
    search: str | None = opt(None, "search GPU count, TP, GPUs per engine, micro-batch size and memory "
                                   "utilisation for the fastest step that fits (fastest) or the fewest "
                                   "GPUs that meet --target-step-time (fewest-gpus)",
                             choices=("fastest", "fewest-gpus"), commands=("simulate",))
    target_step_time: float | None = opt(None, "T_step goal in seconds for --search fewest-gpus",
                                         type=float, metavar="SECONDS", commands=("simulate",))
    max_gpus: int = opt(64, "largest GPU count --search considers", type=int, commands=("simulate",))
    csv: bool = opt(False, "print a sweep or search table as CSV", commands=("simulate",))
    workers: int | None = opt(None, "parallel processes for sweeps (default: all cores)", type=int,
                              commands=("simulate",))
    ray_address: str | None = opt(None, "run sweep points on this Ray cluster instead of local processes",
                                  metavar="ADDRESS", commands=("simulate",))


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
                            AlgoConfig, EngineConfig, WeightSyncConfig, SimConfig, OutputConfig)

_GROUP_ATTR = {ClusterConfig: "cluster", ParallelConfig: "parallel", TrainConfig: "train",
               RolloutConfig: "rollout", DataConfig: "data", AlgoConfig: "algo", EngineConfig: "engine",
               WeightSyncConfig: "weight_sync", SimConfig: "sim", OutputConfig: "output",
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


# --------------------------------------------------------------------------------------------
# Parser
# --------------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of exiting, so library callers get an exception."""

    def error(self, message: str) -> Any:  # type: ignore[override]
        raise ConfigError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def _add_options(parser: argparse.ArgumentParser, command: str) -> None:
    for group_cls in GROUPS:
        doc = (group_cls.__doc__ or "").strip().splitlines()[0]
        grp = parser.add_argument_group(group_cls.title, doc)
        for f in fields(group_cls):
            meta = f.metadata["cli"]
            if command not in meta["commands"]:
                continue
            kw: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS, "help": meta["help"]}
            if f.type in ("bool", "bool | None"):
                kw["action"] = argparse.BooleanOptionalAction if meta["negatable"] else "store_true"
                if f.default is not None:
                    kw["help"] += f" (default: {'on' if f.default else 'off'})"
            else:
                if meta["type"] is not None:
                    kw["type"] = meta["type"]
                if meta["choices"]:
                    kw["choices"] = meta["choices"]
                if meta["nargs"]:
                    kw["nargs"] = meta["nargs"]
                if meta["action"]:
                    kw["action"] = meta["action"]
                metavar = meta["metavar"] or {int: "N", float: "X"}.get(meta["type"])
                if metavar:
                    kw["metavar"] = metavar
                if f.default is not None and not isinstance(f.default, bool):
                    kw["help"] += f" (default: {f.default})"
            grp.add_argument(_flag(f), **kw)


def build_parser() -> argparse.ArgumentParser:
    """The `vime` parser: subcommands `train` and `simulate`, built from the same option declarations."""
    parser = _Parser(prog="vime", description="RL post-training on real GPUs (train) or in a "
                                              "simulator of GPU memory and timing (simulate).")
    sub = parser.add_subparsers(dest="command", metavar="{train,simulate}", required=True)
    for command, help_ in (("train", "run RL training (real GPUs, or --backend sim)"),
                           ("simulate", "simulate the RL step: time per phase, memory per GPU, OOM")):
        p = sub.add_parser(command, help=help_, description=help_)
        _add_options(p, command)
    return parser


# --------------------------------------------------------------------------------------------
# Args
# --------------------------------------------------------------------------------------------


class Args:
    """The resolved, validated configuration; read-only.

    Flat attribute access uses slime's names (``args.rollout_batch_size``,
    ``args.global_batch_size``, ``args.tensor_model_parallel_size``); the groups are also
    reachable (``args.rollout``, ``args.parallel`` ...). Optional options that the seed derives
    (global_batch_size, eps_clip_high, over_sampling_batch_size, rollout_num_gpus, offloads,
    length specs) hold their resolved values. Use `replace` to get a changed, re-validated copy.
    """

    cluster: ClusterConfig
    parallel: ParallelConfig
    train: TrainConfig
    rollout: RolloutConfig
    data: DataConfig
    algo: AlgoConfig
    engine: EngineConfig
    weight_sync: WeightSyncConfig
    sim: SimConfig
    output: OutputConfig
    derived: DerivedConfig

    def __init__(self, groups: dict[str, Any]) -> None:
        for name, value in groups.items():
            object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        group = _INDEX.get(name)
        if group is None:
            raise AttributeError(f"Args has no option {name!r}")
        return getattr(object.__getattribute__(self, group), name)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"Args is read-only; use args.replace({name}=...) for a changed copy")

    def __repr__(self) -> str:
        return f"Args(command={self.command!r}, {len(_INDEX)} options)"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Args) and self.to_dict() == other.to_dict()

    __hash__ = None  # type: ignore[assignment]

    @property
    def dp_size(self) -> int:
        return int(self.derived.data_parallel_size)

    @property
    def command(self) -> str:
        return self.derived.command

    def groups(self) -> Iterator[tuple[str, dict[str, Any]]]:
        """(title, {name: JSON-able value}) per group, derived last — for tables."""
        for cls in (*GROUPS, DerivedConfig):
            group = getattr(self, _GROUP_ATTR[cls])
            yield cls.title, {f.name: _jsonable(getattr(group, f.name)) for f in fields(group)}

    def to_dict(self) -> dict[str, Any]:
        """Every option and derived value by its slime name, JSON-able (length specs as strings)."""
        out: dict[str, Any] = {}
        for _, items in self.groups():
            out.update(items)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=False)

    def replace(self, **changes: Any) -> Args:
        """A copy with some options changed, re-validated and re-derived (derived values cannot be set)."""
        raw = self._raw_options()
        for name, value in changes.items():
            if name not in _INDEX or _INDEX[name] == "derived":
                raise ConfigError(f"{name!r} cannot be set: it is derived or not an option")
            raw[name] = value
        return _resolve(raw, self.command)

    def _raw_options(self) -> dict[str, Any]:
        return dict(object.__getattribute__(self, "_raw"))


def _jsonable(value: Any) -> Any:
    if isinstance(value, LengthSpec):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    return value


def parse_args(argv: Sequence[str] | None = None, command: str | None = None) -> Args:
    """Parse a command line into validated `Args`; every inconsistency raises ConfigError.

    With `command` ("train" or "simulate") `argv` holds only options; without it `argv[0]` is
    the subcommand. ``argv=None`` reads ``sys.argv[1:]``.
    """
    import sys

    args_list = list(sys.argv[1:] if argv is None else argv)
    if command is not None:
        if command not in COMMANDS:
            raise ConfigError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
        args_list = [command, *args_list]
    ns = build_parser().parse_args(args_list)
    raw = {k: v for k, v in vars(ns).items() if k != "command"}
    return _resolve(raw, ns.command)


def defaults(command: str = "simulate") -> Args:
    """The seed scenario: `parse_args([], command)`."""
    return parse_args([], command=command)


# --------------------------------------------------------------------------------------------
# Validation and derivation (seed step 1) — the only place cross-flag rules live
# --------------------------------------------------------------------------------------------


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _resolve(raw: dict[str, Any], command: str) -> Args:
    """Fill defaults, validate, derive; `raw` holds only the options given (plus earlier resolutions)."""
    values: dict[str, Any] = {}
    for cls in GROUPS:
        for f in fields(cls):
            values[f.name] = raw.get(f.name, f.default)
    given = set(raw)
    if command == "simulate":
        values["backend"] = "sim"
        # Steps repeat in steady state, so the simulator's default is a few of them, not the
        # seed's 100 (which `vime train` keeps); pass --num-rollout to simulate more.
        if "num_rollout" not in given:
            values["num_rollout"] = SIMULATE_DEFAULT_NUM_ROLLOUT

    v = values
    # -- plain ranges -------------------------------------------------------------------------
    for name in ("actor_num_nodes", "actor_num_gpus_per_node", "rollout_num_gpus_per_engine",
                 "tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                 "micro_batch_size", "rollout_batch_size", "n_samples_per_prompt",
                 "rollout_max_prompt_len", "rollout_max_response_len", "rollout_max_context_len",
                 "vllm_server_concurrency", "max_num_seqs", "max_num_batched_tokens",
                 "update_weight_buffer_size"):
        _need(isinstance(v[name], int) and v[name] >= 1,
              f"{_flags_of(name)} must be a positive integer, got {v[name]!r}")
    for name in ("num_steps_per_rollout", "global_batch_size", "over_sampling_batch_size",
                 "rollout_num_gpus", "eval_interval", "save_interval", "num_epoch"):
        if v[name] is not None:
            _need(v[name] >= 1, f"{_flags_of(name)} must be ≥ 1, got {v[name]}; leave it out for the default")
    _need(v["num_rollout"] >= 0, f"--num-rollout must be ≥ 0, got {v['num_rollout']}")
    _need(0 <= v["start_rollout_id"] <= v["num_rollout"],
          f"--start-rollout-id {v['start_rollout_id']} must lie in [0, --num-rollout {v['num_rollout']}]")
    _need(v["lr"] >= 0, f"--lr must be ≥ 0, got {v['lr']}")
    _need(v["save_interval"] is None or v["save"] is not None,
          f"--save-interval {v['save_interval']} needs --save PATH to know where to write checkpoints")

    # -- placement: colocate, offloads, engines (seed steps 2–3) -------------------------------
    actor_gpus = v["actor_num_nodes"] * v["actor_num_gpus_per_node"]
    if v["colocate"]:
        for off in ("offload_train", "offload_rollout"):
            _need(v[off] is not False,
                  f"--no-{off.replace('_', '-')} contradicts --colocate: colocated trainer and engines "
                  f"take turns on the same GPUs, so both must offload; drop --no-{off.replace('_', '-')} "
                  f"or pass --no-colocate")
            v[off] = True
        if v["rollout_num_gpus"] is not None:
            _need(v["rollout_num_gpus"] == actor_gpus,
                  f"--rollout-num-gpus {v['rollout_num_gpus']} differs from the actor GPUs "
                  f"(--actor-num-nodes {v['actor_num_nodes']} × --actor-num-gpus-per-node "
                  f"{v['actor_num_gpus_per_node']} = {actor_gpus}) under --colocate; leave it out or "
                  f"set it to {actor_gpus}")
        v["rollout_num_gpus"] = actor_gpus
    else:
        _need(v["rollout_num_gpus"] is not None,
              "--no-colocate needs --rollout-num-gpus N (GPUs for the engines, apart from the trainer's)")
        v["offload_train"] = bool(v["offload_train"])
        v["offload_rollout"] = bool(v["offload_rollout"])
    rg, per_engine = v["rollout_num_gpus"], v["rollout_num_gpus_per_engine"]
    _need(rg % per_engine == 0,
          f"--rollout-num-gpus-per-engine {per_engine} does not divide --rollout-num-gpus {rg}; pick a "
          f"divisor of {rg} (e.g. {_divisor_near(rg, per_engine)})")
    engines = rg // per_engine

    # -- Megatron parallelism ------------------------------------------------------------------
    tp, pp, cp = (v["tensor_model_parallel_size"], v["pipeline_model_parallel_size"],
                  v["context_parallel_size"])
    mp = tp * pp * cp
    _need(actor_gpus % mp == 0,
          f"--tensor-model-parallel-size {tp} × --pipeline-model-parallel-size {pp} × "
          f"--context-parallel-size {cp} = {mp} does not divide the {actor_gpus} actor GPUs "
          f"(--actor-num-nodes {v['actor_num_nodes']} × --actor-num-gpus-per-node "
          f"{v['actor_num_gpus_per_node']}); choose sizes whose product divides {actor_gpus}")
    dp = actor_gpus // mp

    # -- batches and steps (seed steps 1 and 31) -----------------------------------------------
    rbs, n = v["rollout_batch_size"], v["n_samples_per_prompt"]
    total = rbs * n
    steps, gbs = v["num_steps_per_rollout"], v["global_batch_size"]
    if steps is None and gbs is None:
        steps = 1
    if steps is not None:
        _need(total % steps == 0,
              f"--num-steps-per-rollout {steps} does not divide the {total} samples per rollout "
              f"(--rollout-batch-size {rbs} × --n-samples-per-prompt {n}); use a divisor of {total}")
        derived_gbs = total // steps
        _need(gbs is None or gbs == derived_gbs,
              f"--global-batch-size {gbs} contradicts --num-steps-per-rollout {steps}: {rbs} × {n} // "
              f"{steps} = {derived_gbs}; pass only one of the two")
        gbs = derived_gbs
    else:
        _need(gbs <= total and total % gbs == 0,
              f"--global-batch-size {gbs} does not divide the {total} samples per rollout "
              f"(--rollout-batch-size {rbs} × --n-samples-per-prompt {n}); use a divisor of {total}")
        steps = total // gbs
    v["num_steps_per_rollout"], v["global_batch_size"] = steps, gbs
    mbs = v["micro_batch_size"]
    _need(gbs % (mbs * dp) == 0,
          f"--global-batch-size {gbs} is not divisible by --micro-batch-size {mbs} × DP {dp} = "
          f"{mbs * dp} (DP = {actor_gpus} GPUs / (TP {tp} × PP {pp} × CP {cp})); every DP rank needs "
          f"the same number of micro-batches — change --micro-batch-size, the batch, or the parallelism")
    if v["over_sampling_batch_size"] is None:
        v["over_sampling_batch_size"] = rbs

    # -- lengths (seed step 19) ----------------------------------------------------------------
    p, r, c = v["rollout_max_prompt_len"], v["rollout_max_response_len"], v["rollout_max_context_len"]
    _need(p + r <= c,
          f"--rollout-max-prompt-len {p} + --rollout-max-response-len {r} = {p + r} exceeds "
          f"--rollout-max-context-len {c}; raise the context to ≥ {p + r} or shorten prompt/response")
    _need(v["max_num_batched_tokens"] >= v["max_num_seqs"],
          f"--max-num-batched-tokens {v['max_num_batched_tokens']} is below --max-num-seqs "
          f"{v['max_num_seqs']}; vLLM needs at least one token per running sequence per iteration")
    _need(0 < v["gpu_memory_utilization"] <= 1,
          f"--gpu-memory-utilization must lie in (0, 1], got {v['gpu_memory_utilization']}")

    # -- sampling --------------------------------------------------------------------------------
    _need(v["rollout_temperature"] >= 0, f"--rollout-temperature must be ≥ 0, got {v['rollout_temperature']}")
    _need(0 < v["rollout_top_p"] <= 1, f"--rollout-top-p must lie in (0, 1], got {v['rollout_top_p']}")
    _need(v["rollout_top_k"] >= -1, f"--rollout-top-k must be -1 (off), 0 (off) or positive, got "
                                    f"{v['rollout_top_k']}")
    _need(v["score_centering_top_k"] >= 0,
          f"--score-centering-top-k must be ≥ 0, got {v['score_centering_top_k']}")
    _need(not (v["use_score_centering"] and v["rollout_top_p"] == 1 and v["score_centering_top_k"] < 1),
          "--use-score-centering with --rollout-top-p 1 needs --score-centering-top-k ≥ 1")

    # -- algorithm (seed steps 1, 40) ------------------------------------------------------------
    eps = v["eps_clip"]
    _need(0 <= eps < 1, f"--eps-clip must lie in [0, 1), got {eps}")
    if v["eps_clip_high"] is None:
        v["eps_clip_high"] = eps
    _need(v["eps_clip_high"] >= 0, f"--eps-clip-high must be ≥ 0, got {v['eps_clip_high']}")
    _need(v["eps_clip_c"] is None or v["eps_clip_c"] > 1,
          f"--eps-clip-c {v['eps_clip_c']} must be > 1 (dual clip bounds the loss of negative advantages "
          f"at eps_clip_c × |A|); leave it out to disable dual clip")
    _need(v["kl_coef"] >= 0 and v["kl_loss_coef"] >= 0,
          f"--kl-coef {v['kl_coef']} and --kl-loss-coef {v['kl_loss_coef']} must be ≥ 0")
    _need(not (v["use_rollout_routing_replay"] and not v["use_routing_replay"]),
          "--use-rollout-routing-replay needs --use-routing-replay")

    # -- simulation inputs -----------------------------------------------------------------------
    for name, cap, default_fn in (("response_length", r, default_response_spec),
                                  ("prompt_length", p, default_prompt_spec)):
        spec = v[name]
        flag = _flags_of(name)
        if spec is None:
            spec = default_fn(cap)
        elif isinstance(spec, str):
            spec = parse_length_spec(spec, flag=flag, cap=cap)
        else:
            spec = dataclasses.replace(spec, cap=cap)
        limit_flag = "--rollout-max-response-len" if name == "response_length" else "--rollout-max-prompt-len"
        if spec.kind in ("fixed", "uniform"):
            _need(max(spec.params) <= cap,
                  f"{flag} {spec} draws lengths up to {int(max(spec.params))}, above {limit_flag} {cap}; "
                  f"lower the spec or raise {limit_flag}")
        if spec.kind == "trace":
            _need(spec.path is not None and os.path.isfile(spec.path.partition("#")[0]),
                  f"{flag} {spec}: trace file not found; give an existing JSONL file")
        v[name] = spec
    for name in ("hardware", "model"):
        val = v[name]
        _need(isinstance(val, str) and val.strip() != "", f"{_flags_of(name)} must not be empty")
        if val.endswith(".json"):
            _need(os.path.isfile(val), f"{_flags_of(name)} {val}: file not found; give a preset name or "
                                       f"an existing JSON file")

    derived = DerivedConfig(
        command=command,
        actor_num_gpus=actor_gpus,
        data_parallel_size=dp,
        rollout_num_engines=engines,
        samples_per_rollout=total,
        num_microbatches_per_step=gbs // (mbs * dp),
        rollout_concurrency=v["vllm_server_concurrency"] * engines,
    )
    groups: dict[str, Any] = {"derived": derived}
    for cls in GROUPS:
        groups[_GROUP_ATTR[cls]] = cls(**{f.name: v[f.name] for f in fields(cls)})
    args = Args(groups)
    object.__setattr__(args, "_raw", {k: raw[k] for k in given})
    return args


def _divisor_near(n: int, want: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - want), d))
