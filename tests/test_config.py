"""The parser's defaults are the seed scenario; derived values and every inconsistency are caught at parse time."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vime.config import (
    COMMANDS,
    SIMULATE_DEFAULT_NUM_ROLLOUT,
    Args,
    GiB,
    LengthSpec,
    build_parser,
    default_response_spec,
    parse_args,
    parse_bytes,
    parse_length_spec,
)
from vime.errors import ConfigError


@pytest.fixture(params=COMMANDS)
def seed_args(request: pytest.FixtureRequest) -> Args:
    return parse_args([], command=request.param)


def test_seed_step1_derived_values(seed_args: Args) -> None:
    # seed step 1: 32 × 8 // 1 = 256, eps_clip_high defaults to eps_clip, over-sampling to 32
    assert seed_args.rollout_batch_size == 32
    assert seed_args.n_samples_per_prompt == 8
    assert seed_args.num_steps_per_rollout == 1
    assert seed_args.global_batch_size == 256
    assert seed_args.eps_clip == 0.2
    assert seed_args.eps_clip_high == 0.2
    assert seed_args.over_sampling_batch_size == 32


def test_seed_section0_placement(seed_args: Args) -> None:
    # section 0 / step 2: 8 colocated GPUs, TP 2 → DP 4, 8 // 2 = 4 engines, both offloads on
    assert seed_args.colocate is True
    assert seed_args.offload_train is True and seed_args.offload_rollout is True
    assert seed_args.actor_num_gpus == 8
    assert seed_args.rollout_num_gpus == 8
    assert seed_args.rollout_num_engines == 4
    assert seed_args.tensor_model_parallel_size == 2
    assert seed_args.data_parallel_size == 4 and seed_args.dp_size == 4
    assert seed_args.micro_batch_size == 8
    assert seed_args.num_microbatches_per_step == 8
    assert (seed_args.rollout_max_prompt_len, seed_args.rollout_max_response_len,
            seed_args.rollout_max_context_len) == (512, 1024, 4096)
    # step 18: semaphore = 512 × 4
    assert seed_args.rollout_concurrency == 2048
    assert seed_args.advantage_estimator == "grpo" and seed_args.kl_coef == 0
    # train keeps the seed's 100 rollouts; simulate runs a few steady-state steps unless told.
    assert seed_args.num_rollout == (100 if seed_args.command == "train" else SIMULATE_DEFAULT_NUM_ROLLOUT)
    assert seed_args.flush_cache_interval == 1
    assert seed_args.grpo_std_normalization is True


def test_backend_per_command() -> None:
    assert parse_args([], command="train").backend == "real"
    assert parse_args(["--backend", "sim"], command="train").backend == "sim"
    assert parse_args([], command="simulate").backend == "sim"
    with pytest.raises(ConfigError, match="--backend"):
        parse_args(["--backend", "sim"], command="simulate")


def test_four_steps_per_rollout() -> None:
    args = parse_args(["--num-steps-per-rollout", "4"], command="simulate")
    assert args.global_batch_size == 64
    assert args.num_microbatches_per_step == 2


def test_global_batch_size_alone_derives_steps() -> None:
    args = parse_args(["--global-batch-size", "128"], command="train")
    assert args.num_steps_per_rollout == 2


def test_subcommand_in_argv_and_flat_names() -> None:
    args = parse_args(["simulate", "--rollout-batch-size", "16"])
    assert args.command == "simulate"
    assert args.rollout_batch_size == 16 and args.rollout.rollout_batch_size == 16
    assert args.global_batch_size == 128


def test_args_is_read_only_and_replace_revalidates() -> None:
    args = parse_args([], command="simulate")
    with pytest.raises(AttributeError, match="read-only"):
        args.rollout_batch_size = 4  # type: ignore[misc]
    changed = args.replace(num_steps_per_rollout=4)
    assert changed.global_batch_size == 64 and args.global_batch_size == 256
    with pytest.raises(ConfigError, match="--num-steps-per-rollout 3"):
        args.replace(num_steps_per_rollout=3)
    with pytest.raises(ConfigError, match="cannot be set"):
        args.replace(data_parallel_size=2)
    with pytest.raises(AttributeError, match="no option"):
        _ = args.no_such_option


def test_to_dict_is_json_and_includes_derived(seed_args: Args) -> None:
    d = json.loads(json.dumps(seed_args.to_dict()))
    for key in ("global_batch_size", "eps_clip_high", "over_sampling_batch_size", "rollout_num_engines",
                "data_parallel_size", "response_length", "prompt_length", "command"):
        assert key in d
    assert d["response_length"].startswith("lognormal:")
    assert d["prompt_length"] == "uniform:64,512"


def test_booleans_that_default_on_can_be_negated() -> None:
    args = parse_args(["--no-colocate", "--rollout-num-gpus", "4", "--no-grpo-std-normalization"],
                      command="simulate")
    assert args.colocate is False and args.grpo_std_normalization is False
    assert args.offload_train is False and args.offload_rollout is False
    assert args.rollout_num_engines == 2


def test_update_weight_buffer_size_units() -> None:
    assert parse_args([], command="train").update_weight_buffer_size == GiB
    assert parse_args(["--update-weight-buffer-size", "512MiB"], command="train").update_weight_buffer_size \
        == 512 * 1024**2
    assert parse_bytes("1073741824") == GiB
    with pytest.raises(ConfigError, match="update-weight-buffer-size"):
        parse_args(["--update-weight-buffer-size", "lots"], command="train")


@pytest.mark.parametrize(("argv", "fragments"), [
    (["--tensor-model-parallel-size", "3"], ["--tensor-model-parallel-size 3", "8 actor GPUs", "divides"]),
    (["--micro-batch-size", "3"], ["--micro-batch-size 3", "DP 4", "--global-batch-size 256"]),
    (["--rollout-max-response-len", "3800"], ["--rollout-max-prompt-len 512", "--rollout-max-response-len 3800",
                                              "--rollout-max-context-len 4096", "4312"]),
    (["--rollout-num-gpus-per-engine", "3"], ["--rollout-num-gpus-per-engine 3", "--rollout-num-gpus 8",
                                             "divisor"]),
    (["--num-steps-per-rollout", "3"], ["--num-steps-per-rollout 3", "256 samples"]),
    (["--global-batch-size", "128", "--num-steps-per-rollout", "4"], ["contradicts", "= 64"]),
    (["--rollout-num-gpus", "4"], ["--rollout-num-gpus 4", "--colocate", "8"]),
    (["--no-offload-rollout"], ["--no-offload-rollout", "--colocate"]),
    (["--no-colocate"], ["--rollout-num-gpus"]),
    (["--eps-clip-c", "0.5"], ["--eps-clip-c 0.5", "> 1"]),
    (["--eps-clip", "1.5"], ["--eps-clip"]),
    (["--rollout-top-p", "0"], ["--rollout-top-p"]),
    (["--save-interval", "10"], ["--save-interval 10", "--save"]),
    (["--max-num-seqs", "512", "--max-num-batched-tokens", "256"], ["--max-num-batched-tokens 256"]),
    (["--gpu-memory-utilization", "1.5"], ["--gpu-memory-utilization"]),
    (["--rollout-batch-size", "0"], ["--rollout-batch-size", "positive"]),
    (["--response-length", "fixed:2000"], ["--response-length fixed:2000", "--rollout-max-response-len 1024"]),
    (["--response-length", "gamma:1,2"], ["--response-length", "unknown kind", "lognormal:MU,SIGMA"]),
    (["--prompt-length", "uniform:9,3"], ["--prompt-length", "A ≤ B"]),
    (["--response-length", "trace:/nonexistent/x.jsonl"], ["trace file not found"]),
    (["--model", "/nonexistent/config.json"], ["--model", "not found"]),
    (["--use-rollout-routing-replay"], ["--use-rollout-routing-replay", "not implemented", "drop it"]),
    (["--router-policy", "fastest"], ["--router-policy", "invalid choice"]),
    (["--no-such-flag"], ["unrecognized arguments", "--no-such-flag"]),
])
def test_inconsistencies_fail_at_parse_time(argv: list[str], fragments: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        parse_args(argv, command="simulate")
    for fragment in fragments:
        assert fragment in str(info.value)


def test_unknown_command() -> None:
    with pytest.raises(ConfigError, match="unknown command"):
        parse_args([], command="serve")


def test_length_spec_grammar() -> None:
    assert parse_length_spec("fixed:300") == LengthSpec("fixed", (300,))
    assert parse_length_spec("uniform:10,20") == LengthSpec("uniform", (10, 20))
    spec = parse_length_spec("lognormal:6.0,0.5")
    assert spec.kind == "lognormal" and spec.params == (6.0, 0.5)
    assert str(parse_length_spec("trace:lengths.jsonl")) == "trace:lengths.jsonl"
    for bad in ("fixed", "fixed:0", "fixed:a", "uniform:1", "lognormal:1,-1", "lognormal:x,1", "poisson:3"):
        with pytest.raises(ConfigError, match="--response-length"):
            parse_length_spec(bad)


def test_length_specs_resolve_with_caps(tmp_path) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "lengths.jsonl"
    trace.write_text("12\n34\n")
    args = parse_args(["--response-length", f"trace:{trace}", "--prompt-length", "fixed:200"], command="simulate")
    assert args.response_length.kind == "trace" and args.response_length.cap == 1024
    assert args.prompt_length == LengthSpec("fixed", (200,), None, 512)


def test_default_response_spec_is_documented_lognormal() -> None:
    spec = default_response_spec(1024)
    assert spec.kind == "lognormal" and spec.cap == 1024
    assert math.isclose(math.exp(spec.params[0]), 0.4 * 1024, rel_tol=1e-5)
    assert spec.params[1] == 0.6


def test_parser_has_both_subcommands_with_shared_options() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    choices = sub.choices  # type: ignore[attr-defined]
    assert set(choices) == {"train", "simulate"}
    train_flags = {s for a in choices["train"]._actions for s in a.option_strings}
    sim_flags = {s for a in choices["simulate"]._actions for s in a.option_strings}
    assert train_flags - sim_flags == {"--backend", "--compare-sim"}  # only a real run has a run to compare
    for flag in ("--rollout-batch-size", "--n-samples-per-prompt", "--num-steps-per-rollout",
                 "--global-batch-size", "--micro-batch-size", "--eps-clip", "--eps-clip-high", "--eps-clip-c",
                 "--over-sampling-batch-size", "--rollout-num-gpus", "--rollout-num-gpus-per-engine",
                 "--actor-num-nodes", "--actor-num-gpus-per-node", "--tensor-model-parallel-size",
                 "--pipeline-model-parallel-size", "--context-parallel-size", "--colocate", "--offload-train",
                 "--offload-rollout", "--rollout-max-prompt-len", "--rollout-max-response-len",
                 "--rollout-max-context-len", "--rollout-temperature", "--rollout-top-p", "--rollout-top-k",
                 "--vllm-server-concurrency", "--advantage-estimator", "--kl-coef", "--use-kl-loss",
                 "--use-rollout-logprobs", "--grpo-std-normalization", "--dynamic-sampling-filter-path",
                 "--group-rm", "--num-rollout", "--start-rollout-id", "--eval-interval", "--save-interval",
                 "--flush-cache-interval", "--router-policy", "--hf-checkpoint", "--seed",
                 "--gpu-memory-utilization", "--max-num-seqs", "--max-num-batched-tokens",
                 "--update-weight-buffer-size", "--update-weight-mode", "--use-distributed-optimizer",
                 "--prompt-data", "--input-key", "--label-key", "--rm-type", "--custom-rm-path",
                 "--custom-generate-function-path", "--num-epoch", "--save", "--load", "--lr", "--loss-type",
                 "--get-mismatch-metrics", "--use-critic", "--use-opd", "--use-routing-replay",
                 "--use-rollout-routing-replay", "--score-centering-top-k", "--json", "--dry-run",
                 "--hardware", "--model", "--response-length", "--prompt-length"):
        assert flag in sim_flags, flag


def test_args_pickle_and_deepcopy_round_trip() -> None:
    import copy
    import pickle

    args = parse_args(["--num-steps-per-rollout", "4"], command="train")
    for clone in (pickle.loads(pickle.dumps(args)), copy.deepcopy(args)):
        assert clone == args and clone.global_batch_size == 64 and clone.command == "train"
        assert clone.replace(micro_batch_size=4).num_microbatches_per_step == 4


def test_config_import_stays_light() -> None:
    import subprocess
    import sys

    code = "import sys, vime.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False"


@settings(max_examples=150, deadline=None)
@given(tp=st.sampled_from([1, 2, 3, 4, 8]), pp=st.sampled_from([1, 2]), nodes=st.integers(1, 2),
       rbs=st.sampled_from([4, 8, 16, 32]), n=st.sampled_from([1, 2, 4, 8]), steps=st.sampled_from([1, 2, 4]),
       mbs=st.sampled_from([1, 2, 4]), per_engine=st.sampled_from([1, 2, 4, 8, 3]))
def test_property_valid_or_named_error(tp: int, pp: int, nodes: int, rbs: int, n: int, steps: int, mbs: int,
                                       per_engine: int) -> None:
    argv = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--actor-num-nodes", str(nodes), "--rollout-batch-size", str(rbs), "--n-samples-per-prompt", str(n),
            "--num-steps-per-rollout", str(steps), "--micro-batch-size", str(mbs),
            "--rollout-num-gpus-per-engine", str(per_engine)]
    gpus = 8 * nodes
    dp = gpus // (tp * pp)
    consistent = (gpus % (tp * pp) == 0 and (rbs * n) % steps == 0
                  and ((rbs * n) // steps) % (mbs * dp) == 0 and gpus % per_engine == 0)
    if not consistent:
        with pytest.raises(ConfigError, match="--"):
            parse_args(argv, command="simulate")
        return
    args = parse_args(argv, command="simulate")
    assert args.global_batch_size * args.num_steps_per_rollout == rbs * n
    assert args.data_parallel_size * tp * pp * args.context_parallel_size == args.actor_num_gpus == gpus
    assert args.rollout_num_engines * per_engine == args.rollout_num_gpus == gpus
    assert args.num_microbatches_per_step * mbs * dp == args.global_batch_size
