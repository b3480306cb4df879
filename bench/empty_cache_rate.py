"""The trainer's `torch.cuda.empty_cache()` rate per GiB handed back, read off the whole-step runs' own logs (issue 17).

vime's real trainer times the parts of each sleep (`sleep parts (s): ... empty_cache X` in train_stderr.log) and
logs its torch cache after training (`memory/trained_torch_cache_gib` in train.jsonl) and after the sleep (the
`asleep:` line before the parts). What the empty_cache hands back is the difference; its seconds per GiB are
PyTorch's cudaFree of its cached segments, the driver's work, which the simulator charges at
`vmm.empty_cache_s_per_gib`. The first sleep (before any training) frees nothing and is skipped.

    python bench/empty_cache_rate.py            # per run, then the median per GPU kind
    python bench/empty_cache_rate.py --write    # + bench/data/empty_cache_rate.json and the H200 profile's field

The H200's median goes into H200-141G-measured (and from there to the datasheet presets that carry it); the H100's
into H100-SXM-80G-measured through bench/h100_measured_preset.py, which reads the JSON.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RUNS = ROOT / "bench" / "data" / "h200_train_e2e"
OUT = ROOT / "bench" / "data" / "empty_cache_rate.json"
H200 = ROOT / "vime" / "sim" / "data" / "hardware" / "H200-141G-measured.json"
FIELD = "vmm.empty_cache_s_per_gib"
ASLEEP = re.compile(r"\[vime trainer rank 0\] asleep: .*?torch_cache_gib ([0-9.]+)")
PARTS = re.compile(r"\[vime trainer rank 0\] sleep parts \(s\):.*?empty_cache ([0-9.]+)")
MIN_GIB = 2.0  # below this the call's fixed part (~2 ms) outweighs the rate


def kind_of(run: Path) -> str:
    """The GPU a run used: the lent H100 runs carry "h100" in their names, every other run is the H200's."""
    return "H100" if "h100" in run.name else "H200"


def samples(run: Path) -> list[dict]:
    """(GiB handed back, seconds) of every sleep after a training step of one run."""
    log, metrics = run / "train_stderr.log", run / "train.jsonl"
    if not (log.exists() and metrics.exists()):
        return []
    trained: dict[int, float] = {}
    for line in metrics.read_text().splitlines():
        row = json.loads(line)
        cache = row.get("metrics", {}).get("memory/trained_torch_cache_gib")
        if cache is not None and row.get("rollout_id") is not None:
            trained[int(row["rollout_id"])] = float(cache)
    sleeps: list[tuple[float, float]] = []  # (cache after the sleep, empty_cache seconds), in order
    after = None
    for line in log.read_text(errors="replace").splitlines():
        if m := ASLEEP.search(line):
            after = float(m.group(1))
        elif (m := PARTS.search(line)) and after is not None:
            sleeps.append((after, float(m.group(1))))
            after = None
    out = []
    for i, (left, secs) in enumerate(sleeps[1:]):  # sleep i + 1 follows rollout i's training
        if i in trained and trained[i] - left >= MIN_GIB:
            out.append({"rollout": i, "freed_gib": trained[i] - left, "seconds": secs,
                        "s_per_gib": secs / (trained[i] - left)})
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"write {OUT.name} and the H200 profile's {FIELD}")
    args = ap.parse_args()
    by_kind: dict[str, list[float]] = {}
    res: dict = {"runs": {}, "median_s_per_gib": {}}
    for run in sorted(p for p in RUNS.iterdir() if p.is_dir()):
        rows = samples(run)
        if not rows:
            continue
        res["runs"][run.name] = rows
        rates = [r["s_per_gib"] for r in rows]
        by_kind.setdefault(kind_of(run), []).extend(rates)
        print(f"{run.name:58s} {kind_of(run)}  freed {statistics.median(r['freed_gib'] for r in rows):6.1f} GiB  "
              f"empty_cache {1e3 * statistics.median(r['seconds'] for r in rows):6.1f} ms  "
              f"{1e3 * statistics.median(rates):5.2f} ms/GiB ({len(rows)} sleeps)")
    for kind, rates in sorted(by_kind.items()):
        res["median_s_per_gib"][kind] = statistics.median(rates)
        q = statistics.quantiles(rates, n=10) if len(rates) > 1 else [rates[0]] * 9
        print(f"{kind}: median {1e3 * statistics.median(rates):.3f} ms/GiB over {len(rates)} sleeps "
              f"(p10 {1e3 * q[0]:.3f}, p90 {1e3 * q[-1]:.3f})")
    if args.write:
        OUT.write_text(json.dumps(res, indent=1) + "\n")
        prof = json.loads(H200.read_text())
        n = len(by_kind["H200"])
        prof["vmm"]["empty_cache_s_per_gib"] = round(res["median_s_per_gib"]["H200"], 7)
        runs = sum(1 for r in res["runs"] if kind_of(Path(r)) == "H200")
        prof["sources"][FIELD] = (f"median over {n} trainer sleeps of {runs} "
                                  f"H200 whole steps: the sleep's timed empty_cache over the torch cache it handed back "
                                  f"(bench/empty_cache_rate.py, {OUT.relative_to(ROOT)})")
        H200.write_text(json.dumps(prof, indent=2) + "\n")
        print(f"wrote {OUT.relative_to(ROOT)} and {H200.relative_to(ROOT)}: {FIELD}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
