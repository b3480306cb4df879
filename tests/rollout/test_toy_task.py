"""The toy task (issue 8): seeded prompts and targets, the token-space reward, JSONL that --prompt-data loads, the reward hub hook."""

from __future__ import annotations

import asyncio
import json

import pytest

from vime.config import defaults
from vime.errors import ConfigError
from vime.rollout.data_source import DataSource
from vime.rollout.plugins import load_plugins
from vime.rollout.rm_hub import RewardHub
from vime.rollout.toy_task import ToyTask, main, target_fraction, target_fraction_reward, write_prompts
from vime.types import Sample


def test_targets_and_prompts_are_seeded_and_disjoint():
    task = ToyTask(vocab_size=512, num_prompts=50, prompt_len=6, target_fraction=0.125, seed=3)
    targets = task.targets()
    assert targets == ToyTask(vocab_size=512, num_prompts=50, prompt_len=6, target_fraction=0.125, seed=3).targets()
    assert targets != ToyTask(vocab_size=512, seed=4).targets()
    assert targets == sorted(set(targets)) and all(task.first_id <= t < 512 for t in targets)
    assert len(targets) == round(0.125 * (512 - task.first_id))
    prompts = task.prompts()
    assert len(prompts) == 50 and all(len(p) == 6 for p in prompts)
    assert not set(targets) & {t for p in prompts for t in p}, "a prompt must not contain the answer"
    assert task.baseline() == pytest.approx(len(targets) / 512)


@pytest.mark.parametrize("bad", [dict(vocab_size=8), dict(target_fraction=0.0), dict(target_fraction=1.0),
                                 dict(num_prompts=0), dict(prompt_len=0)])
def test_bad_task_is_refused(bad):
    with pytest.raises(ConfigError):
        ToyTask(**bad).targets()


def test_target_fraction():
    assert target_fraction([1, 2, 3, 4], [2, 4, 9]) == 0.5
    assert target_fraction([], [1]) == 0.0
    assert target_fraction([7, 7], [7]) == 1.0


def _finished(prompt: list[int], response: list[int], label) -> Sample:
    s = Sample(group_index=0, index=0, label=label, tokens=list(prompt))
    s.append_response_tokens(response, [0.0] * len(response))
    return s


def test_written_prompts_load_as_a_data_source_and_score_through_the_reward_hub(tmp_path):
    task = ToyTask(vocab_size=300, num_prompts=4, prompt_len=5, seed=1)
    path = write_prompts(tmp_path / "toy.jsonl", task)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["token_ids"] for r in rows] == task.prompts()
    args = defaults("train").replace(prompt_data=str(path), n_samples_per_prompt=2,
                                     custom_rm_path="vime.rollout.toy_task.target_fraction_reward")
    source = DataSource.from_config(args.data, args.rollout, seed=args.seed)  # token_ids given: no tokenizer needed
    group = source.get_samples(1)[0]
    assert [s.tokens for s in group] == [task.prompts()[0]] * 2
    targets = task.targets()
    other = [t for t in range(300) if t not in targets][-2:]
    group[0].append_response_tokens([targets[0], other[0], targets[1], other[1]], [0.0] * 4)
    group[1].append_response_tokens([other[0]], [0.0])
    hub = RewardHub(args.data, seed=args.seed, custom=load_plugins(args).reward)
    assert hub.name == "custom"
    assert asyncio.run(hub.score(group[0])) == 0.5
    assert asyncio.run(hub.score(group[1])) == 0.0
    assert asyncio.run(hub.score_group(group)) == [0.5, 0.0]


def test_reward_only_counts_response_tokens():
    """Prompt tokens that happen to be targets do not count; only the response is scored."""
    s = _finished([5, 5, 5], [6, 7], label=[5, 7])
    assert target_fraction_reward(None, s) == 0.5
    assert target_fraction_reward(None, [s, s]) == [0.5, 0.5]


def test_reward_without_a_target_label_names_the_fix():
    with pytest.raises(ConfigError, match="write_prompts"):
        target_fraction_reward(None, _finished([1], [2], label=None))


def test_command_line_writes_the_file(tmp_path, capsys):
    out = tmp_path / "p.jsonl"
    assert main([str(out), "--vocab-size", "400", "--num-prompts", "3", "--seed", "2"]) == 0
    assert len(out.read_text().splitlines()) == 3
    assert "random-policy reward" in capsys.readouterr().out
