"""End-to-end timing of the colocated CUDA-IPC export on one GPU: host backup → staging buffer → handles → a spawned "engine" process opens them and copies into its own weights.

Run on a GPU: python3 bench/ipc_export.py --gib 4 --bucket-mib 512 --out ipc_export.json
Per bucket: stage (host → device copy of the bucket + sync), handles (reduce_tensor per tensor),
engine (the receiver rebuilds every tensor with its own device index, copies it into a preallocated
destination as vLLM's load_weights does, syncs and replies: the acknowledgement). Checksums of the
receiver's copies are compared with the staged bytes.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from vime.real.weights import ipc as iw

MIB = 1 << 20


def _checksum(t: torch.Tensor) -> int:
    return int(t.reshape(-1).view(torch.uint8).to(torch.int64).sum())


def _engine(inbox, outbox) -> None:
    """The receiver: one destination tensor per name (its 'weights'), filled from each bucket's handles."""
    try:
        uuid = iw.device_uuid(0)
        dest: dict[str, torch.Tensor] = {}
        while True:
            msg = inbox.get()
            if msg is None:
                return
            t0 = time.perf_counter()
            sums = {}
            for name, dt, shape, handles in zip(msg["names"], msg["dtype_names"], msg["shapes"], msg["ipc_handles"],
                                                strict=True):
                src = iw.open_handle(handles[uuid], 0)
                if name not in dest:
                    dest[name] = torch.empty(shape, dtype=iw.dtype_of(dt), device="cuda")
                dest[name].copy_(src)
                del src
            torch.cuda.synchronize()
            elapsed = time.perf_counter() - t0
            for name in msg["names"]:
                sums[name] = _checksum(dest[name])
            outbox.put({"engine_s": elapsed, "sums": sums})
    except BaseException as exc:
        outbox.put({"error": repr(exc)})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--bucket-mib", type=int, default=512)
    ap.add_argument("--tensor-mib", type=int, default=96)
    ap.add_argument("--out", default="ipc_export.json")
    args = ap.parse_args()

    n_tensors = int(args.gib * 1024 // args.tensor_mib)
    elems = args.tensor_mib * MIB // 2
    t0 = time.perf_counter()
    state = {f"model.layers.{i}.w": torch.full((elems,), float(i % 97) / 7, dtype=torch.bfloat16)
             for i in range(n_tensors)}
    build_s = time.perf_counter() - t0

    ctx = torch.multiprocessing.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_engine, args=(inbox, outbox), daemon=True)
    proc.start()
    res: dict = {"gib": args.gib, "bucket_mib": args.bucket_mib, "tensors": n_tensors, "host_build_s": build_s,
                 "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "steps": []}
    ex = iw.IpcExporter(torch.device("cuda", 0))
    try:
        for step in range(3):
            rows = []
            t_step = time.perf_counter()
            plan = ex.begin(state, args.bucket_mib * MIB)
            prev = None
            ok = True
            for layout in plan:
                t1 = time.perf_counter()
                views = ex.staging.pack(layout, state)  # what stage() does, timed apart from the handles
                t2 = time.perf_counter()
                uuid, handles = iw.device_uuid(ex.device), [iw.tensor_handle(v) for v in views.values()]
                ex.outstanding = layout.index
                bucket = iw.fill_bucket(layout, [(uuid, handles)])
                t3 = time.perf_counter()
                want = {n: _checksum(v) for n, v in views.items()}
                msg = bucket.update_info()
                msg["ipc_handles"] = bucket.ipc_handles
                t4 = time.perf_counter()
                inbox.put(msg)
                reply = outbox.get(timeout=120)
                t5 = time.perf_counter()
                if "error" in reply:
                    raise RuntimeError(reply["error"])
                ok &= reply["sums"] == want
                rows.append({"bytes": layout.nbytes, "stage_s": t2 - t1, "handles_s": t3 - t2,
                             "roundtrip_s": t5 - t4, "engine_s": reply["engine_s"]})
                prev = layout.index
            ex.end(prev)
            total = time.perf_counter() - t_step
            nbytes = sum(r["bytes"] for r in rows)
            summary = {"step": step, "buckets": len(rows), "bytes": nbytes, "exact": ok, "total_s": total,
                       "stage_GBps": nbytes / sum(r["stage_s"] for r in rows) / 1e9,
                       "handles_ms_per_bucket": 1e3 * sum(r["handles_s"] for r in rows) / len(rows),
                       "engine_GBps": nbytes / sum(r["engine_s"] for r in rows) / 1e9,
                       "roundtrip_ms_per_bucket": 1e3 * sum(r["roundtrip_s"] for r in rows) / len(rows),
                       "end_to_end_GBps": nbytes / total / 1e9,
                       "staging_allocations": ex.staging.allocations, "rows": rows}
            res["steps"].append(summary)
            print(json.dumps({k: v for k, v in summary.items() if k != "rows"}), flush=True)
    finally:
        inbox.put(None)
        proc.join(60)
        with open(args.out, "w") as fh:
            json.dump(res, fh, indent=1)


if __name__ == "__main__":
    main()
