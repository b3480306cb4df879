"""The flags issue 19 adds around slime's conventions: --vllm-<flag> pass-through, precision and sequence
parallelism, --num-epoch, --save alone."""

from __future__ import annotations

import json

import pytest

from vime.config import parse_args
from vime.config.passthrough import RESERVED, split_vllm_args
from vime.errors import ConfigError
from vime.real.vllm.launcher import engine_specs, server_command


def _argv(*flags: str) -> list[list[str]]:
    args = parse_args(["--hf-checkpoint", "/m", *flags], command="train")
    specs = engine_specs(args, device="cuda", ports=list(range(9000, 9000 + args.rollout_num_engines)),
                         enable_scale_out=False)
    return [server_command(s, python="python") for s in specs]


def test_vllm_flags_reach_every_vllm_serve_command_line() -> None:
    plain = _argv()
    argv = _argv("--vllm-enable-prefix-caching", "--lr", "1e-5", "--vllm-swap-space", "4",
                 "--vllm-override-generation-config={\"x\": 1}", "--vllm-server-concurrency", "3")
    assert len(argv) == len(plain) == 4
    for before, after in zip(plain, argv, strict=True):
        assert after[:len(before)] == before
        assert after[len(before):] == ["--enable-prefix-caching", "--swap-space", "4",
                                       "--override-generation-config={\"x\": 1}"]
    # vime's own --vllm-server-concurrency is vime's, not passed through; the flag after a pass-through is vime's
    args = parse_args(["--vllm-swap-space", "4", "--vllm-server-concurrency", "3", "--lr", "1e-5"], command="train")
    assert args.vllm_server_concurrency == 3 and args.lr == 1e-5
    assert args.vllm_extra_args == ("--swap-space", "4")


def test_vllm_values_keep_negative_numbers_and_several_words() -> None:
    rest, vllm = split_vllm_args(["--vllm-x", "-1", "a", "--lr", "1", "--vllm-y"], known={"--lr"})
    assert rest == ["--lr", "1"] and vllm == ["--x", "-1", "a", "--y"]


@pytest.mark.parametrize("flag", sorted(RESERVED))
def test_vllm_flags_vime_sets_are_refused_naming_what_to_use(flag: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_args([f"--vllm-{flag[2:]}", "1"], command="train")
    message = str(err.value)
    assert f"--vllm-{flag[2:]}" in message and "--backend real" in message
    assert "use " in message or "leave it out" in message


def test_vllm_underscore_spelling_is_refused_too_and_names_must_be_flags() -> None:
    with pytest.raises(ConfigError, match="--rollout-num-gpus-per-engine"):
        parse_args(["--vllm-tensor_parallel_size", "2"], command="train")
    with pytest.raises(ConfigError, match="not a vLLM flag name"):
        parse_args(["--vllm-Bad!"], command="train")


def test_vllm_flags_are_refused_where_no_vllm_serve_runs() -> None:
    for argv, command in ((["--vllm-enable-prefix-caching"], "simulate"),
                          (["--backend", "sim", "--vllm-enable-prefix-caching"], "train")):
        with pytest.raises(ConfigError, match="only --backend real starts"):
            parse_args(argv, command=command)


def test_precision_flags_set_the_trainer_dtype() -> None:
    from vime.real.megatron.actor import ActorConfig

    hf = {"vocab_size": 8}
    assert ActorConfig.from_args(parse_args([], command="train"), hf).dtype == "auto"
    assert ActorConfig.from_args(parse_args(["--bf16"], command="train"), hf).dtype == "bfloat16"
    assert ActorConfig.from_args(parse_args(["--fp16"], command="train"), hf).dtype == "float16"
    with pytest.raises(ConfigError, match="give one"):
        parse_args(["--bf16", "--fp16"], command="train")


def test_sequence_parallel_resolves_per_backend_and_needs_tp() -> None:
    assert parse_args([], command="simulate").sequence_parallel is True  # TP 2: what the simulator always modelled
    assert parse_args(["--tensor-model-parallel-size", "1"], command="simulate").sequence_parallel is False
    assert parse_args([], command="train").sequence_parallel is False  # real: Megatron's local spec cannot
    with pytest.raises(ConfigError, match="--tensor-model-parallel-size"):
        parse_args(["--sequence-parallel", "--tensor-model-parallel-size", "1"], command="simulate")


def test_sequence_parallel_shrinks_the_simulated_activations() -> None:
    from vime.runs.sim import simulate

    def peak(*flags: str) -> float:
        sim = simulate(parse_args(["--num-rollout", "1", *flags], command="simulate"))
        return sim.backends.trainer.activation_bytes(4096)  # the simulated trainer's own bytes model

    on, off = peak(), peak("--no-sequence-parallel")
    assert off > on
    tp4_on, tp4_off = peak("--tensor-model-parallel-size", "4"), peak("--tensor-model-parallel-size", "4",
                                                                        "--no-sequence-parallel")
    # the norm/dropout share SP splits is a larger part at TP 4 (the rest is split by TP either way)
    assert tp4_off / tp4_on > off / on > 1


def test_num_epoch_sets_num_rollout_from_the_dataset(tmp_path) -> None:
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(70)) + "\n\n")
    args = parse_args(["--prompt-data", str(data), "--num-epoch", "3", "--rollout-batch-size", "16"], command="train")
    assert args.num_rollout == 3 * (70 // 16)
    with pytest.raises(ConfigError, match="give one of"):
        parse_args(["--prompt-data", str(data), "--num-epoch", "3", "--num-rollout", "5"], command="train")
    with pytest.raises(ConfigError, match="fewer than one"):
        parse_args(["--prompt-data", str(data), "--num-epoch", "1", "--rollout-batch-size", "128"], command="train")


def test_save_alone_saves_once_after_the_last_rollout(tmp_path) -> None:
    args = parse_args(["--save", str(tmp_path / "c"), "--num-rollout", "3"], command="train")
    assert args.save_interval == 3
    assert parse_args(["--save", str(tmp_path / "c"), "--save-interval", "1"], command="train").save_interval == 1


def test_ref_placement_needs_a_kl_term_and_names_it() -> None:
    with pytest.raises(ConfigError, match="--ref-placement host places the reference of a KL term; add --use-kl-loss"):
        parse_args(["--ref-placement", "host"], command="simulate")
    args = parse_args(["--ref-placement", "host", "--use-kl-loss", "--kl-loss-coef", "0.01"], command="simulate")
    assert args.ref_placement == "host"
    with pytest.raises(ConfigError, match="--ref-placement: invalid choice: 'disk'"):
        parse_args(["--ref-placement", "disk", "--use-kl-loss"], command="simulate")
