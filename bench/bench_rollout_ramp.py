"""When a rollout's requests reach the server: vime's Rollout, its client and vllm-router against a stub vLLM.

On the H200 the requests of every rollout reached vLLM 2.5–4.8 s after the rollout started
(bench/data/h200_notes.md, "Where the rollout's time goes"). This bench runs the same path on
this machine without a GPU: `vime.rollout.generate.Rollout` (the seed's 32 prompts × 8 samples,
1024-token responses) → `VLLMRouterClient` → the real vllm-router (when installed; else straight
to the server) → a stub server in its own process that stamps each generate's arrival, holds
every answer until all have arrived (the engine finishes them together), then answers.

Run: python bench/bench_rollout_ramp.py [--rounds 3] [--no-router] [--out FILE.json]
Prints per round: the first and last request sent (the client's stamps), the first and last
arrival at the server, the first and last response back, all from the rollout's start, and a
request's mean time from its send to its answer.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "tests" / "real")]
TOKENS = 1024


def _stub(expect: int, stamps: Path) -> None:
    """The stub server's process: stamps each generate's arrival, answers a round's generates once all `expect`
    of them are in (the engine finishes them together), every other call at once; prints its port."""
    from fake_vllm import generate_response
    from http_stub import serve_fixed

    body = json.dumps(generate_response(list(range(100, 100 + TOKENS)), version="1")).encode()
    arrivals: list[float] = []
    rounds = [asyncio.Event()]  # a round's answers wait for its last request

    async def hold(request_line: bytes) -> bool:
        if b"/generate" not in request_line:
            return False
        arrivals.append(time.time())
        mine = rounds[-1]
        if len(arrivals) == expect:
            stamps.write_text(json.dumps(arrivals))
            arrivals.clear()
            rounds.append(asyncio.Event())
            mine.set()
        await mine.wait()
        return True

    async def main() -> None:
        _, port = await serve_fixed(body, hold=hold, backlog=4096)
        print(port, flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def _args(prompts: Path):
    from vime.config import parse_args

    return parse_args(["--prompt-data", str(prompts), "--rollout-batch-size", "32", "--n-samples-per-prompt", "8",
                       "--rollout-max-response-len", str(TOKENS), "--rollout-max-prompt-len", "512",
                       "--custom-rm-path", "vime.rollout.toy_task.target_fraction_reward", "--json"], command="train")


async def _rounds(url: str, router_url: str | None, prompts: Path, stamps: Path, rounds: int) -> list[dict]:
    from vime.real.vllm.client import VLLMEngine
    from vime.real.vllm.router import VLLMRouterClient
    from vime.rollout.data_source import DataSource
    from vime.runs.loop import build_rollout

    args = _args(prompts)
    engine = VLLMEngine("engine0", url, model="/m", max_concurrency=int(args.vllm_server_concurrency), detokenize=False)
    router = VLLMRouterClient(router_url, [engine], model="/m",
                              max_concurrency=int(args.vllm_server_concurrency)) if router_url else engine
    rollout = build_rollout(args, router, num_engines=1, progress=False)
    source = DataSource.from_config(args.data, args.rollout, seed=args.seed)
    out = []
    for r in range(rounds):
        stamps.unlink(missing_ok=True)
        wall0, t0 = time.time(), asyncio.get_running_loop().time()
        res = await rollout.generate_rollout(r, source)
        took = asyncio.get_running_loop().time() - t0
        arrivals = sorted(json.loads(stamps.read_text()))
        st = res.stats
        out.append({"round": r, "samples": len(res.samples), "rollout_s": took,
                    "first_request_s": st.first_request_s, "last_request_s": st.last_request_s,
                    "request_time_mean_s": st.request_time_s / max(st.answered_requests, 1), "first_arrival_s": arrivals[0] - wall0,
                    "last_arrival_s": arrivals[-1] - wall0, "first_response_s": st.first_response_s,
                    "last_response_s": st.last_response_s})
    await engine.aclose()
    if router is not engine:
        await router.aclose()
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--stub"]:  # the server's own process
        _stub(int(argv[1]), Path(argv[2]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-router", action="store_true", help="the client straight to the stub")
    ap.add_argument("--out", type=Path, help="write the rounds as JSON here")
    a = ap.parse_args(argv)
    from vime.real.vllm.launcher import Launcher
    from vime.real.vllm.router import RouterSpec, start_router
    from vime.rollout.toy_task import ToyTask, write_prompts

    work = Path(tempfile.mkdtemp(prefix="vime-ramp-"))
    prompts = write_prompts(work / "toy.jsonl", ToyTask(vocab_size=151936, num_prompts=256, prompt_len=128, seed=1))
    stamps = work / "arrivals.json"
    stub = subprocess.Popen([sys.executable, __file__, "--stub", "256", str(stamps)], stdout=subprocess.PIPE, text=True)
    try:
        assert stub.stdout is not None
        url = f"http://127.0.0.1:{stub.stdout.readline().strip()}"
        use_router = not a.no_router and shutil.which("vllm-router") is not None
        with Launcher(work / "logs") as launcher:
            router_url = start_router(launcher, RouterSpec((url,), "round_robin"))[1].url if use_router else None
            rows = asyncio.run(_rounds(url, router_url, prompts, stamps, a.rounds))
    finally:
        stub.kill()
        stub.wait()
        shutil.rmtree(work, ignore_errors=True)
    print(f"path: client -> {'vllm-router -> ' if router_url else ''}stub server ({os.cpu_count()} CPUs)")
    print("round  first sent  last sent  first in  last in  first back  last back  request mean"
          "  (s from the rollout's start)")
    for r in rows:
        print(f"{r['round']:5d}  {r['first_request_s']:10.3f}  {r['last_request_s']:9.3f}  {r['first_arrival_s']:8.3f}"
              f"  {r['last_arrival_s']:7.3f}  {r['first_response_s']:10.3f}  {r['last_response_s']:9.3f}"
              f"  {r['request_time_mean_s']:12.3f}")
    if a.out:
        a.out.write_text(json.dumps({"router": bool(router_url), "cpus": os.cpu_count(), "rounds": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
