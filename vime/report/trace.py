"""Chrome trace-event export (opens in Perfetto / chrome://tracing): spans per track, memory as counters."""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from vime.report.recorder import HOST, MemorySample, Recorder, Span

_US = 1e6  # trace timestamps are microseconds
GiB = 1024**3


def lanes(spans: list[Span]) -> list[tuple[int, Span]]:
    """Give overlapping spans of one track separate lanes so that each lane's B/E events nest.

    Interval partitioning: a span goes to the first lane whose last span has ended. Spans are
    taken in (t0, -t1, name) order, so the result depends on the spans only.
    """
    ends: list[float] = []
    out: list[tuple[int, Span]] = []
    for s in sorted(spans, key=lambda s: (s.t0, -s.t1, s.name)):
        for lane, end in enumerate(ends):
            if end <= s.t0:
                ends[lane] = s.t1
                break
        else:
            lane = len(ends)
            ends.append(s.t1)
        out.append((lane, s))
    return out


def _gpu_name(gpu: int) -> str:
    return "host (pinned)" if gpu == HOST else f"GPU {gpu}"


def trace_events(spans: Iterable[Span], samples: Iterable[MemorySample],
                 instants: Iterable[tuple[float, str, str, dict[str, Any]]] = ()) -> list[dict[str, Any]]:
    """Turn spans, memory samples and instants into trace events.

    One process per track ("phases", each engine, the trainer, each GPU); span tracks get B/E
    pairs on as many threads (lanes) as overlaps need; each GPU gets one counter series per
    owner/tag in GiB.
    """
    events: list[dict[str, Any]] = []
    by_track: dict[str, list[Span]] = defaultdict(list)
    for s in spans:
        by_track[s.track].append(s)
    samples = list(samples)
    gpus = sorted({m.gpu for m in samples})
    # Stable process ids: phases first, then span tracks by name, then GPUs.
    tracks = sorted(by_track, key=lambda t: (t != "phases", t))
    pid_of = {t: i + 1 for i, t in enumerate(tracks)}
    gpu_pid = {g: len(tracks) + 1 + i for i, g in enumerate(gpus)}
    for t, pid in pid_of.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": t}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})
    for g, pid in gpu_pid.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": _gpu_name(g)}})
        events.append({"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": pid}})

    for track in tracks:
        pid = pid_of[track]
        per_lane: dict[int, list[dict[str, Any]]] = defaultdict(list)
        for lane, s in lanes(by_track[track]):
            args = {k: v for k, v in s.args.items() if isinstance(v, (int, float, str, bool)) or v is None}
            per_lane[lane].append({"ph": "B", "name": s.name, "cat": track, "pid": pid, "tid": lane,
                                   "ts": s.t0 * _US, "args": args})
            per_lane[lane].append({"ph": "E", "name": s.name, "cat": track, "pid": pid, "tid": lane,
                                   "ts": s.t1 * _US})
        for lane in sorted(per_lane):
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": lane,
                           "args": {"name": f"{track}" if lane == 0 else f"{track} ({lane})"}})
            events.extend(per_lane[lane])

    # Memory counters: after each change, the GPU's full breakdown (so every series is continuous).
    state: dict[int, dict[str, int]] = defaultdict(dict)
    for m in samples:
        series = state[m.gpu]
        series[f"{m.owner}/{m.tag}"] = m.bytes
        events.append({"ph": "C", "name": "memory GiB", "pid": gpu_pid[m.gpu], "tid": 0, "ts": m.t * _US,
                       "args": {k: round(v / GiB, 4) for k, v in sorted(series.items())}})

    for when, where, what, info in instants:
        if where in pid_of:
            pid = pid_of[where]
        elif where.startswith("gpu") and where[3:].isdigit():
            pid = gpu_pid.get(int(where[3:]), 0)
        else:
            pid = 0
        events.append({"ph": "i", "s": "p", "name": what, "pid": pid, "tid": 0, "ts": when * _US,
                       "args": {k: v for k, v in info.items() if isinstance(v, (int, float, str, bool))}})
    return events


def recorder_trace(recorder: Recorder) -> dict[str, Any]:
    """The whole trace document of one simulation."""
    return {"traceEvents": trace_events(recorder.spans, recorder.samples, recorder.instants),
            "displayTimeUnit": "ms", "otherData": {"producer": "vime simulate"}}


def write_trace(recorder: Recorder, path: str) -> None:
    with open(path, "w") as f:
        json.dump(recorder_trace(recorder), f, separators=(",", ":"))
