"""Time vime's real trainer through its protocol calls, as a run makes them: Megatron-core actors on Ray (gloo on a CPU), the disk weight export (issue 26).

    python bench/trainer_calls.py --out trainer.json [--hf-checkpoint DIR] [--shapes 2x8x8x16:8,...] [--reps 5]

What a `vime train --backend real` run's trainer does, measured call by call with the session's own
launch (`vime.real.session._start_trainer`: the same ActorConfig, placement and CPU share):

- ``ping``: a Ray round trip to the rank that does nothing (``offload_info``);
- ``sleep`` / ``wake_up``: the offload calls (seed steps 37, 41; on a CPU the accounted no-op);
- ``train``: one rollout's training at each shape ``PxGxPROMPTxRESPONSE:MBS`` (P prompts × G samples,
  fixed prompt and response lengths, MBS samples per micro-batch): the time of the call as the
  orchestrator sees it, and the rank's own ``train_time``;
- ``export``: `vime.real.weights.disk.DiskSyncTrainer.export_weights` — the rank hands the HF-named
  tensors over Ray (``handover_s``) and they are written as ``v<N>/`` (``write_s``: safetensors, index,
  the checkpoint's files, rename, prune);
- ``write_rate``: `vime.real.weights.disk.write_version` of synthetic float32 tensors of several sizes
  (no Ray), for the bytes-per-second part of a write, and the time to load those files back (the read
  part of an engine's in-place reload, from the page cache).

The model is the tiny Qwen3 vime's CPU runs use (`vime.testing.tiny_model`), built in --work unless
--hf-checkpoint names one. The first call of each kind is a warm-up and not recorded. JSON goes to
--out after every part (a crash keeps what was measured).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: Shapes PxGxPROMPTxRESPONSE:MBS. The CPU run of tests/real/test_e2e_cpu.py trains 4x8x8x16:8; it is
#: left out on purpose so that the profile predicts it rather than reproducing it.
DEFAULT_SHAPES = "1x8x8x16:8,2x8x8x16:8,8x8x8x16:8,4x8x8x32:8,4x8x32x32:8,4x8x8x16:16,4x8x8x16:4"


def parse_shape(text: str) -> dict:
    dims, _, mbs = text.partition(":")
    p, g, prompt, response = (int(x) for x in dims.split("x"))
    return {"prompts": p, "group": g, "prompt_len": prompt, "response_len": response, "micro_batch_size": int(mbs or 8)}


def synthetic_batch(rollout_id: int, shape: dict, vocab: int, seed: int = 0):
    """A GRPO batch of the shape: random prompt and response ids, rewards that differ inside each group."""
    from vime.algo.advantages import normalize_group_rewards
    from vime.algo.dp_schedule import build_dp_schedule
    from vime.types import TrainBatch

    rng = random.Random(seed * 1000 + rollout_id)
    tokens, resp, masks, raw, groups, idx, lps = [], [], [], [], [], [], []
    for g in range(shape["prompts"]):
        prompt = [rng.randrange(8, vocab) for _ in range(shape["prompt_len"])]
        for _ in range(shape["group"]):
            n = shape["response_len"]
            tokens.append(prompt + [rng.randrange(8, vocab) for _ in range(n)])
            resp.append(n)
            masks.append([1] * n)
            raw.append(rng.random())
            groups.append(g)
            idx.append(len(idx))
            lps.append([-rng.expovariate(2.0) for _ in range(n)])
    raw_r, norm = normalize_group_rewards(raw, groups)
    total = [len(t) for t in tokens]
    schedule = build_dp_schedule(total, dp_size=1, micro_batch_size=shape["micro_batch_size"],
                                 global_batch_size=len(tokens))
    return TrainBatch(rollout_id=rollout_id, tokens=tokens, response_lengths=resp, loss_masks=masks, raw_rewards=raw_r,
                      rewards=norm, total_lengths=total, sample_indices=idx, group_indices=groups, schedule=schedule,
                      rollout_log_probs=lps, recompute_log_probs=False)


def summary(xs: list[float]) -> dict:
    if not xs:
        return {}
    return {"n": len(xs), "min": min(xs), "median": statistics.median(xs), "mean": statistics.fmean(xs),
            "max": max(xs), "stdev": statistics.stdev(xs) if len(xs) > 1 else 0.0}


def loadavg() -> list[float]:
    try:
        return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]
    except OSError:
        return []


async def measure(a: argparse.Namespace, res: dict, dump) -> None:
    from vime.config import parse_args
    from vime.real.session import _start_trainer
    from vime.real.weights.disk import DiskSyncTrainer, _tensor_buckets, write_version

    work = Path(a.work)
    work.mkdir(parents=True, exist_ok=True)
    model = a.hf_checkpoint
    if not model:
        from vime.testing.tiny_model import TinyModelSpec, build_tiny_qwen3

        model = str(build_tiny_qwen3(work / "tiny", TinyModelSpec(seed=0)))
    res["hf_checkpoint"] = model
    res["hf_config"] = json.loads((Path(model) / "config.json").read_text())  # the fit needs the model's shape
    vocab = res["hf_config"]["vocab_size"]
    flags = ["--backend", "real", "--hf-checkpoint", model, "--update-weight-mode", "disk",
             "--actor-num-gpus-per-node", "1", "--tensor-model-parallel-size", "1",
             "--rollout-num-gpus-per-engine", "1", "--no-use-distributed-optimizer", "--lr", "5e-2", "--seed", "1",
             *a.vime_flags.split()]
    args = parse_args(["train", *flags])
    res["vime_flags"] = flags
    t = time.perf_counter()
    trainer = await asyncio.to_thread(_start_trainer, args)
    res["launch_s"] = time.perf_counter() - t
    disk = DiskSyncTrainer(trainer, work / "weights", template=model, keep=2)
    reps = a.reps

    async def timed(coro_fn) -> float:
        t0 = time.perf_counter()
        await coro_fn()
        return time.perf_counter() - t0

    try:
        # --- the Ray round trip, sleep and wake --------------------------------------------------
        ping = [await timed(lambda: trainer.call("offload_info")) for _ in range(reps + 1)][1:]
        res["ping_s"] = ping
        sleeps, wakes = [], []
        for _ in range(reps + 1):
            sleeps.append(await timed(trainer.sleep))
            wakes.append(await timed(trainer.wake_up))
        res["sleep_s"], res["wake_s"] = sleeps[1:], wakes[1:]
        dump()
        # --- train at each shape (awake around it, as the orchestrator's train phase) ------------
        rows = []
        rid = 0
        for text in a.shapes.split(","):
            shape = parse_shape(text)
            walls, inner = [], []
            for rep in range(reps + 1):
                batch = synthetic_batch(rid, shape, vocab)
                rid += 1
                t0 = time.perf_counter()
                metrics = await trainer.train(rid, batch)
                wall = time.perf_counter() - t0
                if rep:  # the first of each shape warms up (new tensor shapes)
                    walls.append(wall)
                    inner.append(float(metrics.extra.get("train_time", 0.0)))
            part = batch.for_rank(0)
            lengths = [[part.total_lengths[i] for i in mb] for mb in part.micro_batches(0)]
            rows.append({"shape": text, **shape, "samples": shape["prompts"] * shape["group"],
                         "micro_batch_lengths": lengths,
                         "tokens": shape["prompts"] * shape["group"] * (shape["prompt_len"] + shape["response_len"]),
                         "num_microbatches": list(batch.num_microbatches), "wall_s": walls, "rank_train_s": inner,
                         "median_s": statistics.median(walls)})
            print(f"train {text}: {statistics.median(walls) * 1e3:.1f} ms (rank {statistics.median(inner) * 1e3:.1f} ms)",
                  flush=True)
            res["train"] = rows
            dump()
        # --- disk export: handover over Ray, then the write ---------------------------------------
        handover, writes, totals = [], [], []
        version = 1
        for rep in range(reps + 1):
            t0 = time.perf_counter()
            shards = [dict(b.tensors or {}) async for b in _tensor_buckets(trainer, 1 << 30)]
            t1 = time.perf_counter()
            await asyncio.to_thread(write_version, disk.root, version, shards, template=model)
            t2 = time.perf_counter()
            version += 1
            total = await timed(lambda: _consume(disk))
            if rep:
                handover.append(t1 - t0)
                writes.append(t2 - t1)
                totals.append(total)
        nbytes = sum(t.numel() * t.element_size() for s in shards for t in s.values())
        res["export"] = {"bytes": nbytes, "tensors": sum(len(s) for s in shards), "handover_s": handover,
                         "write_s": writes, "export_weights_s": totals}
        dump()
        # --- the write rate of larger versions (no Ray) -------------------------------------------
        import torch

        rate_rows = []
        warm = {"w": torch.randn(1 << 16)}
        for rep in range(2):  # the first write and read of the process pay imports and first-touch costs
            path, _ = await asyncio.to_thread(write_version, work / "rate", 99 + rep, [warm], template=model)
            for f in sorted(path.glob("*.safetensors")):
                await asyncio.to_thread(_read_all, f)
        for mib in (4, 32, 128):
            n = mib * (1 << 20) // 4
            shard = {f"model.layers.{i}.w": torch.randn(n // 8) for i in range(8)}
            secs, reads = [], []
            for rep in range(max(3, reps // 2) + 1):
                t0 = time.perf_counter()
                path, _ = await asyncio.to_thread(write_version, work / "rate", rep, [shard], template=model)
                t1 = time.perf_counter()
                for f in sorted(path.glob("*.safetensors")):  # what an in-place reload reads (page cache)
                    await asyncio.to_thread(_read_all, f)
                if rep:
                    secs.append(t1 - t0)
                    reads.append(time.perf_counter() - t1)
            rate_rows.append({"bytes": n * 4, "write_s": secs, "median_s": statistics.median(secs), "read_s": reads,
                              "read_median_s": statistics.median(reads)})
        res["write_rate"] = rate_rows
        dump()
    finally:
        trainer.shutdown()


def _read_all(path: Path) -> None:
    """Load every tensor of a safetensors file into memory (a reload's read)."""
    from safetensors.torch import load_file

    for t in load_file(str(path)).values():
        t.sum()


async def _consume(disk) -> None:
    async for _ in disk.export_weights(1 << 30):
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                 epilog=__doc__)
    ap.add_argument("--out", required=True)
    ap.add_argument("--hf-checkpoint", default=None, help="an HF model directory (default: build vime's tiny Qwen3)")
    ap.add_argument("--work", default="/tmp/vime-trainer-calls")
    ap.add_argument("--shapes", default=DEFAULT_SHAPES, help="comma-separated PxGxPROMPTxRESPONSE:MBS")
    ap.add_argument("--reps", type=int, default=5, help="recorded calls per kind (after one warm-up)")
    ap.add_argument("--vime-flags", default="", help="more `vime train` flags for the trainer's configuration")
    a = ap.parse_args(argv)
    res: dict = {"bench": "trainer_calls", "argv": sys.argv, "host": platform.node(), "cpu_count": os.cpu_count(),
                 "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "loadavg_before": loadavg()}
    out = Path(a.out)

    def dump() -> None:
        out.write_text(json.dumps(res, indent=1, default=str))

    try:
        import torch

        res["torch"] = torch.__version__
        res["device"] = "cuda" if torch.cuda.is_available() else "cpu"
        asyncio.run(measure(a, res, dump))
    finally:
        res["loadavg_after"] = loadavg()
        dump()
    return 0


if __name__ == "__main__":
    sys.exit(main())
