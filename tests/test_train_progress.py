"""`vime train` progress: one JSON object per line and step with --json, a step bar on a terminal only."""

from __future__ import annotations

import io
import json

from vime.cli import main
from vime.cli.train import step_bar
from vime.config import parse_args
from vime.orchestrator import PHASES


def test_json_prints_one_line_per_step_on_the_sim_backend(capsys):
    code = main(["train", "--backend", "sim", "--json", "--num-rollout", "3", "--rollout-batch-size", "8"])
    out = capsys.readouterr().out
    assert code == 0
    events = [json.loads(line) for line in out.splitlines()]  # every line is one JSON object
    assert [e["event"] for e in events] == ["run", "startup", "step", "step", "step"]
    steps = [e for e in events if e["event"] == "step"]
    assert [s["rollout_id"] for s in steps] == [0, 1, 2]
    for s in steps:
        assert set(s["phases"]) == set(PHASES)
        assert s["t_step"] > 0 and abs(s["t_step"] - sum(s["phases"].values()) - s["t_gap"]) < 1e-6
        assert s["metrics"]["perf/step_time"] == s["t_step"]


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_step_bar_draws_on_a_terminal_only_and_never_with_json():
    args = parse_args(["--backend", "sim", "--num-rollout", "4"], command="train")
    for stream, drawn in ((_Terminal(), True), (io.StringIO(), False)):
        bar = step_bar(args, stream)
        bar.update(1)
        bar.close()
        assert ("train:" in stream.getvalue() and "/4" in stream.getvalue()) is drawn
    quiet = _Terminal()
    bar = step_bar(args.replace(json=True), quiet)
    bar.update(1)
    bar.close()
    assert quiet.getvalue() == ""
