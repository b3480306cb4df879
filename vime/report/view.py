"""What the HTML pages draw, as plain JSON-able data: labels and units for people, time series cut to what a chart needs.

`report.js` draws these view models; `html.py` embeds them in a page. Everything here is a pure
function of a document (``vime.simulate/1``, ``vime.train/1``, a sweep's rows) and a `Recorder`,
and deterministic: the same run gives the same bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from typing import Any

from vime.report.recorder import HOST, MemorySample, Recorder, Span
from vime.report.trace import lanes as _lanes

GiB = 1024**3
MiB = 1024**2

#: The six phases of T_step in the seed's order, then what else a step can hold.
PHASE_ORDER = ("rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv", "eval", "save", "gap")
PHASE_LABELS = {"rollout": "Rollout", "offload": "Offload", "train": "Train", "onload_weights": "Onload weights",
                "weight_sync": "Weight sync", "onload_kv": "Onload KV cache", "gap": "Outside the phases",
                "eval": "Evaluation", "save": "Checkpoint save", "startup": "Start-up"}
#: Which numbered steps of the seed each phase covers.
SEED_STEPS = {"rollout": "14–32", "offload": "33–36", "train": "37–42", "onload_weights": "43",
              "weight_sync": "44–53", "onload_kv": "54", "startup": "1–13"}
PHASE_COLORS = {"rollout": "#4e79a7", "offload": "#f28e2b", "train": "#e15759", "onload_weights": "#76b7b2",
                "weight_sync": "#59a14f", "onload_kv": "#edc948", "gap": "#bab0ac", "eval": "#b07aa1",
                "save": "#ff9da7", "startup": "#9c755f"}
PALETTE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac", "#1f77b4", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5")

#: Memory tags as people say them, and their colours (one per tag whichever engine or rank holds it).
TAG_LABELS = {"kv_cache": "KV cache", "weights": "weights", "cuda_graph": "CUDA graphs", "runtime": "runtime",
              "context": "CUDA context", "params": "parameters", "grads": "gradients", "optimizer": "optimizer state",
              "activations": "activations", "weight_buffer": "weight-sync buffer", "weight_backup": "weight backup",
              "step_residue": "first-step residue", "used": "in use (measured)"}
_SERIES_COLORS = {
    ("engine", "weights"): "#2b5d8c", ("engine", "kv_cache"): "#8fbbe0", ("engine", "cuda_graph"): "#4f9a4a",
    ("engine", "runtime"): "#9fd48f", ("engine", "context"): "#6b8a9e",
    ("trainer", "params"): "#c23b3b", ("trainer", "grads"): "#f08c8c", ("trainer", "optimizer"): "#8c5a2b",
    ("trainer", "activations"): "#f28e2b", ("trainer", "weight_buffer"): "#f6c35b",
    ("trainer", "weight_backup"): "#d37295", ("trainer", "context"): "#a5877a", ("trainer", "step_residue"): "#7f7f7f",
    ("gpu", "used"): "#4e79a7", ("host", "used"): "#9c755f",
}
#: Bottom-to-top stacking order: what lives longest sits lowest.
_STACK_ORDER = ("context", "weights", "params", "optimizer", "grads", "runtime", "cuda_graph", "kv_cache",
                "weight_backup", "weight_buffer", "step_residue", "activations", "used")
#: Call spans of the timeline, coloured like the phase they serve.
CALL_COLORS = {"generate": "#4e79a7", "sleep": "#f28e2b", "allocator.sleep": "#f7b46b", "train": "#e15759",
               "wake_up": "#76b7b2", "allocator.wake_up": "#a8d5d1", "update_weights": "#59a14f",
               "export_bucket": "#8cc084", "start_weight_update": "#3d7a37", "finish_weight_update": "#3d7a37",
               "pause": "#b07aa1", "resume": "#d4a6c8", "flush_cache": "#edc948", "init": "#9c755f",
               "training_ready": "#bab0ac", "compute_log_prob": "#ff9d9a"}

#: Most change points one memory chart keeps (peaks are kept; see `_downsample`).
MAX_POINTS = 3000
#: Up to this many steps each gets its phase bar; beyond, the mean, the fastest and the slowest.
MAX_STEP_BARS = 6


# --------------------------------------------------------------------------------------------
# Units for people
# --------------------------------------------------------------------------------------------


def fmt_seconds(s: float | None) -> str:
    """``0.000012`` → "12 µs", ``0.3`` → "300 ms", ``12.34`` → "12.3 s", ``754`` → "12 min 34 s"."""
    if s is None or not math.isfinite(s):
        return "—"
    a = abs(s)
    sign = "-" if s < 0 else ""
    if a == 0:
        return "0 s"
    if a < 1e-3:
        return f"{sign}{a * 1e6:.0f} µs"
    if a < 1:
        return f"{sign}{a * 1e3:.3g} ms"
    if a < 100:
        return f"{sign}{a:.3g} s" if a >= 10 else f"{sign}{a:.2f} s"
    if a < 3600:
        m, r = divmod(round(a), 60)
        return f"{sign}{m} min {r:02d} s" if a < 600 else f"{sign}{a / 60:.1f} min"
    h, r = divmod(round(a / 60), 60)
    return f"{sign}{h} h {r:02d} min"


def fmt_gib(g: float | None) -> str:
    """GiB for people: "72.2 GiB", "512 MiB", "0"."""
    if g is None or not math.isfinite(g):
        return "—"
    if g == 0:
        return "0"
    if abs(g) < 1:
        return f"{g * 1024:.0f} MiB"
    return f"{g:.1f} GiB" if abs(g) < 100 else f"{g:.0f} GiB"


def fmt_count(n: float | None) -> str:
    if n is None:
        return "—"
    return f"{n:,.0f}"


def gpu_ranges(gpus: Sequence[int]) -> str:
    """``[0, 1, 2, 3, 5]`` → "0–3, 5"."""
    out: list[str] = []
    run: list[int] = []
    for g in sorted(gpus):
        if run and g == run[-1] + 1:
            run.append(g)
            continue
        if run:
            out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [g]
    if run:
        out.append(f"{run[0]}–{run[-1]}" if len(run) > 1 else str(run[0]))
    return ", ".join(out)


def role_of(owner: str) -> str:
    """The kind of owner: "engine3" → "engine", "actor" → "trainer"."""
    base = re.sub(r"\d+$", "", owner)
    return {"actor": "trainer"}.get(base, base)


def series_label(role: str, tag: str) -> str:
    pinned = tag.startswith("pinned:")
    bare = tag.split(":", 1)[1] if pinned else tag
    label = f"{role} · {TAG_LABELS.get(bare, bare.replace('_', ' '))}"
    return label + (" (pinned host copy)" if pinned else "")


def series_color(role: str, tag: str) -> str:
    bare = tag.split(":", 1)[1] if tag.startswith("pinned:") else tag
    return _SERIES_COLORS.get((role, bare)) or PALETTE[_stable_hash(f"{role}/{bare}") % len(PALETTE)]


def _stack_rank(key: str) -> tuple[int, int, str]:
    role, _, tag = key.partition("/")
    bare = tag.split(":", 1)[1] if tag.startswith("pinned:") else tag
    idx = _STACK_ORDER.index(bare) if bare in _STACK_ORDER else len(_STACK_ORDER)
    return (0 if role == "engine" else 1, idx, key)


def _stable_hash(name: str) -> int:
    """A colour index that does not depend on PYTHONHASHSEED."""
    h = 0
    for ch in name:
        h = (h * 131 + ord(ch)) % 1_000_003
    return h


def call_color(name: str) -> str:
    return CALL_COLORS.get(name) or PALETTE[_stable_hash(name) % len(PALETTE)]


def _r(x: float, nd: int = 6) -> float:
    return round(float(x), nd)


# --------------------------------------------------------------------------------------------
# One run: timeline, phases, memory per GPU group
# --------------------------------------------------------------------------------------------


def _track_label(track: str) -> str:
    if track == "actor":
        return "trainer (actor)"
    return track.replace("_", " ")


def _track_rank(track: str) -> tuple[int, int, str]:
    m = re.match(r"^(\D+)(\d+)$", track)
    order = {"actor": 0, "trainer": 0, "engine": 1, "rollout_manager": 3}
    if m:
        return (order.get(m.group(1), 2), int(m.group(2)), track)
    return (order.get(track, 2), 0, track)


def _gpu_series(samples: Iterable[MemorySample]) -> dict[int, list[MemorySample]]:
    out: dict[int, list[MemorySample]] = {}
    for m in samples:
        out.setdefault(m.gpu, []).append(m)
    return out


def _states(samples: Sequence[MemorySample], origin: float) -> tuple[list[float], list[dict[str, int]]]:
    """Change times and the (role/tag → bytes) state right after each (one state per distinct time). Owners of
    one role on one device add up (the host's pinned buffers of four engines are "engine · …")."""
    times: list[float] = []
    states: list[dict[str, int]] = []
    held: dict[tuple[str, str], int] = {}
    for m in samples:
        if m.bytes:
            held[(m.owner, m.tag)] = m.bytes
        else:
            held.pop((m.owner, m.tag), None)
        cur: dict[str, int] = {}
        for (owner, tag), b in held.items():
            key = f"{role_of(owner)}/{tag}"
            cur[key] = cur.get(key, 0) + b
        t = _r(m.t - origin)
        if times and times[-1] == t:
            states[-1] = cur
        else:
            times.append(t)
            states.append(cur)
    return times, states


def _downsample(times: list[float], states: list[dict[str, int]], limit: int) -> tuple[list[float], list[dict[str, int]]]:
    """At most `limit` points: per time bucket the state of the bucket's highest total (peaks survive) and its last."""
    if len(times) <= limit:
        return times, states
    t0, t1 = times[0], times[-1]
    buckets = max(1, limit // 2)
    width = (t1 - t0) / buckets or 1.0
    keep: list[int] = []
    i = 0
    n = len(times)
    while i < n:
        b = int((times[i] - t0) / width)
        j = i
        best = i
        while j < n and int((times[j] - t0) / width) == b:
            if sum(states[j].values()) > sum(states[best].values()):
                best = j
            j += 1
        keep.extend(sorted({best, j - 1}))
        i = j
    return [times[k] for k in keep], [states[k] for k in keep]


#: GPUs that hold the same tags and whose totals stay within `ALIKE_SHARE` of capacity at every moment are drawn as one
#: chart ("alike"), the difference stated; identical ones always are. Their allocations may come in a different order
#: (a rank's PyTorch cache grows at its own largest micro-batch); where they come in the same order at moments within
#: `ALIKE_SHIFT` of the run's length, the chart says so.
ALIKE_SHARE = 0.15
ALIKE_SHIFT = 0.02

Series = tuple[list[float], list[dict[str, int]]]


def _merged(a: Series, b: Series) -> list[tuple[dict[str, int], dict[str, int]]]:
    """Both GPUs' states at every moment either changes (a state holds until its GPU's next sample)."""
    (ta, sa), (tb, sb) = a, b
    out, i, j, cur_a, cur_b = [], 0, 0, {}, {}
    while i < len(ta) or j < len(tb):
        t = min(ta[i] if i < len(ta) else math.inf, tb[j] if j < len(tb) else math.inf)
        while i < len(ta) and ta[i] == t:
            cur_a, i = sa[i], i + 1
        while j < len(tb) and tb[j] == t:
            cur_b, j = sb[j], j + 1
        out.append((cur_a, cur_b))
    return out


def _same_order(a: Series, b: Series) -> bool:
    (ta, sa), (tb, sb) = a, b
    if len(ta) != len(tb) or any(x.keys() != y.keys() for x, y in zip(sa, sb, strict=True)):
        return False
    span = max(ta[-1] - ta[0], tb[-1] - tb[0]) if ta else 0.0
    return all(abs(x - y) <= ALIKE_SHIFT * span for x, y in zip(ta, tb, strict=True))


def _alike(a: Series, b: Series, capacity: int | None) -> bool:
    if {k for s in a[1] for k in s} != {k for s in b[1] for k in s}:
        return False
    worst = max((abs(sum(x.values()) - sum(y.values())) for x, y in _merged(a, b)), default=0)
    return worst <= ALIKE_SHARE * (capacity or max((sum(x.values()) for x in a[1]), default=0))


def memory_groups(recorder: Recorder, capacity: dict[int, int], origin: float, *,
                  limit: int = MAX_POINTS) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(series legend, groups). GPUs with identical memory over time (up to which engine or rank holds it)
    are one variant; variants with the same allocations at the same moments and totals within
    `ALIKE_SHARE` of capacity are one group, drawn as its fullest variant, each GPU a click away. Host
    pinned memory is its own group, last. Values are GiB."""
    per_gpu = _gpu_series(recorder.samples)
    exact: dict[Any, list[int]] = {}
    data: dict[int, tuple[list[float], list[dict[str, int]]]] = {}
    owners: dict[int, dict[str, str]] = {}
    for gpu in sorted(per_gpu, key=lambda g: (g == HOST, g)):
        samples = per_gpu[gpu]
        data[gpu] = _states(samples, origin)
        owners[gpu] = {role_of(o): o for o in sorted({m.owner for m in samples})}
        if gpu != HOST:
            times, states = data[gpu]
            sig = (capacity.get(gpu), tuple(times), tuple(tuple(sorted(s.items())) for s in states))
            exact.setdefault(sig, []).append(gpu)
    clusters: list[list[list[int]]] = []  # groups of variants (each a list of identical GPUs)
    for variant in sorted(exact.values(), key=lambda gs: gs[0]):
        for cl in clusters:
            ref = cl[0][0]
            if capacity.get(ref) == capacity.get(variant[0]) and _alike(data[ref], data[variant[0]], capacity.get(ref)):
                cl.append(variant)
                break
        else:
            clusters.append([variant])
    if HOST in data:
        clusters.append([[HOST]])
    keys: set[str] = set()
    groups = []
    for cl in clusters:
        gpus = sorted(g for v in cl for g in v)
        peaks = [max((sum(s.values()) for s in data[v[0]][1]), default=0) for v in cl]
        order = sorted(range(len(cl)), key=lambda i: (-peaks[i], cl[i][0]))  # the fullest variant first
        variants: list[dict[str, Any]] = []
        for i in order:
            times, states = _downsample(*data[cl[i][0]], limit)
            vkeys = sorted({k for s in states for k in s}, key=_stack_rank)
            keys.update(vkeys)
            variants.append({"gpus": cl[i], "t": times,
                             "series": {k: [_r(s.get(k, 0) / GiB, 4) for s in states] for k in vkeys}})
        diff: dict[str, float] = {}
        shift = 0.0
        same_order = True
        if len(cl) > 1:
            ref = data[cl[order[0]][0]]
            for v in cl:
                if _same_order(ref, data[v[0]]):
                    shift = max([shift] + [abs(x - y) for x, y in zip(ref[0], data[v[0]][0], strict=True)])
                else:
                    same_order = False
                for x, y in _merged(ref, data[v[0]]):
                    for k in set(x) | set(y):
                        diff[k] = max(diff.get(k, 0.0), abs(x.get(k, 0) - y.get(k, 0)) / GiB)
            shift = shift if same_order else 0.0
        cap = capacity.get(gpus[0])
        host = gpus == [HOST]
        many = len(gpus) > 1
        measured_host = host and set(variants[0]["series"]) <= {"host/used"}
        label = ("Host memory in use" if measured_host else "Host (pinned) memory") if host else (
            f"GPUs {gpu_ranges(gpus)}" if many else f"GPU {gpus[0]}")
        note = ""
        if host:
            note = ("what the machine reports in use (MemTotal − MemAvailable): a run without GPUs" if measured_host
                    else "pinned host buffers the offloads copy into (all engines and ranks together)")
        groups.append({
            "gpus": gpus, "host": host, "measured_host": measured_host, "label": label, "note": note,
            "kind": "identical" if len(cl) == 1 and many else ("alike" if many else "one"),
            "capacity_gib": None if cap is None else _r(cap / GiB, 4),
            "t": variants[0]["t"], "series": variants[0]["series"], "shown_gpu": variants[0]["gpus"][0],
            "variants": variants,
            "differ_gib": {k: _r(v, 3) for k, v in sorted(diff.items(), key=lambda kv: -kv[1]) if v >= 1 / 1024},
            "shift_s": _r(shift), "same_order": same_order, "alike_share": ALIKE_SHARE,
            "members": [{"gpu": g, "variant": next(i for i, v in enumerate(variants) if g in v["gpus"]),
                         "owners": dict(sorted(owners[g].items()))} for g in gpus],
        })
    legend = [{"key": k, "label": series_label(*k.split("/", 1)), "color": series_color(*k.split("/", 1))}
              for k in sorted(keys, key=_stack_rank)]
    return legend, groups


def _origin(recorder: Recorder) -> float:
    ts = [s.t0 for s in recorder.spans] + [m.t for m in recorder.samples]
    return min(ts) if ts else 0.0


def _phase_spans(recorder: Recorder, origin: float) -> list[dict[str, Any]]:
    """Phase spans in time order; the start-up container is left out when its parts are there."""
    names = {n for n, _, _, _ in recorder.phase_spans}
    out = []
    for name, rid, t0, t1 in sorted(recorder.phase_spans, key=lambda p: (p[2], -p[3], p[0])):
        if name == "startup" and names & {"onload_weights", "weight_sync", "onload_kv"} and rid is None:
            continue
        out.append({"name": name, "label": PHASE_LABELS.get(name, name), "rollout_id": rid,
                    "t0": _r(t0 - origin), "t1": _r(t1 - origin), "color": PHASE_COLORS.get(name, "#999")})
    return out


def _windows(recorder: Recorder, origin: float) -> list[dict[str, Any]]:
    """Zoom presets: start-up and each step, from the phase spans."""
    by: dict[Any, list[float]] = {}
    for _, rid, t0, t1 in recorder.phase_spans:
        key = "startup" if rid is None else rid
        lo, hi = by.get(key, [t0, t1])
        by[key] = [min(lo, t0), max(hi, t1)]
    out = []
    if "startup" in by:
        lo, hi = by.pop("startup")
        out.append({"label": "start-up", "t0": _r(lo - origin), "t1": _r(hi - origin)})
    for rid in sorted(by, key=lambda r: int(r)):
        lo, hi = by[rid]
        out.append({"label": f"step {rid}", "t0": _r(lo - origin), "t1": _r(hi - origin)})
    return out


def run_view(doc: dict[str, Any], recorder: Recorder, *, origin: float | None = None,
             limit: int = MAX_POINTS) -> dict[str, Any]:
    """The timeline and memory charts of one run (simulated or measured) on one time axis: t = 0 is the run's
    first event, or `origin` (in the recorder's clock) when given; ``t_start`` is the earliest time shown."""
    if origin is None:
        origin = _origin(recorder)
    capacity = {int(g["gpu"]): int(round(g["capacity_gib"] * GiB)) for g in doc.get("memory", {}).get("gpus", [])}
    legend, groups = memory_groups(recorder, capacity, origin, limit=limit)
    by_track: dict[str, list[Span]] = {}
    for s in recorder.spans:
        if s.track != "phases":
            by_track.setdefault(s.track, []).append(s)
    names: list[str] = sorted({s.name for spans in by_track.values() for s in spans})
    name_idx = {n: i for i, n in enumerate(names)}
    tracks = []
    for track in sorted(by_track, key=_track_rank):
        lanes = _lanes(by_track[track])
        tracks.append({"name": track, "label": _track_label(track), "lanes": 1 + max(lane for lane, _ in lanes),
                       "spans": [[_r(s.t0 - origin), _r(s.t1 - origin), name_idx[s.name], lane]
                                 for lane, s in sorted(lanes, key=lambda x: (x[1].t0, x[0]))]})
    phases = _phase_spans(recorder, origin)
    end = max([s.t1 for s in recorder.spans] + [m.t for m in recorder.samples] + [origin]) - origin
    start = min([s.t0 for s in recorder.spans] + [m.t for m in recorder.samples] + [origin]) - origin
    oom = None
    if recorder.oom is not None:
        o = recorder.oom
        t = (o.time if o.time is not None else end + origin) - origin
        short = o.requested - o.free
        cap = capacity.get(o.gpu)  # the device's use when the allocation failed: capacity minus what was free
        oom = {"gpu": o.gpu, "t": _r(t), "owner": o.owner, "role": role_of(o.owner), "tag": o.tag,
               "phase": o.phase or "startup", "requested_gib": _r(o.requested / GiB, 4),
               "free_gib": _r(o.free / GiB, 4), "short_by_gib": _r(short / GiB, 4),
               "used_gib": None if cap is None else _r((cap - o.free) / GiB, 4),
               "label": f"OOM: {series_label(role_of(o.owner), o.tag)} asked for {fmt_gib(o.requested / GiB)}, "
                        f"{fmt_gib(o.free / GiB)} free"}
        end = max(end, t + 0.03 * max(t - start, 1e-3))  # room to see the moment
    return {"t_start": _r(start), "t_end": _r(end), "phases": phases, "windows": _windows(recorder, origin), "tracks": tracks,
            "call_names": names, "call_colors": [call_color(n) for n in names],
            "memory": {"legend": legend, "groups": groups}, "oom": oom}


def phase_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """The phase bar chart's rows: the mean over the steps, then each step (when more than one)."""
    summary = doc.get("summary", {})
    rows = []
    steps = doc.get("steps", [])

    def segs(phases: dict[str, float]) -> list[dict[str, Any]]:
        return [{"name": p, "label": PHASE_LABELS.get(p, p), "s": _r(phases[p]), "color": PHASE_COLORS.get(p, "#999")}
                for p in PHASE_ORDER if phases.get(p)]

    if steps:
        mean = {p: v["seconds"] for p, v in summary.get("phases", {}).items()}
        row: dict[str, Any] = {"label": "mean" if len(steps) > 1 else f"step {steps[0]['rollout_id']}",
                               "total": summary.get("t_step", 0.0), "segments": segs(mean)}
        bands = {p: v["band"] for p, v in summary.get("phases", {}).items() if isinstance(v.get("band"), list)}
        if bands:
            row["bands"] = bands
        if isinstance(summary.get("t_step_band"), list):
            row["total_band"] = summary["t_step_band"]
        rows.append(row)
        shown = steps
        if len(steps) > MAX_STEP_BARS:  # a long run: the extremes say how much steps vary
            fast = min(steps, key=lambda s: (s["t_step"], s["rollout_id"]))
            slow = max(steps, key=lambda s: (s["t_step"], -s["rollout_id"]))
            shown = [fast, slow]
        if len(steps) > 1:
            for s in shown:
                extra = {"gap": s.get("t_gap", 0.0)}
                what = "" if shown is steps else (" (fastest)" if s is shown[0] else " (slowest)")
                rows.append({"label": f"step {s['rollout_id']}{what}", "total": s["t_step"],
                             "segments": segs({**s["phases"], **extra})})
    return rows


def partial_step(recorder: Recorder) -> dict[str, Any] | None:
    """The phases of the step an OOM ended, up to the OOM (None without an OOM in a step)."""
    o = recorder.oom
    if o is None:
        return None
    rid = getattr(o, "rollout_id", None)
    if rid is None:
        rid = recorder.rollout_id
    spans = [(n, t0, t1) for n, r, t0, t1 in recorder.phase_spans if r == rid and rid is not None]
    if rid is None:
        spans = [(n, t0, t1) for n, r, t0, t1 in recorder.phase_spans if r is None and n != "startup"]
    t_oom = o.time if o.time is not None else (spans[-1][2] if spans else 0.0)
    segs: list[dict[str, Any]] = [{"name": n, "label": PHASE_LABELS.get(n, n), "s": _r(t1 - t0),
                                   "color": PHASE_COLORS.get(n, "#999")} for n, t0, t1 in sorted(spans, key=lambda x: x[1])]
    phase = o.phase or "startup"
    if not any(s["name"] == phase for s in segs) and spans:
        t_last = max(t1 for _, _, t1 in spans)
        segs.append({"name": phase, "label": PHASE_LABELS.get(phase, phase), "s": _r(max(0.0, t_oom - t_last)),
                     "color": PHASE_COLORS.get(phase, "#999")})
    label = "start-up" if rid is None else f"step {rid}"
    return {"label": f"{label} until the OOM", "total": _r(sum(s["s"] for s in segs)), "segments": segs,
            "oom": True, "rollout_id": rid}
