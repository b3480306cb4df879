"""The data source (seed step 16): JSONL prompts, length filter, group numbering, epochs, returned groups, state."""

from __future__ import annotations

import json

import pytest

from vime.errors import ConfigError
from vime.rollout.data_source import ByteTokenizer, DataSource, SyntheticDataset, load_jsonl
from vime.types import SampleStatus


def write_jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n", encoding="utf-8")
    return path


def test_jsonl_with_configurable_keys_and_length_filter(tmp_path):
    rows = [{"question": "ab", "answer": "1"}, {"question": "x" * 50, "answer": "2"},
            {"question": "cde", "answer": "3", "metadata": {"src": "t"}}]
    ds = load_jsonl(write_jsonl(tmp_path / "p.jsonl", rows), input_key="question", label_key="answer",
                    tokenizer=ByteTokenizer(), max_prompt_len=10)
    assert len(ds) == 2 and ds.filtered == 1
    assert ds[0].tokens == [97, 98] and ds[0].label == "1"
    assert ds[1].metadata == {"src": "t"} and ds[1].prompt == "cde"


def test_jsonl_errors_name_the_problem(tmp_path):
    with pytest.raises(ConfigError, match="--input-key"):
        load_jsonl(write_jsonl(tmp_path / "a.jsonl", [{"text": "hi"}]), tokenizer=ByteTokenizer())
    with pytest.raises(ConfigError, match="no tokenizer"):
        load_jsonl(write_jsonl(tmp_path / "b.jsonl", [{"prompt": "hi"}]))
    with pytest.raises(ConfigError, match="does not exist"):
        load_jsonl(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match="empty"):
        load_jsonl(write_jsonl(tmp_path / "c.jsonl", [{"prompt": "toolong"}]), tokenizer=ByteTokenizer(),
                   max_prompt_len=2)


def test_pretokenised_prompts_need_no_tokenizer(tmp_path):
    ds = load_jsonl(write_jsonl(tmp_path / "t.jsonl", [{"prompt": "", "token_ids": [5, 6, 7], "label": [6]}]))
    assert ds[0].tokens == [5, 6, 7] and ds[0].label == [6]


def test_groups_are_independent_copies_numbered_as_the_seed():
    ds = SyntheticDataset(100, lambda i: 200, seed=1)
    src = DataSource(ds, n_samples_per_prompt=8)
    groups = src.get_samples(32)
    assert len(groups) == 32 and all(len(g) == 8 for g in groups)
    assert [g[0].group_index for g in groups] == list(range(32))
    assert [s.index for g in groups for s in g] == list(range(256))
    a, b = groups[0][0], groups[0][1]
    assert a.tokens == b.tokens and a.tokens is not b.tokens and a.metadata is not b.metadata
    assert len(a.tokens) == 200
    nxt = src.get_samples(1)[0]
    assert nxt[0].group_index == 32 and nxt[0].index == 256


def test_a_copy_is_as_independent_as_deepcopy_for_nested_labels_prompts_and_metadata():
    """copy_sample's fast paths (containers of scalars) and its recursion leave nothing shared that can change."""
    import copy
    import dataclasses as dc

    from vime.rollout.data_source import copy_sample
    from vime.types import Sample

    @dc.dataclass
    class Box:
        items: list[int]

    label = {"answers": [1, 2, [3, 4]], "ids": list(range(20_000)), "pair": (1, [2]), "box": Box([5])}
    prompt = [{"role": "user", "content": "hi", "parts": [1, 2]}]
    src = Sample(prompt=prompt, label=label, tokens=[1, 2, 3], metadata={"tags": ["a"], "n": 1, "t": (1, 2)})
    c = copy_sample(src)
    assert c == copy.deepcopy(src)
    c.label["answers"][2].append(5)
    c.label["ids"].append(-1)
    c.label["pair"][1].append(3)
    c.label["box"].items.append(6)
    c.prompt[0]["parts"].append(3)
    c.metadata["tags"].append("b")
    assert label == {"answers": [1, 2, [3, 4]], "ids": list(range(20_000)), "pair": (1, [2]), "box": Box([5])}
    assert prompt[0]["parts"] == [1, 2] and src.metadata["tags"] == ["a"]
    assert c.metadata["t"] is src.metadata["t"]  # a tuple of scalars cannot change: shared, as deepcopy shares it


def test_epochs_wrap_and_shuffle_is_seeded():
    ds = SyntheticDataset(5, lambda i: 3 + i)
    src = DataSource(ds, n_samples_per_prompt=1)
    order = [g[0].metadata["prompt_id"] for g in src.get_samples(12)]
    assert order == [0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 0, 1] and src.epoch == 2
    s1 = DataSource(ds, n_samples_per_prompt=1, seed=3, shuffle=True)
    s2 = DataSource(ds, n_samples_per_prompt=1, seed=3, shuffle=True)
    o1 = [g[0].metadata["prompt_id"] for g in s1.get_samples(10)]
    assert o1 == [g[0].metadata["prompt_id"] for g in s2.get_samples(10)]
    assert sorted(o1[:5]) == [0, 1, 2, 3, 4] and o1[:5] != o1[5:]  # each epoch its own permutation


def test_returned_groups_are_reset_and_served_first():
    src = DataSource(SyntheticDataset(10, lambda i: 4), n_samples_per_prompt=2)
    g0, g1 = src.get_samples(2)
    g1[0].append_response_tokens([1, 2], [-0.1, -0.2], meta_info={"finish_reason": {"type": "abort"},
                                                                     "weight_version": "3"})
    g1[0].metadata["error"] = "engine e1 died"
    assert g1[0].status is SampleStatus.ABORTED
    src.add_samples([g1])
    assert g1[0].tokens == g1[1].tokens and g1[0].response_length == 0
    assert g1[0].status is SampleStatus.PENDING
    again = src.get_samples(2)
    assert again[0][0] is g1[0] and again[1][0].group_index == 2
    assert g1[0].weight_versions == [] and "error" not in g1[0].metadata
    with pytest.raises(ValueError, match="n-samples-per-prompt"):
        src.add_samples([[g0[0]]])


def test_state_dict_round_trip_continues_identically():
    ds = SyntheticDataset(7, lambda i: 2 + i % 3)
    src = DataSource(ds, n_samples_per_prompt=3, seed=5, shuffle=True)
    src.get_samples(9)
    back = src.get_samples(1)
    src.add_samples(back)
    state = json.loads(json.dumps(src.state_dict()))  # JSON-able
    clone = DataSource(ds, n_samples_per_prompt=3, seed=5, shuffle=True)
    clone.load_state_dict(state)

    def view(groups):
        return [(s.group_index, s.index, s.tokens, s.status) for g in groups for s in g]

    assert view(clone.get_samples(6)) == view(src.get_samples(6))


def test_synthetic_prompts_are_deterministic_and_capped():
    a = SyntheticDataset(50, lambda i: 10 + i * 20, seed=9, max_prompt_len=512)
    b = SyntheticDataset(50, lambda i: 10 + i * 20, seed=9, max_prompt_len=512)
    assert [a[i].tokens for i in range(50)] == [b[i].tokens for i in range(50)]
    assert len(a[49].tokens) == 512 and len(a[0].tokens) == 10
    assert all(0 <= t < a.vocab_size for t in a[3].tokens)


def test_copies_do_not_share_nested_metadata_or_labels():
    from vime.rollout.data_source import ListDataset
    from vime.types import Sample

    prompt = Sample(prompt=[{"role": "user", "content": "hi"}], label={"answers": [1]}, tokens=[1, 2],
                    metadata={"tags": ["a"], "id": 3})
    src = DataSource(ListDataset([prompt]), n_samples_per_prompt=2)
    a, b = src.get_samples(1)[0]
    a.metadata["tags"].append("b")
    a.label["answers"].append(2)
    a.prompt[0]["content"] = "changed"
    assert b.metadata == {"tags": ["a"], "id": 3} and b.label == {"answers": [1]}
    assert b.prompt[0]["content"] == "hi" and prompt.metadata["tags"] == ["a"]
