"""Sample each vLLM engine's Prometheus `/metrics` during a `vime train` run (issue 17: the rollout, engine side).

usage: scrape_metrics.py TRAIN_JSONL OUT_JSONL [--interval S] [--samples N]

Waits for the run's `placement` event in TRAIN_JSONL (the engines' URLs), then writes one JSON line per
engine per sample: ``{"t": epoch, "engine": name, "m": {metric: value}}``, each counter, gauge and
histogram ``_sum``/``_count`` summed over its label sets. Differences of ``vllm:inter_token_latency_seconds``
``_sum``/``_count`` over a rollout give the decode iteration time requests saw; ``vllm:num_requests_running``
against time shows how fast the client put the batch in flight. `run.sh` kills it when the run ends; on its
own it stops once the engines have not answered for 60 s.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.request

_LINE = re.compile(r"^(vllm:[A-Za-z0-9_:]+?)(?:\{[^}]*\})?\s+([-+0-9.eEinfNa]+)$")


def parse(text: str) -> dict[str, float]:
    """Sum each vLLM series over its labels; histogram buckets and `_created` stamps are left out."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m or m.group(1).endswith(("_bucket", "_created")):
            continue
        try:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(2))
        except ValueError:
            continue
    return out


def engines(train_jsonl: str) -> list[tuple[str, str]]:
    """The engines' (name, url) from the placement event."""
    found: list[tuple[str, str]] = []
    try:
        with open(train_jsonl) as f:
            for line in f:
                try:
                    ev = json.loads(line)
                except ValueError:
                    continue
                if ev.get("event") == "placement":
                    found = [(h["name"], h["url"]) for h in ev.get("engine_hosts", [])]
    except FileNotFoundError:
        pass
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("train_jsonl")
    ap.add_argument("out_jsonl")
    ap.add_argument("--interval", type=float, default=0.25)
    ap.add_argument("--samples", type=int, default=0, help="stop after this many rounds (0: until killed)")
    a = ap.parse_args(argv)
    hosts: list[tuple[str, str]] = []
    while not hosts:
        hosts = engines(a.train_jsonl)
        time.sleep(1.0)
    last_ok = time.time()
    rounds = 0
    with open(a.out_jsonl, "a") as out:
        while time.time() - last_ok < 60 and not (a.samples and rounds >= a.samples):
            rounds += 1
            t0 = time.time()
            for name, url in hosts:
                try:
                    with urllib.request.urlopen(url.rstrip("/") + "/metrics", timeout=2) as r:
                        m = parse(r.read().decode())
                except OSError:
                    continue
                last_ok = time.time()
                out.write(json.dumps({"t": round(t0, 3), "engine": name, "m": m}) + "\n")
            out.flush()
            time.sleep(max(0.0, a.interval - (time.time() - t0)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
