"""Where checkpoints live and the rollout state saved beside the trainer's (data-source position, weight version)."""

from __future__ import annotations

import json
import os
from typing import Any

#: Megatron's marker of the newest checkpoint in a --save directory.
LATEST_FILE = "latest_checkpointed_iteration.txt"
STATE_FILE = "rollout_state.json"


def checkpoint_path(root: str, rollout_id: int) -> str:
    """Where the checkpoint after rollout `rollout_id` lives (Megatron's iter_NNNNNNN naming)."""
    return os.path.join(root, f"iter_{rollout_id:07d}")


def write_rollout_state(root: str, path: str, state: dict[str, Any]) -> None:
    """The rollout state into checkpoint `path`, and the newest-checkpoint marker plus a copy of the state
    into `root`, so --load can name the directory above (real backends read the state before start-up)."""
    os.makedirs(path, exist_ok=True)
    for where in (path, root):
        with open(os.path.join(where, STATE_FILE), "w", encoding="utf-8") as fh:
            json.dump(state, fh)
    with open(os.path.join(root, LATEST_FILE), "w", encoding="utf-8") as fh:
        fh.write(str(state["rollout_id"]))


def resolve_checkpoint(load: str) -> str:
    """The checkpoint directory --load means: its newest iteration when it is a --save root, else itself."""
    latest = os.path.join(load, LATEST_FILE)
    if os.path.isfile(latest):
        with open(latest, encoding="utf-8") as fh:
            return checkpoint_path(load, int(fh.read().strip()))
    return load


def read_rollout_state(path: str) -> dict[str, Any] | None:
    """The rollout state saved in checkpoint `path`, or None when the trainer's checkpoint has none."""
    state_file = os.path.join(path, STATE_FILE)
    if not os.path.isfile(state_file):
        return None
    with open(state_file, encoding="utf-8") as fh:
        state: dict[str, Any] = json.load(fh)
    return state
