"""Input files and output places, checked before any work starts (seed step 1's validation of what a run reads and writes)."""

from __future__ import annotations

import os
from typing import Any

from vime.config.options import _flags_of
from vime.errors import ConfigError


def _need(cond: bool, message: str) -> None:
    if not cond:
        raise ConfigError(message)


def _writable(path: str, *, make_parents: bool = False) -> bool:
    """Whether file `path` can be created or overwritten: its directory exists and is writable (with
    `make_parents`, its nearest existing ancestor is: the caller creates the rest)."""
    p = os.path.abspath(path)
    if os.path.isdir(p):
        return False
    parent = os.path.dirname(p)
    while make_parents and not os.path.exists(parent):
        parent = os.path.dirname(parent)
    return os.path.isdir(parent) and os.access(parent, os.W_OK | os.X_OK)


def check_files(v: dict[str, Any], given: set[str], command: str) -> None:
    """Input files exist and output places are writable before any work starts; inputs that a command
    would ignore are refused."""
    if v["prompt_data"] is not None:
        _need(os.path.isfile(v["prompt_data"]), f"--prompt-data {v['prompt_data']}: file not found; give an "
                                                f"existing JSONL dataset")
        _need(not (command == "simulate" and "prompt_length" in given),
              "--prompt-data and --prompt-length both set the simulated prompt lengths; give one (the simulator "
              "takes the dataset's prompt lengths from --prompt-data)")
    pairs = list(v["eval_prompt_data"] or ())
    _need(len(pairs) % 2 == 0, f"--eval-prompt-data takes NAME PATH pairs, got {len(pairs)} words: {' '.join(pairs)}")
    names = pairs[0::2]
    _need(len(set(names)) == len(names), f"--eval-prompt-data names a set twice: {names}")
    for name, path in zip(names, pairs[1::2], strict=True):
        _need(name.replace("_", "").replace("-", "").isalnum(),
              f"--eval-prompt-data set name {name!r}: use letters, digits, - and _ (it becomes eval/{name}/...)")
        _need(os.path.isfile(path), f"--eval-prompt-data {name} {path}: file not found; give an existing JSONL file")
    v["eval_prompt_data"] = tuple(pairs)
    _need(not (pairs and not v["eval_interval"]), "--eval-prompt-data needs --eval-interval N (how often to evaluate)")
    _need(not (v["eval_interval"] and not pairs and v["backend"] == "real"),
          f"--eval-interval {v['eval_interval']} needs --eval-prompt-data NAME PATH (the simulator alone makes up "
          f"evaluation prompts)")
    if v["load"] is not None:
        _need(os.path.isdir(v["load"]), f"--load {v['load']}: no such checkpoint directory; give the --save "
                                        f"directory of an earlier run (or leave --load out)")
    for name in ("trace_out", "report"):
        if v[name] is not None:
            _need(_writable(v[name]), f"{_flags_of(name)} {v[name]}: cannot be written (its directory is missing "
                                      f"or read-only, or it is a directory); give a writable file path")
    if v["save"] is not None:
        _need(os.path.isdir(v["save"]) and os.access(v["save"], os.W_OK) or
              not os.path.exists(v["save"]) and _writable(v["save"], make_parents=True),
              f"--save {v['save']}: cannot be written; give a writable directory")
    for name in ("tensorboard_dir", "wandb_dir"):
        d = v.get(name)
        if d is not None:
            _need(os.path.isdir(d) and os.access(d, os.W_OK) or not os.path.exists(d) and
                  _writable(os.path.join(d, "x"), make_parents=True),
                  f"{_flags_of(name)} {d}: cannot be written; give a writable directory")
    _need(not (v["compare_sim"] and v["report"] is None),
          "--compare-sim draws the run beside its simulation in the --report page; add --report FILE.html")
    if command == "simulate":
        _need(not (v["search"] and v["train_offload_plan"] == "auto"),
              "--train-offload-plan auto chooses --gpu-memory-utilization, which --search searches too: search with "
              "--train-offload-plan all (or a list of tags), then run the winner with --train-offload-plan auto")
        _need(not (v["search"] and v["sweep"]),
              "--search and --sweep cannot be combined: --search chooses the layout itself; use one of them")
        _need(not (v["trace_out"] and (v["search"] or v["sweep"])),
              f"--trace-out traces one run, and --{'search' if v['search'] else 'sweep'} simulates many; drop "
              f"--trace-out (--report FILE.html draws the whole {'search' if v['search'] else 'sweep'}), or trace "
              f"the configuration you chose by simulating it alone")
        _need(not (v["record_calls"] and (v["search"] or v["sweep"])),
              "--record-calls records the calls of one run; leave it out of --sweep and --search")
        if v["target_step_time"] is not None:
            _need(v["search"] in ("fewest-gpus", "cheapest"),
                  "--target-step-time is the goal of --search fewest-gpus (or a limit for --search cheapest); "
                  "pass one of them or leave it out")
            _need(v["target_step_time"] > 0, f"--target-step-time must be > 0 seconds, got {v['target_step_time']}")
        _need(v["max_gpus"] >= 1, f"--max-gpus must be ≥ 1, got {v['max_gpus']}")
        _need(v["workers"] is None or v["workers"] >= 1, f"--workers must be ≥ 1, got {v['workers']}")
