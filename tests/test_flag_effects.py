"""Every flag `vime train --backend real` accepts acts there, or is refused at parse time (issue 19's rule).

`FLAGS` has one entry per option of the train parser (its dest): an `Effect` (the flag, given, changes
what a probe of the real trainer/rollout returns, `flag_probes`), a `Refused` (parsing fails with a
message naming the flag, the backend and what to use instead) or an `Output` (it changes only what
vime prints or writes, with why). A parser option without an entry fails the test, so a new flag
needs its effect or its refusal written down here. To add one: one line in `FLAGS`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import flag_probes as P
import pytest

from vime.config import build_parser, parse_args
from vime.config.aliases import ALIASES, RENAMES
from vime.errors import ConfigError

BASE = ("--backend", "real", "--hf-checkpoint", "{model}", "--prompt-data", "{data}", "--rollout-batch-size", "4",
        "--n-samples-per-prompt", "4", "--micro-batch-size", "1", "--rollout-max-prompt-len", "64",
        "--rollout-max-response-len", "32", "--num-rollout", "2")
KL = ("--use-kl-loss", "--kl-loss-coef", "0.1")
DISAGG = ("--no-colocate", "--rollout-num-gpus", "4", "--actor-num-gpus-per-node", "4", "--update-weight-mode", "disk")
EVAL = ("--eval-prompt-data", "ev", "{eval}", "--eval-interval", "1")


@dataclass(frozen=True)
class Effect:
    """Given `argv` (after BASE + `base`), `probe` of the resolved options returns something else."""

    argv: tuple[str, ...]
    probe: Callable[[Any], Any]
    base: tuple[str, ...] = ()
    drop: tuple[str, ...] = ()  # BASE flags (with their value) left out, e.g. --num-rollout for --num-epoch


@dataclass(frozen=True)
class Refused:
    """Given `argv`, parsing fails naming the flag, the real backend and `instead`."""

    argv: tuple[str, ...]
    instead: str


@dataclass(frozen=True)
class Output:
    """Changes only what vime prints or writes (tested where that output is), not what trains."""

    why: str


def _rm(name: str) -> str:
    return f"{__name__}.{name}"


FLAGS: dict[str, Effect | Refused | Output] = {
    # cluster and placement
    "actor_num_nodes": Effect(("--actor-num-nodes", "2"), P.placement),
    "actor_num_gpus_per_node": Effect(("--actor-num-gpus-per-node", "4"), P.placement),
    "rollout_num_gpus": Effect(("--rollout-num-gpus", "2"), P.placement, base=DISAGG),
    "rollout_num_gpus_per_engine": Effect(("--rollout-num-gpus-per-engine", "4"), P.server),
    "colocate": Effect(("--no-colocate", "--rollout-num-gpus", "4", "--actor-num-gpus-per-node", "4",
                        "--update-weight-mode", "disk"), P.placement),
    "offload_train": Effect(("--no-offload-train",), P.calls),
    "offload_rollout": Effect(("--offload-rollout",), P.server, base=DISAGG),
    "train_offload_backend": Effect(("--train-offload-backend", "torch_memory_saver"), P.actor_field("offload_backend")),
    "train_offload_plan": Effect(("--train-offload-plan", "params,grads"), P.actor_field("train_offload_plan")),
    # Megatron
    "tensor_model_parallel_size": Effect(("--tensor-model-parallel-size", "4"), P.actor_field("tensor_model_parallel_size")),
    "pipeline_model_parallel_size": Refused(("--pipeline-model-parallel-size", "2"), "--tensor-model-parallel-size"),
    "context_parallel_size": Refused(("--context-parallel-size", "2"), "--tensor-model-parallel-size"),
    "use_distributed_optimizer": Effect(("--no-use-distributed-optimizer",), P.optimizer),
    "grad_reduce_in_bf16": Effect(("--grad-reduce-in-bf16",), P.ddp),
    "recompute_granularity": Effect(("--recompute-granularity", "full"), P.model),
    "sequence_parallel": Refused(("--sequence-parallel",), "vime simulate"),
    # MoE (issue 21): the real trainer trains Qwen3-MoE at any EP × ETP (MegatronActor.setup), the engines take
    # vLLM's expert parallelism
    "expert_model_parallel_size": Effect(("--expert-model-parallel-size", "2"),
                                         P.actor_field("expert_model_parallel_size"),
                                         base=("--hf-checkpoint", "{moe}"), drop=("--hf-checkpoint",)),
    "expert_tensor_parallel_size": Effect(("--expert-tensor-parallel-size", "1"),
                                          P.actor_field("expert_tensor_parallel_size"),
                                          base=("--hf-checkpoint", "{moe}"), drop=("--hf-checkpoint",)),
    "enable_expert_parallel": Effect(("--enable-expert-parallel",), P.server),
    "bf16": Effect(("--bf16",), P.model),
    "fp16": Effect(("--fp16",), P.optimizer),
    # train loop
    "global_batch_size": Effect(("--global-batch-size", "8"), P.calls),
    "num_steps_per_rollout": Effect(("--num-steps-per-rollout", "2"), P.calls),
    "micro_batch_size": Effect(("--micro-batch-size", "2"), P.calls),
    "calculate_per_token_loss": Effect(("--calculate-per-token-loss",), P.loss),
    "lr": Effect(("--lr", "1e-5"), P.optimizer),
    "clip_grad": Effect(("--clip-grad", "0.5"), P.optimizer),
    "weight_decay": Effect(("--weight-decay", "0.1"), P.optimizer),
    "adam_beta1": Effect(("--adam-beta1", "0.8"), P.optimizer),
    "adam_beta2": Effect(("--adam-beta2", "0.95"), P.optimizer),
    "adam_eps": Effect(("--adam-eps", "1e-6"), P.optimizer),
    "seed": Effect(("--seed", "7"), P.server),  # and ActorConfig.seed, the rollout's session ids
    "num_rollout": Effect(("--num-rollout", "1"), P.calls),
    # the orchestrator runs range(start_rollout_id, num_rollout) (num_rollout's entry shows the calls follow it)
    "num_epoch": Effect(("--num-epoch", "1"), lambda a: a.train.num_rollout, drop=("--num-rollout",)),
    "start_rollout_id": Effect(("--start-rollout-id", "1"), P.calls),
    "eval_interval": Effect(("--eval-interval", "2"), P.calls, base=EVAL),
    "eval_prompt_data": Effect(EVAL, P.requests),
    "n_samples_per_eval_prompt": Effect(("--n-samples-per-eval-prompt", "2"), P.requests, base=EVAL),
    "eval_max_response_len": Effect(("--eval-max-response-len", "16"), P.requests, base=EVAL),
    "eval_temperature": Effect(("--eval-temperature", "0.5"), P.requests, base=EVAL),
    "eval_top_p": Effect(("--eval-top-p", "0.5"), P.requests, base=EVAL),
    "eval_top_k": Effect(("--eval-top-k", "5"), P.requests, base=EVAL),
    "save_interval": Effect(("--save-interval", "1"), P.calls, base=("--save", "{dir}/ckpt-interval")),
    "save": Effect(("--save", "{dir}/ckpt-save"), P.calls),
    "load": Effect(("--load", "{dir}/ckpt"), P.calls),
    "hf_checkpoint": Effect(("--hf-checkpoint", "{model2}"), P.server),
    # rollout
    "rollout_batch_size": Effect(("--rollout-batch-size", "8"), P.rollout),
    "n_samples_per_prompt": Effect(("--n-samples-per-prompt", "8"), P.rollout),
    "over_sampling_batch_size": Effect(("--over-sampling-batch-size", "8"), P.rollout),
    "rollout_max_prompt_len": Effect(("--rollout-max-prompt-len", "16"), P.rollout),
    "rollout_max_response_len": Effect(("--rollout-max-response-len", "4"), P.rollout),
    "rollout_max_context_len": Effect(("--rollout-max-context-len", "2048"), P.server),
    "rollout_temperature": Effect(("--rollout-temperature", "0.7"), P.rollout),
    "rollout_top_p": Effect(("--rollout-top-p", "0.9"), P.wire),
    "rollout_top_k": Effect(("--rollout-top-k", "20"), P.wire),
    "rollout_stop": Effect(("--rollout-stop", "END"), P.wire),
    "rollout_stop_token_ids": Effect(("--rollout-stop-token-ids", "3"), P.wire),
    "rollout_skip_special_tokens": Effect(("--rollout-skip-special-tokens",), P.wire),
    "vllm_server_concurrency": Effect(("--vllm-server-concurrency", "1"), P.rollout),
    "router_policy": Effect(("--router-policy", "consistent_hash"), P.rollout),
    "dynamic_sampling_filter_path": Effect(("--dynamic-sampling-filter-path", _rm("even_groups")), P.rollout),
    "custom_generate_function_path": Effect(("--custom-generate-function-path", _rm("cool_generate")), P.rollout),
    "use_score_centering": Effect(("--use-score-centering", "--score-centering-top-k", "2"), P.wire),
    "score_centering_top_k": Effect(("--score-centering-top-k", "5"), P.wire,
                                    base=("--use-score-centering", "--score-centering-top-k", "2")),
    # data and reward
    "prompt_data": Effect(("--prompt-data", "{eval}"), P.rollout),
    "input_key": Effect(("--input-key", "question"), P.rollout),
    "label_key": Effect(("--label-key", "answer"), P.rollout),
    "rm_type": Effect(("--rm-type", "exact"), P.rollout),
    "rm_url": Effect(("--rm-url", "http://127.0.0.1:9/b"), P.remote_reward, base=("--rm-type", "remote", "--rm-url",
                                                                                  "http://127.0.0.1:9/a")),
    "custom_rm_path": Effect(("--custom-rm-path", _rm("length_reward")), P.rollout),
    "group_rm": Effect(("--group-rm",), P.rollout, base=("--custom-rm-path", _rm("length_reward"))),
    "reward_key": Effect(("--reward-key", "acc"), P.batch),
    "apply_chat_template": Effect(("--apply-chat-template",), P.rollout),
    "rollout_shuffle": Effect(("--rollout-shuffle",), P.rollout),
    # algorithm
    "advantage_estimator": Effect(("--advantage-estimator", "gspo"), P.loss),
    "grpo_std_normalization": Effect(("--no-grpo-std-normalization",), P.batch),
    "loss_type": Refused(("--loss-type", "sft_loss"), "policy_loss"),
    "eps_clip": Effect(("--eps-clip", "0.1"), P.loss),
    "eps_clip_high": Effect(("--eps-clip-high", "0.5"), P.loss),
    "eps_clip_c": Effect(("--eps-clip-c", "3"), P.loss),
    "kl_coef": Effect(("--kl-coef", "0.5"), P.advantages, base=("--advantage-estimator", "reinforce_plus_plus_baseline")),
    "use_kl_loss": Effect(KL, P.loss),
    "kl_loss_coef": Effect(("--kl-loss-coef", "0.5"), P.loss, base=KL),
    "kl_loss_type": Effect(("--kl-loss-type", "k1"), P.loss, base=KL),
    # the reference model loads from this directory (vime.real.megatron.reference, read by MegatronActor.setup)
    "ref_load": Effect(("--ref-load", "{model2}"), P.actor_field("ref_load"), base=KL),
    "ref_placement": Effect(("--ref-placement", "host"), P.actor_field("ref_placement"), base=KL),
    "entropy_coef": Effect(("--entropy-coef", "0.1"), P.loss),
    "use_tis": Effect(("--use-tis",), P.loss),
    "tis_clip": Effect(("--tis-clip", "1.5"), P.loss, base=("--use-tis",)),
    "tis_clip_low": Effect(("--tis-clip-low", "0.5"), P.loss, base=("--use-tis",)),
    "use_rollout_logprobs": Effect(("--use-rollout-logprobs",), P.batch, base=("--num-steps-per-rollout", "2")),
    "get_mismatch_metrics": Effect(("--get-mismatch-metrics",), P.loss),
    "use_critic": Refused(("--use-critic",), "--advantage-estimator grpo"),
    "use_opd": Refused(("--use-opd",), "drop --use-opd"),
    "use_routing_replay": Refused(("--use-routing-replay",), "drop it"),
    "use_rollout_routing_replay": Refused(("--use-rollout-routing-replay",), "drop it"),
    # engines and weights
    "backend": Output("chooses the backends themselves: --backend sim runs the simulated ones "
                      "(tests/test_train_progress.py), every other entry here runs with real"),
    "gpu_memory_utilization": Effect(("--gpu-memory-utilization", "0.5"), P.server),
    "max_num_seqs": Effect(("--max-num-seqs", "64"), P.server),
    "max_num_batched_tokens": Effect(("--max-num-batched-tokens", "4096"), P.server),
    "enforce_eager": Effect(("--enforce-eager",), P.server),
    "no_async_scheduling": Effect(("--no-async-scheduling",), P.server),
    "update_weight_buffer_size": Effect(("--update-weight-buffer-size", "256MiB"), P.calls),
    "update_weight_mode": Effect(("--update-weight-mode", "disk"), P.weights_path),
    "update_weight_dir": Effect(("--update-weight-dir", "{dir}/weights"), P.weights_path,
                                base=("--update-weight-mode", "disk")),
    "flush_cache_interval": Effect(("--flush-cache-interval", "0"), P.calls),
    # faults (issue 18): the real backend kills an engine's server, the router or a trainer rank; the rest is refused
    "fault": Effect(("--fault", "engine-crash:engine=0,step=1,at=0.5"), P.real_faults),
    # asynchronous RL (issue 22): the loops run the same on the simulated and the real backends
    "async_mode": Effect(("--async-mode", "one-step-off"), P.calls, base=DISAGG),
    "max_staleness": Effect(("--max-staleness", "2"), P.calls, base=(*DISAGG, "--async-mode", "fully-async")),
    "partial_rollout": Effect(("--partial-rollout", "keep"), P.calls, base=(*DISAGG, "--async-mode", "fully-async")),
    "ray_address": Effect(("--ray-address", "127.0.0.1:6379"), P.ray_address),
    # simulator inputs: on the real backend only --compare-sim's simulation reads them
    "hardware": Refused(("--hardware", "H200-141G"), "--compare-sim"),
    "moe_load_imbalance": Refused(("--moe-load-imbalance", "1.3"), "--compare-sim"),
    "model": Refused(("--model", "Qwen3-0.6B"), "--compare-sim"),
    "response_length": Refused(("--response-length", "fixed:16"), "--compare-sim"),
    "prompt_length": Refused(("--prompt-length", "fixed:16"), "--compare-sim"),
    # output
    "json": Output("prints each event as one JSON line instead of a table (tests/test_train_progress.py)"),
    "dry_run": Output("prints the resolved configuration and placement and exits (tests/test_cli.py)"),
    "trace_out": Output("writes the run's Chrome trace (tests/report/test_report_flags.py)"),
    "report": Output("writes the run's HTML page (tests/report/test_report_flags.py, test_pages.py)"),
    "compare_sim": Output("adds the run's simulation to the --report page (tests/report/test_compare.py)"),
    "record_calls": Output("adds the protocol calls to what is printed (tests/report/test_calls.py)"),
    # logging
    "use_wandb": Effect(("--use-wandb",), P.trackers),
    "wandb_mode": Effect(("--wandb-mode", "offline"), P.trackers),
    "wandb_project": Effect(("--wandb-project", "p"), P.trackers),
    "wandb_group": Effect(("--wandb-group", "g"), P.trackers),
    "wandb_run_name": Effect(("--wandb-run-name", "r"), P.trackers),
    "wandb_dir": Effect(("--wandb-dir", "{dir}/wandb"), P.trackers),
    "use_tensorboard": Effect(("--use-tensorboard",), P.trackers),
    "tensorboard_dir": Effect(("--tensorboard-dir", "{dir}/tb"), P.trackers),
}


# --- the user functions the plugin flags name (imported by their dotted paths) ------------------------
def even_groups(args: Any, group: Any) -> bool:
    return group[0].group_index % 2 == 0


async def cool_generate(rollout: Any, sample: Any, sampling_params: dict[str, Any]) -> Any:
    return await rollout.generate(sample, {**sampling_params, "temperature": 0.25})


def length_reward(args: Any, sample: Any) -> Any:
    if isinstance(sample, list):  # --group-rm: the whole group at once
        return [float(len(s.tokens)) + 0.5 for s in sample]
    return float(len(sample.tokens))


# --- the test ------------------------------------------------------------------------------------------
def train_options() -> dict[str, list[str]]:
    """dest → option strings of every option `vime train` accepts."""
    sub = build_parser()._subparsers._group_actions[0].choices["train"]  # type: ignore[union-attr]
    out: dict[str, list[str]] = {}
    for action in sub._actions:
        if action.dest != "help":
            out.setdefault(action.dest, []).extend(action.option_strings)
    return out


@pytest.fixture(scope="module")
def paths(tmp_path_factory: Any) -> dict[str, str]:
    root = tmp_path_factory.mktemp("flags")
    paths = P.write_inputs(root)
    # a checkpoint for --load: one simulated step saved where --load will look
    from vime.runs.sim import simulate

    simulate(_parse(paths, ("--save", "{dir}/ckpt")).replace(backend="sim", model="Qwen3-0.6B", prompt_data=None,
                                                             num_rollout=1))
    return paths


def _fill(words: tuple[str, ...], paths: dict[str, str]) -> list[str]:
    return [w.format(**paths) for w in words]


def _parse(paths: dict[str, str], argv: tuple[str, ...], drop: tuple[str, ...] = ()) -> Any:
    base = list(BASE)
    for flag in drop:
        i = base.index(flag)
        del base[i:i + 2]
    return parse_args(_fill(tuple(base), paths) + _fill(argv, paths), command="train")


def test_every_train_flag_has_an_entry() -> None:
    options = train_options()
    missing = sorted(set(options) - set(FLAGS))
    stale = sorted(set(FLAGS) - set(options))
    assert not missing, f"flags with no effect or refusal written down in FLAGS: {missing}"
    assert not stale, f"FLAGS entries for options the parser no longer has: {stale}"


@pytest.mark.parametrize("dest", sorted(FLAGS))
def test_flag_acts_on_the_real_backend_or_is_refused(dest: str, paths: dict[str, str]) -> None:
    check(dest, FLAGS[dest], paths)


def check(dest: str, entry: Effect | Refused | Output, paths: dict[str, str]) -> None:
    """`entry` holds for option `dest` (AssertionError otherwise)."""
    flags = train_options()[dest]
    if isinstance(entry, Output):
        assert entry.why
        return
    if isinstance(entry, Refused):
        with pytest.raises(ConfigError) as err:
            _parse(paths, entry.argv)
        message = str(err.value)
        assert any(f in message for f in flags), f"{message!r} does not name {flags}"
        assert "real" in message, f"{message!r} does not name the backend"
        assert entry.instead in message, f"{message!r} does not say what to use instead ({entry.instead})"
        return
    assert set(entry.argv) & set(flags), f"{dest}'s entry does not pass its own flag {flags}"
    before = entry.probe(_parse(paths, entry.base, entry.drop))
    after = entry.probe(_parse(paths, entry.base + entry.argv, entry.drop))
    for side, result in (("without", before), ("with", after)):  # a failed run differs by its message alone
        assert not (isinstance(result, tuple) and result[:1] == ("error",)), f"{side} {' '.join(entry.argv)}: {result}"
    assert after != before, f"{' '.join(entry.argv)} changes nothing {getattr(entry.probe, '__name__', '')} sees"


def test_the_table_test_fails_for_a_missing_entry_a_no_op_and_a_silent_refusal(monkeypatch: Any,
                                                                              paths: dict[str, str]) -> None:
    monkeypatch.setitem(FLAGS, "invented", Output("x"))
    with pytest.raises(AssertionError, match="invented"):
        test_every_train_flag_has_an_entry()
    monkeypatch.delitem(FLAGS, "invented")
    monkeypatch.delitem(FLAGS, "lr")
    with pytest.raises(AssertionError, match="'lr'"):
        test_every_train_flag_has_an_entry()
    with pytest.raises(AssertionError, match="changes nothing"):
        check("lr", Effect(("--lr", "1e-5"), P.wire), paths)  # a probe the flag does not reach
    with pytest.raises(AssertionError, match="does not say what to use instead"):
        check("use_critic", Refused(("--use-critic",), "--use-ppo"), paths)
    with pytest.raises(pytest.fail.Exception, match="DID NOT RAISE"):
        check("lr", Refused(("--lr", "1e-5"), "x"), paths)  # an accepted flag is not a refusal


# --- slime's spellings -------------------------------------------------------------------------------
@pytest.mark.parametrize("alias", ALIASES, ids=lambda a: a.flag)
def test_slime_spelling_sets_the_same_option(alias: Any, paths: dict[str, str]) -> None:
    value = (alias.example,) if alias.example is not None else ()
    base = DISAGG if alias.flag == "--offload" else ()
    via_slime = _parse(paths, base + (alias.flag, *value))
    via_vime = _parse(paths, base + alias.same_as + value)
    assert via_slime.to_dict() == via_vime.to_dict()
    assert via_slime.to_dict() != _parse(paths, base).to_dict()  # and it is not the default


def test_slime_transport_nccl_is_vime_tensor(paths: dict[str, str]) -> None:
    assert _parse(paths, ("--update-weight-transport", "nccl")).update_weight_mode == "tensor"
    with pytest.raises(ConfigError, match="--update-weight-transport"):
        _parse(paths, ("--update-weight-transport", "ipc"))


@pytest.mark.parametrize(("vime", "slime"), sorted(RENAMES.items()))
def test_slime_rename_is_the_same_flag(vime: str, slime: str, paths: dict[str, str]) -> None:
    extra = ("--update-weight-mode", "disk") if "weight" in vime else ()
    a = _parse(paths, (*extra, slime, "{dir}/renamed"))
    b = _parse(paths, (*extra, vime, "{dir}/renamed"))
    assert a.to_dict() == b.to_dict() and a.to_dict() != _parse(paths, extra).to_dict()
