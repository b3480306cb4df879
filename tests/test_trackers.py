"""`vime train --use-wandb --wandb-mode offline --use-tensorboard` (issue 19): both files are read back and hold every step's metrics under its rollout id."""

from __future__ import annotations

import contextlib
import io
import json
import struct
from pathlib import Path

import pytest

from vime import cli


def read_wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline wandb run file (its record log: a 7-byte header, then 32 KiB
    blocks of records, each CRC32C, length, type FULL/FIRST/MIDDLE/LAST, protobuf Record bytes)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = run_file.read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, rows = 32768, 7, b"", []
    while pos + 7 <= len(data):
        off = pos % block
        if block - off < 7:
            pos += block - off
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += block - off
            continue
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 2):
            buf = chunk
        else:
            buf += chunk
        if kind in (1, 4):
            rec = pb.Record()
            rec.ParseFromString(buf)
            if rec.WhichOneof("record_type") == "history":
                rows.append({(i.key or "/".join(i.nested_key)): json.loads(i.value_json) for i in rec.history.item})
    return rows


def test_offline_wandb_and_tensorboard_hold_the_steps(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = io.StringIO()
    argv = ["train", "--backend", "sim", "--num-rollout", "3", "--json", "--use-wandb", "--wandb-mode", "offline",
            "--wandb-dir", str(tmp_path / "wb"), "--wandb-project", "vime-test", "--use-tensorboard",
            "--tensorboard-dir", str(tmp_path / "tb")]
    with contextlib.redirect_stdout(out):
        assert cli.main(argv) == 0
    steps = [json.loads(ln) for ln in out.getvalue().splitlines() if '"event": "step"' in ln]
    assert [s["rollout_id"] for s in steps] == [0, 1, 2]

    (run_file,) = (tmp_path / "wb" / "wandb").glob("offline-run-*/run-*.wandb")
    rows = read_wandb_history(run_file)
    assert [r["_step"] for r in rows] == [0, 1, 2]
    acc = EventAccumulator(str(tmp_path / "tb"))
    acc.Reload()
    for key in ("perf/step_time", "train/loss", "rollout/raw_reward"):
        want = [s["metrics"][key] for s in steps]
        assert [r[key] for r in rows] == pytest.approx(want)
        assert [(e.step, e.value) for e in acc.Scalars(key)] == [(i, pytest.approx(v, rel=1e-6)) for i, v in
                                                                 enumerate(want)]


def test_an_unwritable_tracker_directory_fails_before_the_run(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["train", "--backend", "sim", "--use-tensorboard", "--tensorboard-dir", str(tmp_path / "file")])
    assert rc == 2 and "--tensorboard-dir" in err.getvalue()
