"""vLLM's own CuMem pool timed alone, without an engine: its KV-cache wake by GiB and by how long after the sleep (issue 17).

    python bench/vllm_cumem_probe.py --size 124 --chunks 28 --settles 0,0.5,2 --repeats 2 --out probe_124.json

In the whole steps vLLM's KV wake takes 0.025 s for 47 GiB, 0.11 s for 82 and 0.34 s for 124 (H200), while the same
driver calls made by bench/vmm_sweep.py take 0.03-0.05 s for 124 GiB once the released memory has settled. This probe
allocates weights (`--weights-gib` in `--weight-tensors` tensors, tag "weights") and `--chunks` KV tensors of `--size`
GiB in all (tag "kv_cache") through vLLM's CuMemAllocator, then per cycle: sleep (the weights offloaded to the host at
`--level 1`, discarded at 2), wait a settle, wake the weights, wake the KV cache, write the KV (as a rollout does),
timing each. If the settled KV wake here costs what it costs in the engine, the cost is in vLLM's allocation path; if
it costs what vmm_sweep.py's settled mapping costs, it is in the engine's or the step's state. Each wake is also timed
call by call: the pool's module-level `create_and_map` (one cuMemCreate + cuMemMap + cuMemSetAccess per tensor) is
wrapped, so a row holds every tensor's seconds in wake order and the rest of the wake (its gc.collect, empty_cache and
the weights' copies back) as `*_outside_calls_s`. One size per process: vLLM's pool keeps what it mapped until the
process ends. A step's other memory traffic can be put around the wakes: `--neighbour-gib` (another process holding
memory, the trainer's leftover), `--neighbour-cycle-gib` (that process also taking memory after the sleep and giving
it back just before the KV wake, the trainer's onload and offload) and `--release-before-kv-mib` (this process taking
and freeing memory between the wakes, the weight sync's buffers). Needs vLLM and a CUDA GPU (refused otherwise, exit
code 2).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.vmm_sweep import _listed, _repeats, chunk_bytes, give_back, make_driver, take, write  # noqa: E402  (bench/ is not installed)

GIB = 1 << 30


def _settles(text: str) -> list[float]:
    return _listed(text, float, "seconds", lambda v: math.isfinite(v) and v >= 0, "settle must be finite and at least 0")


def _seconds(text: str) -> float:
    return _settles(text)[0]


def _gib(text: str) -> float:
    return _listed(text, float, "GiB", lambda v: math.isfinite(v) and v > 0, "size must be a positive finite GiB")[0]


def _gib_or_zero(text: str) -> float:
    return _listed(text, float, "GiB", lambda v: math.isfinite(v) and v >= 0, "size must be a finite GiB, 0 or more")[0]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="vllm_cumem_probe.py", description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=_gib, required=True, help="GiB of KV cache (one size per process)")
    ap.add_argument("--chunks", type=_repeats, default=28, help="KV tensors (vLLM: one per layer)")
    ap.add_argument("--weights-gib", type=_gib, default=1.1, help="GiB of weights")
    ap.add_argument("--weight-tensors", type=_repeats, default=1,
                    help="equal tensors the weights are split into (an engine holds one per parameter: 311 for Qwen3-0.6B)")
    ap.add_argument("--level", type=int, choices=(1, 2), default=1,
                    help="sleep level: 1 offloads the weights to the host, 2 discards them (an engine whose weights "
                         "the trainer sends again)")
    ap.add_argument("--settles", type=_settles, default=[0.0, 0.5, 2.0], help="seconds between sleep and wake")
    ap.add_argument("--repeats", type=_repeats, default=2)
    ap.add_argument("--raw-repeats", type=int, default=0,
                    help="also map the same KV with the driver calls from Python (bench/vmm_sweep.py's self_settled, "
                         "at the first settle) this many times before the pool exists and again while it sleeps, "
                         "then one more pool cycle: the process's state or vLLM's path?")
    ap.add_argument("--neighbour-gib", type=_gib_or_zero, default=0.0,
                    help="a second process holds this many GiB (one written torch tensor) through the whole probe, as a "
                         "resident trainer does: is the pool's cost about its own mapped GiB or the GPU's?")
    ap.add_argument("--neighbour-cycle-gib", type=_gib_or_zero, default=0.0,
                    help="the neighbour also takes this many GiB after each sleep and gives them back just before the KV "
                         "wake, as the trainer's onload, training and offload do in a colocated step (needs "
                         "--neighbour-gib): does memory another process released just before cost the KV wake?")
    ap.add_argument("--release-before-kv-mib", type=_gib_or_zero, default=0.0,
                    help="between the two wakes this process takes and frees (torch's allocator, then empty_cache) this "
                         "many MiB, as the weight sync's buffers come and go: is the cycle's costly first mapping call "
                         "paid again after any release?")
    ap.add_argument("--give-back-before", choices=("kv", "weights"), default="kv",
                    help="when the neighbour gives its cycle's memory back: just before the KV wake, or just before the "
                         "weights' wake (vime's order: the trainer sleeps at the end of its train phase, before both)")
    ap.add_argument("--neighbour-buffer-mib", type=_gib_or_zero, default=0.0,
                    help="after --kv-delay-s the neighbour takes and gives back this many MiB, as the trainer's weight "
                         "buckets come and go: does another process's allocation take the cost of the first mapping "
                         "after its hand-back off the KV wake?")
    ap.add_argument("--kv-delay-s", type=_seconds, default=0.0,
                    help="seconds between that traffic and the KV wake: is what another process released paid for in "
                         "the background while nothing maps?")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    for flag in ("--neighbour-cycle-gib", "--neighbour-buffer-mib"):
        if getattr(args, flag[2:].replace("-", "_")) and not args.neighbour_gib:
            ap.error(f"{flag} needs --neighbour-gib (the neighbour that takes and gives back the memory)")
    return args


class CallTimer:
    """Wraps a module's `create_and_map` while active: the seconds of each call, in order."""

    def __init__(self, module) -> None:
        self.module = module
        self.calls: list[float] = []

    def __enter__(self) -> CallTimer:
        inner = self.inner = self.module.create_and_map

        def timed(handle):
            t = time.perf_counter()
            inner(handle)
            self.calls.append(time.perf_counter() - t)

        self.module.create_and_map = timed
        return self

    def __exit__(self, *exc) -> None:
        self.module.create_and_map = self.inner

    def take(self) -> list[float]:
        calls, self.calls = self.calls, []
        return calls


def call_split(total_s: float, calls: list[float], prefix: str) -> dict:
    """A wake's seconds per mapped tensor and outside the mapping calls (gc.collect, empty_cache, copies back)."""
    return {f"{prefix}_calls_s": [round(c, 6) for c in calls], f"{prefix}_outside_calls_s": total_s - sum(calls)}


class Neighbour:
    """The other process seen from the probe: `take(gib)` and `give_back()` return once it has done so (seconds)."""

    def __init__(self, conn) -> None:
        self.conn = conn

    def ask(self, *msg) -> float:
        t = time.perf_counter()
        self.conn.send(msg)
        if not self.conn.poll(120) or self.conn.recv() != "ok":
            raise RuntimeError(f"the neighbour did not answer {msg[0]!r} in 120 s")
        return time.perf_counter() - t

    def take(self, gib: float) -> float:
        return self.ask("take", gib)

    def give_back(self) -> float:
        return self.ask("give_back")


def release_in_process(mib: float) -> float:
    """Take `mib` MiB through torch's own allocator, write it and hand it back to the driver (empty_cache): seconds."""
    import torch

    t = time.perf_counter()
    buf = torch.empty(int(mib * (1 << 20)), dtype=torch.uint8, device="cuda")
    buf.fill_(1)
    del buf
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    return time.perf_counter() - t


def cycle(alloc, kv: list, settle_s: float, timer: CallTimer | None = None, level: int = 1,
          neighbour: Neighbour | None = None, cycle_gib: float = 0.0, release_mib: float = 0.0,
          kv_delay_s: float = 0.0, give_back_before: str = "kv", buffer_mib: float = 0.0) -> dict:
    """Sleep, wait, wake weights, wake KV, write the KV: seconds of each (and of each mapping call, with `timer`).

    With `cycle_gib` the neighbour takes that much after the sleep and gives it back just before the KV wake (the
    trainer's onload and offload), or before the weights' wake with `give_back_before="weights"`; with `release_mib`
    this process takes and frees that much between the wakes; `kv_delay_s` waits before the KV wake (a weight sync)."""
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    alloc.sleep(offload_tags=("weights",) if level == 1 else ())
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    row = {"settle_s": settle_s, "sleep_s": t1 - t0}
    if cycle_gib:
        row["neighbour_take_s"] = neighbour.take(cycle_gib)
    time.sleep(settle_s)
    if cycle_gib and give_back_before == "weights":
        row["neighbour_give_back_s"] = neighbour.give_back()
    row["free_before_wake_gib"] = torch.cuda.mem_get_info()[0] / GIB
    t2 = time.perf_counter()
    alloc.wake_up(["weights"])
    torch.cuda.synchronize()
    t3 = time.perf_counter()
    weight_calls = timer.take() if timer else []
    if release_mib:
        row["release_in_process_s"] = release_in_process(release_mib)
    if cycle_gib and give_back_before == "kv":
        row["neighbour_give_back_s"] = neighbour.give_back()
    row["free_before_kv_gib"] = torch.cuda.mem_get_info()[0] / GIB
    if kv_delay_s:
        row["kv_delay_s"] = kv_delay_s
        time.sleep(kv_delay_s)
    if buffer_mib:
        row["neighbour_buffer_s"] = neighbour.take(buffer_mib / 1024) + neighbour.give_back()
    t3k = time.perf_counter()
    alloc.wake_up(["kv_cache"])
    torch.cuda.synchronize()
    t4 = time.perf_counter()
    kv_calls = timer.take() if timer else []
    for t in kv:
        t.fill_(1)
    torch.cuda.synchronize()
    t5 = time.perf_counter()
    row |= {"wake_weights_s": t3 - t2, "wake_kv_s": t4 - t3k, "write_kv_s": t5 - t4}
    if timer:
        row |= call_split(t3 - t2, weight_calls, "wake_weights") | call_split(t4 - t3k, kv_calls, "wake_kv")
    return row


def raw_rows(drv, nbytes: int, chunks: int, settle_s: float, repeats: int, when: str) -> list[dict]:
    """vmm_sweep.py's self_settled in this process: map, write, give back, wait, then the timed map, write, give back."""
    rows = []
    for r in range(repeats):
        held, _ = take(drv, nbytes, chunks)
        write(held, nbytes)
        give_back(drv, held, nbytes)
        time.sleep(settle_s)
        held, t = take(drv, nbytes, chunks)
        row = {"when": when, "repeat": r, "settle_s": settle_s, "map_s": t["total_s"], "create_s": t["create_s"],
               "chunk_s": t["chunk_s"], "write_s": write(held, nbytes)}
        row["give_back_s"] = give_back(drv, held, nbytes)
        rows.append(row)
        print(f"raw {when} r{r}: map {row['map_s']:.4f} s (create {row['create_s']:.4f}), chunks "
              f"{min(row['chunk_s']):.4f}-{max(row['chunk_s']):.4f} s", flush=True)
    return rows


def hold(conn, gib: float) -> None:
    """The neighbour: take `gib` GiB in one written tensor, say so, then serve ("take", GiB) and ("give_back",) (the
    taken memory handed back to the driver) until told to exit or the pipe closes."""
    import torch

    x = torch.empty(int(gib * GIB), dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    conn.send("ready")
    taken = None
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg[0] == "take":
            taken = torch.empty(int(msg[1] * GIB), dtype=torch.uint8, device="cuda")
            taken.fill_(1)
        elif msg[0] == "give_back":
            taken = None
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        else:
            break
        torch.cuda.synchronize()
        conn.send("ok")
    del x, taken


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("{}\n")  # writable before the GPU work starts
    try:
        import torch
        from vllm.device_allocator import cumem
        from vllm.device_allocator.cumem import CuMemAllocator
    except ImportError as e:
        print(f"vllm_cumem_probe.py: needs vLLM and torch ({e}); run it on the lent H200", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("vllm_cumem_probe.py: needs a CUDA GPU (none here); run it on the lent H200", file=sys.stderr)
        return 2
    neighbour = conn = None
    if args.neighbour_gib > 0:
        import multiprocessing as mp

        conn, child = mp.get_context("spawn").Pipe()
        neighbour = mp.get_context("spawn").Process(target=hold, args=(child, args.neighbour_gib), daemon=True)
        neighbour.start()
        if not conn.poll(120) or conn.recv() != "ready":
            print("vllm_cumem_probe.py: the neighbour did not take its memory in 120 s", file=sys.stderr)
            neighbour.kill()
            return 1
    try:
        return probe(args, out, torch, cumem, CuMemAllocator, Neighbour(conn) if conn else None)
    finally:
        if neighbour is not None:
            conn.send(("exit",))
            neighbour.join(30)


def probe(args: argparse.Namespace, out: Path, torch, cumem, CuMemAllocator, neighbour: Neighbour | None) -> int:
    """The probe itself, in this process (after the neighbour, if any, holds its memory)."""
    torch.cuda.init()
    alloc = CuMemAllocator.get_instance()
    per = int(args.size * GIB) // args.chunks
    drv = make_driver(False)[0] if args.raw_repeats else None
    raw_per = chunk_bytes(args.size, args.chunks, drv.granularity) if drv else 0
    raw = raw_rows(drv, raw_per, args.chunks, args.settles[0], args.raw_repeats, "before the pool") if drv else []
    per_weight = int(args.weights_gib * GIB) // args.weight_tensors
    with alloc.use_memory_pool(tag="weights"):
        weights = [torch.ones(per_weight, dtype=torch.uint8, device="cuda") for _ in range(args.weight_tensors)]
    with alloc.use_memory_pool(tag="kv_cache"):
        kv = [torch.zeros(per, dtype=torch.int8, device="cuda") for _ in range(args.chunks)]
    torch.cuda.synchronize()
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "size_gib": args.size,
              "chunks": args.chunks, "weights_gib": args.weights_gib, "weight_tensors": args.weight_tensors,
              "level": args.level, "neighbour_gib": args.neighbour_gib, "neighbour_cycle_gib": args.neighbour_cycle_gib,
              "release_before_kv_mib": args.release_before_kv_mib, "kv_delay_s": args.kv_delay_s,
              "give_back_before": args.give_back_before, "neighbour_buffer_mib": args.neighbour_buffer_mib,
              "argv": sys.argv,
              "free_after_alloc_gib": torch.cuda.mem_get_info()[0] / GIB, "raw": raw, "cycles": []}
    between = dict(neighbour=neighbour, cycle_gib=args.neighbour_cycle_gib, release_mib=args.release_before_kv_mib,
                   kv_delay_s=args.kv_delay_s, give_back_before=args.give_back_before,
                   buffer_mib=args.neighbour_buffer_mib)
    cycle(alloc, kv, 0.5, level=args.level, **between)  # warm: the first sleep pins the host backup
    timer = CallTimer(cumem)
    for r in range(args.repeats):
        for settle in args.settles:
            with timer:
                row = {"repeat": r, **cycle(alloc, kv, settle, timer, args.level, **between)}
            result["cycles"].append(row)
            out.write_text(json.dumps(result, indent=1) + "\n")
            print(f"{args.size:g} GiB x{args.chunks} settle {settle:g} s: sleep {row['sleep_s']:.4f}, wake weights "
                  f"{row['wake_weights_s']:.4f}, wake kv {row['wake_kv_s']:.4f}, write kv {row['write_kv_s']:.4f} s, "
                  f"free before {row['free_before_wake_gib']:.1f} / {row['free_before_kv_gib']:.1f} GiB; kv outside the "
                  f"calls {row['wake_kv_outside_calls_s']:.4f} s, first calls weights {row['wake_weights_calls_s'][0]:.4f} "
                  f"kv {row['wake_kv_calls_s'][0]:.4f}, kv calls {min(row['wake_kv_calls_s']):.4f}-"
                  f"{max(row['wake_kv_calls_s']):.4f} s", flush=True)
    if drv:
        alloc.sleep(offload_tags=("weights",) if args.level == 1 else ())
        raw += raw_rows(drv, raw_per, args.chunks, args.settles[0], args.raw_repeats, "while the pool sleeps")
        alloc.wake_up()
        with timer:
            row = {"repeat": "after raw", **cycle(alloc, kv, args.settles[0], timer, args.level, **between)}
        result["cycles"].append(row)
        out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"pool after the raw rows: wake kv {row['wake_kv_s']:.4f} s", flush=True)
    del weights, kv
    return 0


if __name__ == "__main__":
    sys.exit(main())
