"""bench/engine_wake_log.py: vLLM's logged wake times matched to the steps' onload phases."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import engine_wake_log as ewl  # noqa: E402

LOG = """(EngineCore pid=1) INFO [abstract.py:345] It took 0.054 seconds to wake up tags ['weights'].
(EngineCore pid=1) INFO [abstract.py:345] It took 0.168 seconds to wake up tags ['kv_cache'].
(EngineCore pid=1) INFO [abstract.py:345] It took 0.041 seconds to wake up tags ['weights'].
(EngineCore pid=1) INFO [abstract.py:345] It took 0.202 seconds to wake up tags ['kv_cache'].
(EngineCore pid=1) INFO [abstract.py:345] It took 0.043 seconds to wake up tags ['weights'].
(EngineCore pid=1) INFO [abstract.py:345] It took 0.210 seconds to wake up tags ['kv_cache'].
"""


def test_the_steps_take_the_logs_last_wakes_and_the_call_is_the_difference(tmp_path) -> None:
    wakes = ewl.log_wakes(LOG)
    assert wakes == {"weights": [0.054, 0.041, 0.043], "kv_cache": [0.168, 0.202, 0.210]}
    steps = "\n".join(json.dumps({"metrics": {"perf/onload_weights_time": w, "perf/onload_kv_time": k}})
                      for w, k in ((0.05, 0.21), (0.049, 0.215)))
    # two steps: the log's first wake is the start-up's; the second step is the only one after the first
    row = ewl.run_row("r", wakes, ewl.phases(steps + "\n" + json.dumps({"rollout_id": 9})))
    assert row["weights_inside_s"] == 0.043 and row["kv_inside_s"] == 0.210
    assert row["weights_call_s"] == pytest.approx(0.006) and row["kv_call_s"] == pytest.approx(0.005)
    assert ewl.run_row("r", wakes, ewl.phases(steps.splitlines()[0])) is None  # one step: nothing after the first
    run = tmp_path / "run1"
    run.mkdir()
    (run / "engine0.log").write_text(LOG)
    (run / "train.jsonl").write_text(steps + "\n")
    assert [r["run"] for r in ewl.rows(tmp_path)] == ["run1"]


def test_the_committed_runs_show_a_call_of_a_few_milliseconds() -> None:
    table = ewl.rows()
    assert len(table) >= 40
    calls = [r["weights_call_s"] for r in table] + [r["kv_call_s"] for r in table]
    assert 0.002 < min(calls) and max(calls) < 0.012
