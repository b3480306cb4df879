"""The simulator against published whole RL steps (issue 17): predict each reference, then compare with its figures.

    python bench/published.py predict            # writes bench/data/published/<id>/predicted.json
    python bench/published.py compare [--json]   # measured vs predicted per reported metric
    python bench/published.py predict --after NAME [IDS]   # after a model fix: predicted.NAME.json
    python bench/published.py compare --after NAME         # the pre-registered and the later prediction
    python bench/published.py implied [IDS]  # where the mean response is not stated: the mean each figure implies

A later prediction (`--after`) is made with the figures known: the references whose figures the fix
was derived from count as fitted from then on, the others stay held out; `compare --after` prints both.
It also applies `REVISIONS`: inputs a plan got wrong or could not express when it was written, each
with its reason, and `MAP_REVISIONS`: a source's metric that a plan mapped to the wrong simulated
quantity. None is a value taken from a reference's figures; one reading rests partly on a page's
arithmetic (`_nemo_generated`), and the figure it used (NeMo-RL's Tokens/sec/GPU) stops counting as
held out from then on.

`implied`: where a source does not state the mean response (the DAPO-Math rows), no prediction of a
phase's time can be tested; what can be is whether the model is consistent. For each reported figure
it finds the mean response at which the simulation gives that figure (the response distribution's
shape kept); a model right about the step finds one mean for every phase of a reference.

Pre-registration: `PLANS` below turns each reference's `reference.json` (configuration only) into
`vime simulate` flags and says which simulated quantity stands for each metric the source reports.
It was written and its predictions committed before any `measured.json` was read; the commit order
is in `git log -- bench/data/published`. Assumptions are rules applied to every reference alike
(e.g. one response-length guess for all DAPO-Math runs of Qwen2.5-Math-7B), never a constant per
reference. References vime cannot express (MoE, async pipelines, critic/reward models, hybrid
attention) have no plan and are listed as such.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DATA = ROOT / "bench" / "data" / "published"

#: Steps simulated per reference; the last one is the prediction (the first carries no start-up,
#: but its KV/weights state differs from a steady step's only in the first onload).
STEPS = 2


def _lognormal(median: float, sigma: float) -> str:
    return f"lognormal:{math.log(median):.4f},{sigma}"


def _mean_response(mean: float, sigma: float = 0.6) -> str:
    """Lognormal with this mean before clipping (mean = exp(mu + sigma^2/2))."""
    return f"lognormal:{math.log(mean) - sigma * sigma / 2:.4f},{sigma}"


# --- shared assumptions (rules, applied to every reference they fit) ------------------------------
#: DAPO-Math-17k with Qwen2.5-Math-7B: no source states the mean response; a run mean of a few
#: thousand tokens is typical of those runs' length curves. One guess for all of them.
DAPO_MATH_7B_RESPONSE = _lognormal(3000, 0.8)
#: OpenMathInstruct-2 prompts are short problems; the plans read NeMo-RL's "G-Average Seq len" as prompt + response
#: (revised: `_nemo_generated`).
NEMO_PROMPT = 150
#: verl's Ulysses sequence parallelism of degree k splits each layer's work over k GPUs as Megatron's
#: TP k does; vime has no FSDP/Ulysses backend, so FSDP2 + SP k is expressed as Megatron TP k with
#: the distributed optimizer (parameters and optimizer sharded over the rest).


def _nemo(mean_seq: float) -> list[str]:
    resp = mean_seq - NEMO_PROMPT
    return ["--rollout-batch-size", "64", "--n-samples-per-prompt", "32", "--global-batch-size", "512",
            "--rollout-max-prompt-len", str(2 * NEMO_PROMPT), "--rollout-max-response-len", str(4096 - 2 * NEMO_PROMPT),
            "--prompt-length", f"fixed:{NEMO_PROMPT}", "--response-length", _mean_response(resp),
            "--micro-batch-size", "1", "--gpu-memory-utilization", "0.6",
            "--use-kl-loss", "--kl-loss-coef", "0.01", "--use-tis"]


def _verl_7b(nodes: int, *, tp: int, engine_tp: int, n: int, gbs: int, response: int, pp: int = 1,
             extra: tuple[str, ...] = ()) -> list[str]:
    """The H20 runs of Qwen2.5-Math-7B (DAPO) that verl's docs report: 8 GPUs a node, prompts <= 2048."""
    return ["--hardware", "H20", "--model", "Qwen2.5-7B", "--actor-num-nodes", str(nodes),
            "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", str(tp),
            *(["--pipeline-model-parallel-size", str(pp)] if pp > 1 else []),
            "--rollout-num-gpus-per-engine", str(engine_tp), "--rollout-batch-size", "512",
            "--n-samples-per-prompt", str(n), "--global-batch-size", str(gbs), "--rollout-max-prompt-len", "2048",
            "--rollout-max-response-len", str(response), "--rollout-max-context-len", str(2048 + response),
            "--response-length", DAPO_MATH_7B_RESPONSE, "--gpu-memory-utilization", "0.8", *extra,
            "--recompute-granularity", "full", "--micro-batch-size", "2"]


def _nemo_moe(mean_seq: float, *, prompts: int, max_len: int, gbs: int) -> list[str]:
    """The NeMo-RL v0.4 MoE rows (issue 21): the same rules as `_nemo` for their batch and length caps."""
    resp = mean_seq - NEMO_PROMPT
    return ["--rollout-batch-size", str(prompts), "--n-samples-per-prompt", "32", "--global-batch-size", str(gbs),
            "--rollout-max-prompt-len", str(2 * NEMO_PROMPT), "--rollout-max-response-len",
            str(max_len - 2 * NEMO_PROMPT), "--rollout-max-context-len", str(max_len),
            "--prompt-length", f"fixed:{NEMO_PROMPT}", "--response-length", _mean_response(resp),
            "--micro-batch-size", "1", "--gpu-memory-utilization", "0.6",
            "--use-kl-loss", "--kl-loss-coef", "0.01", "--use-tis"]


def _nemo_moe_layout(hardware: str, model: str, *, nodes: int, per_node: int, tp: int, ep: int, engine_tp: int,
                     cp: int = 1, pp: int = 1, recompute: bool = False) -> list[str]:
    """A NeMo-RL MoE row's hardware, model and parallel layout (the table's Generation and Training columns)."""
    return ["--hardware", hardware, "--model", model, "--actor-num-nodes", str(nodes),
            "--actor-num-gpus-per-node", str(per_node), "--tensor-model-parallel-size", str(tp),
            *(["--context-parallel-size", str(cp)] if cp > 1 else []),
            *(["--pipeline-model-parallel-size", str(pp)] if pp > 1 else []),
            "--expert-model-parallel-size", str(ep), "--rollout-num-gpus-per-engine", str(engine_tp),
            *(["--recompute-granularity", "full"] if recompute else [])]


NEMO_MAP = {"Total Step time(s)": ["t_step"], "Tokens / sec / GPU": ["tokens_per_s_per_gpu"]}
#: Inputs revised after the pre-registration, applied by `predict --after` (appended to the plan's words):
#: what changed and why. No value is read off a reference's figures (`_nemo_generated` says what it used).
_DAPO_PROMPT = (("--prompt-length", "uniform:100,300"),
                "the plan gave no prompt length, so the default drew uniform lengths up to --rollout-max-prompt-len "
                "(2048: mean ~1150 tokens); DAPO-Math-17k's prompts are one competition problem in a short instruction "
                "template: 100-300 tokens (an estimate from the dataset's format)")
_EAGER = (("--enforce-eager",), "the source's vLLM ran with enforce_eager true (the plan's note); vime could not "
                                "express it before --enforce-eager")
_SERIAL = (("--no-async-scheduling",), "the source's vLLM (<= 0.9.1 or <= 0.8.5 by verl's setup.py at its commit, recorded in "
                                       "the doc's reference.json before its figures were read) predates async scheduling "
                                       "(vLLM 0.10): its CPU step ran after its GPU step; vime could not express it "
                                       "before --no-async-scheduling")
_NEMO_SERIAL = (("--no-async-scheduling",), "NeMo-RL pins vLLM 0.10.0 (v0.4) and 0.11.2 (v0.5) in its pyproject.toml at the release "
                                             "tags, and its recipes set no async_scheduling: vLLM's SchedulerConfig defaulted it to "
                                             "False until after 0.11 (on by default only later, vllm-project/vllm#27614), so its CPU "
                                             "step ran after its GPU step")


def _capped_mean_response(mean: float, cap: int, sigma: float = 0.6) -> str:
    """Lognormal whose draws, cut at `cap` as the engine cuts them, average `mean` (bisection on mu)."""
    from vime.sim.lengths import make_distribution

    lo, hi = math.log(mean) - 4 * sigma, math.log(cap) + 8 * sigma
    for _ in range(60):
        mu = (lo + hi) / 2
        lo, hi = (mu, hi) if make_distribution(f"lognormal:{mu},{sigma}").mean(cap) < mean else (lo, mu)
    return f"lognormal:{(lo + hi) / 2:.4f},{sigma}"

_NEMO_BF16_GRADS = (("--grad-reduce-in-bf16",), "NeMo-RL's grpo_math_1B.yaml (v0.4.0 and v0.5.0), which every performance "
                                                "recipe extends, sets distributed_data_parallel_config.grad_reduce_in_fp32: "
                                                "false: Megatron keeps and reduces the grads in bf16, half the plan's fp32")

_NEMO_REF_HOST = (("--ref-placement", "host"), "NeMo-RL's Megatron worker keeps the reference's state dict in host memory "
                                              "and swaps it into the model for the reference log-probs (use_reference_model, "
                                              "megatron_policy_worker.py at v0.5.0), so no second copy sits on the GPU; vime "
                                              "could not express it before --ref-placement host. NeMo copies three times "
                                              "(policy out, reference in, policy back, pageable), vime once, pinned: the "
                                              "reference's time here is a lower bound")


def _nemo_generated(mean_gen: float, cap: int = 4096 - 2 * NEMO_PROMPT) -> tuple[tuple[str, ...], str]:
    """NeMo-RL's "G-Average Seq len" is the mean *generated* length (capped as generated), not prompt + response."""
    return (("--response-length", _capped_mean_response(mean_gen, cap)),
            f"the plan read \"G-Average Seq len\" {mean_gen:g} as prompt + response ({NEMO_PROMPT} + {mean_gen - NEMO_PROMPT:g}); "
            "NeMo-RL logs the generation's mean as mean_gen_tokens_per_sample (assistant tokens only, "
            "nemo_rl/experience/rollouts.py) and the page's G- columns are generation-related. The page's own "
            "arithmetic agrees on every OpenMathInstruct-2 row of v0.4 and v0.5 (these and the rows vime cannot "
            "express): Tokens/sec/GPU x GPUs x step / samples exceeds the column by 98-136 tokens, an additive "
            "amount (the prompt), where prompt + response would leave nothing. The prompt stays the plan's 150. "
            f"And it is the mean of what was generated, cut at the cap ({cap}): the plan's lognormal had that mean "
            "before the cut, which took up to 18 % off the rows near the cap")


#: NeMo-RL's Tokens/sec/GPU counts total_num_tokens, the sum of the samples' input lengths (prompt + response,
#: nemo_rl/algorithms/grpo.py and utils.py); the plan mapped it to vime's trained (response) tokens.
MAP_REVISIONS: dict[str, tuple[dict[str, list[str]], str]] = {}
_NEMO_TOKENS = ({"Tokens / sec / GPU": ["sequence_tokens_per_s_per_gpu"]},
                "NeMo-RL divides total_num_tokens (every sample's prompt + response, its input_lengths) by the step "
                "time and the GPUs; the plan divided the trained response tokens")
_SLIME_REF_HOST = (("--ref-placement", "host"), "upstream vime's actor (slime's) keeps the reference in its pinned host weight "
                                               "backup and restores it into the model for the reference log-probs, then the "
                                               "actor's weights back (_switch_model; reference.json: 'ref weights swapped in "
                                               "on the trainer'); vime could not express it before --ref-placement host, "
                                               "which copies once where slime copies twice")
REVISIONS: dict[str, list[tuple[tuple[str, ...], str]]] = {
    "vime-442-1xl20-qwen3-0.6b-colocate-offload": [_SLIME_REF_HOST],
    "vime-442-1xl20-qwen3-0.6b-colocate-no-offload-train": [_SLIME_REF_HOST],
    "vime-244-h800x8-qwen3-4b-disaggregated-4t4r": [_SLIME_REF_HOST],
    "nemorl-v0.5-llama3.1-8b-16xh100-onpolicy": [_NEMO_SERIAL, _nemo_generated(1019), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.5-llama3.1-8b-8xgb200-onpolicy": [_NEMO_SERIAL, _nemo_generated(1066), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.5-qwen3-32b-16xgb200-onpolicy": [_NEMO_SERIAL, _nemo_generated(3253), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.5-qwen3-32b-32xh100-onpolicy": [_NEMO_SERIAL, _nemo_generated(3251), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.4-qwen3-30b-a3b-32xh100-onpolicy": [_NEMO_SERIAL, _nemo_generated(3154), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.4-qwen3-235b-a22b-128xh100-onpolicy": [_NEMO_SERIAL, _nemo_generated(5671, 8192 - 2 * NEMO_PROMPT), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.5-qwen3-30b-a3b-32xh100-onpolicy": [_NEMO_SERIAL, _nemo_generated(3196), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.5-qwen3-30b-a3b-16xgb200-onpolicy": [_NEMO_SERIAL, _nemo_generated(3198), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.5-qwen3-235b-a22b-128xh100-onpolicy": [_NEMO_SERIAL, _nemo_generated(5700, 8192 - 2 * NEMO_PROMPT), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "nemorl-v0.5-qwen3-235b-a22b-64xgb200-onpolicy": [_NEMO_SERIAL, _nemo_generated(5711, 8192 - 2 * NEMO_PROMPT), _NEMO_BF16_GRADS, _NEMO_REF_HOST],
    "verl-fullyasync-colocate-fsdp2-32xh20-qwen2.5-math-7b": [_DAPO_PROMPT, _SERIAL],
    "verl-fullyasync-colocate-fsdp2-128xh20-qwen2.5-math-7b": [_DAPO_PROMPT, _SERIAL],
    "verl-fullyasync-colocate-fsdp2-16xh20-qwen2.5-math-7b-10k": [_DAPO_PROMPT, _SERIAL],
    "verl-osoff-colocate-fsdp2-16xh20-qwen2.5-math-7b": [_DAPO_PROMPT, _EAGER, _SERIAL],
    "verl-osoff-colocate-megatron-16xh20-qwen2.5-math-7b": [_DAPO_PROMPT, _EAGER, _SERIAL],
}

MAP_REVISIONS.update({rid: _NEMO_TOKENS for rid in REVISIONS if rid.startswith("nemorl-")})

VERL_MAP = {"step": ["t_step"],
            "gen": ["t_rollout", "t_offload", "t_onload_weights", "t_weight_sync", "t_onload_kv"],
            "generate_sequences": ["t_rollout"],
            "old_log_prob": ["perf/log_probs_time"],
            "update_actor": ["update_actor"]}

PLANS: dict[str, dict] = {
    "nemorl-v0.5-llama3.1-8b-16xh100-onpolicy": {
        "args": ["--hardware", "H100-SXM-80G", "--model", "Llama-3.1-8B", "--actor-num-nodes", "2",
                 "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "1",
                 "--pipeline-model-parallel-size", "2", "--rollout-num-gpus-per-engine", "1",
                 "--recompute-granularity", "full", *_nemo(1019)],
        "map": NEMO_MAP,
        "notes": ["NeMo-RL's Megatron backend with sequence packing; vime packs nothing (micro-batch 1 sample)",
                  "vLLM 0.11.2 there; vime's engine model is calibrated on vLLM 0.25.1"]},
    "nemorl-v0.5-llama3.1-8b-8xgb200-onpolicy": {
        "args": ["--hardware", "GB200", "--model", "Llama-3.1-8B", "--actor-num-nodes", "2",
                 "--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size", "1",
                 "--rollout-num-gpus-per-engine", "1", "--recompute-granularity", "full", *_nemo(1066)],
        "map": NEMO_MAP,
        "notes": ["GB200 file is datasheet-only (no measurement of that chip)"]},
    "nemorl-v0.5-qwen3-32b-16xgb200-onpolicy": {
        "args": ["--hardware", "GB200", "--model", "Qwen3-32B", "--actor-num-nodes", "4",
                 "--actor-num-gpus-per-node", "4", "--tensor-model-parallel-size", "2",
                 "--rollout-num-gpus-per-engine", "1", *_nemo(3253)],
        "map": NEMO_MAP,
        "notes": ["recompute not stated for this recipe: none assumed"]},
    "nemorl-v0.5-qwen3-32b-32xh100-onpolicy": {
        "args": ["--hardware", "H100-SXM-80G", "--model", "Qwen3-32B", "--actor-num-nodes", "4",
                 "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "4",
                 "--pipeline-model-parallel-size", "4", "--rollout-num-gpus-per-engine", "4", *_nemo(3251)],
        "map": NEMO_MAP,
        "notes": []},
    "nemorl-v0.4-qwen3-30b-a3b-32xh100-onpolicy": {
        "args": [*_nemo_moe_layout("H100-SXM-80G", "Qwen3-30B-A3B", nodes=4, per_node=8, tp=2, ep=8, engine_tp=4),
                 *_nemo_moe(3154, prompts=64, max_len=4096, gbs=512)],
        "map": NEMO_MAP,
        "notes": ["MoE (issue 21): ETP 1, router imbalance 1.15 and grouped-GEMM efficiency 0.7 are vime defaults",
                  "predicted by the helper that read the table row (figures on the same line); nothing tuned on them"]},
    "nemorl-v0.4-qwen3-235b-a22b-128xh100-onpolicy": {
        "args": [*_nemo_moe_layout("H100-SXM-80G", "Qwen3-235B-A22B", nodes=16, per_node=8, tp=2, cp=2, pp=8, ep=16,
                                   engine_tp=16, recompute=True),
                 *_nemo_moe(5671, prompts=16, max_len=8192, gbs=512)],
        "map": NEMO_MAP,
        "notes": ["MoE (issue 21): fp32 Adam moments in vime vs NeMo's precision-aware optimizer",
                  "predicted by the helper that read the table row (figures on the same line); nothing tuned on them"]},
    # The v0.5 MoE rows (session 22): the same rules as the v0.4 ones, the v0.5 recipes' parallel sizes.
    "nemorl-v0.5-qwen3-30b-a3b-32xh100-onpolicy": {
        "args": [*_nemo_moe_layout("H100-SXM-80G", "Qwen3-30B-A3B", nodes=4, per_node=8, tp=1, ep=8, engine_tp=2),
                 *_nemo_moe(3196, prompts=64, max_len=4096, gbs=512)],
        "map": NEMO_MAP,
        "notes": ["MoE: ETP 1, router imbalance 1.15 and grouped-GEMM efficiency 0.7 are vime defaults",
                  "figures seen while planning (one table row); nothing tuned on them"]},
    "nemorl-v0.5-qwen3-30b-a3b-16xgb200-onpolicy": {
        "args": [*_nemo_moe_layout("GB200", "Qwen3-30B-A3B", nodes=4, per_node=4, tp=1, ep=16, engine_tp=1),
                 *_nemo_moe(3198, prompts=64, max_len=4096, gbs=512)],
        "map": NEMO_MAP,
        "notes": ["GB200 file is datasheet-only; EP 16 spans 4 nodes of one NVL72 rack, which vime prices as inter-node",
                  "figures seen while planning (one table row); nothing tuned on them"]},
    "nemorl-v0.5-qwen3-235b-a22b-128xh100-onpolicy": {
        "args": [*_nemo_moe_layout("H100-SXM-80G", "Qwen3-235B-A22B", nodes=16, per_node=8, tp=2, cp=2, pp=8, ep=16,
                                   engine_tp=16, recompute=True),
                 *_nemo_moe(5700, prompts=16, max_len=8192, gbs=512)],
        "map": NEMO_MAP,
        "notes": ["the v0.4 row's configuration on the v0.5 release", "fp32 Adam moments in vime vs NeMo's precision-aware optimizer",
                  "figures seen while planning (one table row); nothing tuned on them"]},
    "nemorl-v0.5-qwen3-235b-a22b-64xgb200-onpolicy": {
        "args": [*_nemo_moe_layout("GB200", "Qwen3-235B-A22B", nodes=16, per_node=4, tp=2, cp=2, pp=4, ep=16,
                                   engine_tp=8, recompute=True),
                 *_nemo_moe(5711, prompts=16, max_len=8192, gbs=512)],
        "map": NEMO_MAP,
        "notes": ["GB200 file is datasheet-only; groups spanning nodes of one NVL72 rack are priced as inter-node",
                  "figures seen while planning (one table row); nothing tuned on them"]},
    "slime-385-16xh200-qwen3-0.6b-colocate": {
        "args": ["--hardware", "H200-141G", "--model", "Qwen3-0.6B", "--actor-num-nodes", "2",
                 "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "1",
                 "--rollout-num-gpus-per-engine", "1", "--rollout-batch-size", "1152", "--n-samples-per-prompt", "5",
                 "--global-batch-size", "5760", "--rollout-max-response-len", "1024", "--rollout-temperature", "0.8",
                 "--micro-batch-size", "1", "--gpu-memory-utilization", "0.7"],
        "map": {"perf/rollout_time": ["t_rollout"], "perf/total_train_time": ["t_step"]},
        "notes": ["SGLang there, vLLM in vime; the reporter saw idle rollout GPUs (low quality: checking only)"]},
    "verl-slime385-16xh200-qwen3-0.6b": {
        "args": ["--hardware", "H200-141G", "--model", "Qwen3-0.6B", "--actor-num-nodes", "2",
                 "--actor-num-gpus-per-node", "8", "--tensor-model-parallel-size", "1",
                 "--rollout-num-gpus-per-engine", "1", "--rollout-batch-size", "1152", "--n-samples-per-prompt", "5",
                 "--global-batch-size", "5760", "--rollout-max-response-len", "1024", "--rollout-temperature", "0.8",
                 "--micro-batch-size", "1", "--gpu-memory-utilization", "0.7"],
        "map": {"timing_s/generation_timing/max": ["t_rollout"], "timing_s/step": ["t_step"]},
        "notes": ["everything as the slime run (the source says only 'same configuration'); FSDP there"]},
    "verl-fullyasync-colocate-fsdp2-32xh20-qwen2.5-math-7b": {
        "args": _verl_7b(4, tp=4, engine_tp=4, n=16, gbs=512, response=28672),
        "map": VERL_MAP,
        "notes": ["FSDP2 + Ulysses SP 4 expressed as Megatron TP 4", "validation every 20 steps not simulated"]},
    "verl-fullyasync-colocate-fsdp2-128xh20-qwen2.5-math-7b": {
        "args": _verl_7b(16, tp=4, engine_tp=4, n=16, gbs=512, response=28672),
        "map": VERL_MAP,
        "notes": ["as the 32-GPU row"]},
    "verl-fullyasync-colocate-fsdp2-16xh20-qwen2.5-math-7b-10k": {
        "args": _verl_7b(2, tp=4, engine_tp=4, n=16, gbs=512, response=10240),
        "map": VERL_MAP,
        "notes": ["train batch 512 prompts assumed", "validate time reported apart: not predicted"]},
    "verl-osoff-colocate-fsdp2-16xh20-qwen2.5-math-7b": {
        "args": _verl_7b(2, tp=4, engine_tp=2, n=12, gbs=384, response=20480,
                         extra=("--max-num-batched-tokens", "10240")),
        "map": VERL_MAP,
        "notes": ["FSDP2 (fsdp_size 2) + Ulysses SP 4 expressed as Megatron TP 4",
                  "vLLM eager (enforce_eager True at that commit): vime models CUDA-graph decode"]},
    "verl-osoff-colocate-megatron-16xh20-qwen2.5-math-7b": {
        "args": _verl_7b(2, tp=2, pp=2, engine_tp=2, n=16, gbs=512, response=8192,
                         extra=("--max-num-batched-tokens", "10240")),
        "map": VERL_MAP,
        "notes": ["vLLM eager (enforce_eager True at that commit): vime models CUDA-graph decode"]},
    "vime-244-h800x8-qwen3-4b-disaggregated-4t4r": {
        "args": ["--hardware", "H800", "--model", "Qwen3-4B", "--no-colocate", "--actor-num-gpus-per-node", "4",
                 "--rollout-num-gpus", "4", "--rollout-num-gpus-per-engine", "2", "--tensor-model-parallel-size", "2",
                 "--rollout-batch-size", "32", "--n-samples-per-prompt", "8", "--global-batch-size", "256",
                 "--rollout-max-response-len", "2048", "--gpu-memory-utilization", "0.7",
                 "--recompute-granularity", "full", "--micro-batch-size", "8", "--use-kl-loss", "--kl-loss-coef", "0"],
        "map": {"perf/step_time": ["t_step"], "perf/rollout_time": ["t_rollout"], "perf/train_time": ["perf/train_time"]},
        "notes": ["dynamic batching at 9216 tokens/GPU expressed as 8 samples per micro-batch",
                  "the source's 50-step mean includes warm-up and 2 eval steps; the prediction is one steady step"]},
    "vime-442-1xl20-qwen3-0.6b-colocate-offload": {
        "args": ["--hardware", "L20", "--model", "Qwen3-0.6B", "--actor-num-gpus-per-node", "1",
                 "--tensor-model-parallel-size", "1", "--rollout-num-gpus-per-engine", "1",
                 "--rollout-batch-size", "8", "--n-samples-per-prompt", "2", "--global-batch-size", "16",
                 "--rollout-max-response-len", "192", "--gpu-memory-utilization", "0.5",
                 "--train-offload-backend", "torch_memory_saver", "--use-kl-loss"],
        "map": {"perf/step_time": ["t_step"], "perf/train_wait_time": ["train_wait"],
                "perf/train_time": ["perf/train_time"], "perf/actor_train_time": ["perf/actor_train_time"],
                "perf/sleep_time": ["trainer_sleep"], "perf/wake_up_time": ["trainer_wake_up"],
                "perf/update_weights_time": ["t_weight_sync"], "perf/ref_log_probs_time": ["perf/ref_log_probs_time"]},
        "notes": ["vLLM memory budget not stated: 0.5 assumed for both #442 runs (the resident-trainer run needs room)"]},
    "vime-442-1xl20-qwen3-0.6b-colocate-no-offload-train": {
        "args": ["--hardware", "L20", "--model", "Qwen3-0.6B", "--actor-num-gpus-per-node", "1",
                 "--tensor-model-parallel-size", "1", "--rollout-num-gpus-per-engine", "1",
                 "--rollout-batch-size", "8", "--n-samples-per-prompt", "2", "--global-batch-size", "16",
                 "--rollout-max-response-len", "192", "--gpu-memory-utilization", "0.5", "--no-offload-train",
                 "--use-kl-loss"],
        "map": {"perf/step_time": ["t_step"], "perf/train_wait_time": ["train_wait"],
                "perf/train_time": ["perf/train_time"], "perf/update_weights_time": ["t_weight_sync"]},
        "notes": ["as the offload row, the trainer resident"]},
}


def _quantities(sim) -> dict[str, float]:
    """Every simulated quantity a plan may name, for the last simulated step."""
    st = sim.steps[-1]
    q = {k: float(getattr(st, k)) for k in ("t_rollout", "t_offload", "t_train", "t_onload_weights",
                                             "t_weight_sync", "t_onload_kv", "t_step")}
    extra = dict(st.train.get("extra", {}))
    q.update({k: float(v) for k, v in extra.items() if isinstance(v, (int, float))})
    q.setdefault("perf/log_probs_time", 0.0)
    q.setdefault("perf/ref_log_probs_time", 0.0)
    q["update_actor"] = q["t_train"] - q["perf/log_probs_time"] - q["perf/ref_log_probs_time"]
    if "perf/train_time" in q:
        q["train_wait"] = q["t_step"] - q["perf/train_time"]
    q["trainer_sleep"], q["trainer_wake_up"] = float(st.t_trainer_sleep), float(st.t_trainer_wake_up)
    gpus = len(sim.backends.gpus)
    q["tokens_per_s_per_gpu"] = float(st.train.get("tokens", 0)) / (q["t_step"] * gpus)
    q["response_length_mean"] = float(st.response_length_mean)
    sequence_tokens = float(st.rollout.get("response_tokens", 0) + st.rollout.get("prompt_tokens", 0))
    q["sequence_tokens_per_s_per_gpu"] = sequence_tokens / (q["t_step"] * gpus)
    return q


def _pred_name(after: str | None) -> str:
    return f"predicted.{after}.json" if after else "predicted.json"


def predict(ids: list[str], after: str | None = None) -> int:
    from vime.config import parse_args
    from vime.runs.sim import simulate

    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    for rid in ids:
        plan = PLANS[rid]
        revisions = REVISIONS.get(rid, []) if after else []
        argv = [*plan["args"], *(w for words, _ in revisions for w in words), "--num-rollout", str(STEPS)]
        sim = simulate(parse_args(argv, command="simulate"))
        remap, remap_why = MAP_REVISIONS.get(rid, ({}, "")) if after else ({}, "")
        metric_map = {**plan["map"], **remap}
        out: dict = {"id": rid, "vime_args": argv, "vime_commit_before": commit, "map": metric_map,
                     "notes": plan["notes"], "fits": sim.fits}
        if revisions:
            out["revisions"] = [{"words": list(words), "why": why} for words, why in revisions]
        if remap:
            out["map_revisions"] = {"map": remap, "why": remap_why}
        if not sim.fits:
            out["oom"] = str(sim.oom)
        else:
            q = _quantities(sim)
            out["quantities"] = q
            out["predicted"] = {metric: sum(q[k] for k in keys) for metric, keys in metric_map.items()}
        (DATA / rid / _pred_name(after)).write_text(json.dumps(out, indent=2) + "\n")
        shown = {k: round(v, 2) for k, v in out.get("predicted", {}).items()}
        print(f"{rid}: {'fits' if sim.fits else 'OOM ' + out['oom'][:120]} {shown}", flush=True)
    return 0


def _measured_value(figures: dict, metric: str) -> float | None:
    v = figures.get(metric, figures.get(f"timing_s/{metric}"))  # verl's wandb keys carry the prefix
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, dict):
        for key in ("value", "seconds", "median", "mean"):
            if isinstance(v.get(key), (int, float)):
                return float(v[key])
    return None


def compare(as_json: bool, after: str | None = None) -> int:
    rows = []
    for ref in sorted(DATA.glob("*/reference.json")):
        rid = ref.parent.name
        pred_path, meas_path = ref.parent / "predicted.json", ref.parent / "measured.json"
        if rid not in PLANS:
            rows.append({"id": rid, "metric": "-", "status": "not expressible: "
                         + str(json.loads(ref.read_text()).get("why_not", ""))[:90]})
            continue
        if not pred_path.exists() or not meas_path.exists():
            rows.append({"id": rid, "metric": "-", "status": "no prediction or no measurement"})
            continue
        pred, meas = json.loads(pred_path.read_text()), json.loads(meas_path.read_text())
        later_path = ref.parent / _pred_name(after)
        later = json.loads(later_path.read_text()) if after and later_path.exists() else None
        if not pred.get("fits") and not (later and later.get("fits")):
            rows.append({"id": rid, "metric": "-", "status": "predicted OOM: " + pred.get("oom", "")[:80]})
            continue
        # a pre-registered OOM whose later prediction fits: its metrics, "OOM" where the first prediction stands
        metrics = pred["predicted"] if pred.get("fits") else dict.fromkeys(later["predicted"])
        for metric, p in metrics.items():
            m = _measured_value(meas.get("figures", {}), metric)
            err = None if m in (None, 0.0) or p is None else (p - m) / m
            row = {"id": rid, "metric": metric, "measured": m, "predicted": p, "error": err,
                   "status": "ok" if m is not None else "no figure"}
            if later is not None and later.get("fits"):
                q = later["predicted"][metric]
                row.update(after=q, error_after=None if m in (None, 0.0) else (q - m) / m)
            rows.append(row)
    if as_json:
        print(json.dumps(rows, indent=2))
        return 0
    def pct(e: float | None) -> str:
        return "-" if e is None else f"{100 * e:+.1f} %"

    extra = f" {'after ' + after:>12s} {'error':>8s}" if after else ""
    print(f"{'reference':58s} {'metric':34s} {'measured':>10s} {'predicted':>10s} {'error':>8s}{extra}")
    for r in rows:
        if "predicted" not in r:
            print(f"{r['id']:58s} {r['status']}")
            continue
        m = "-" if r["measured"] is None else f"{r['measured']:.2f}"
        tail = f" {r['after']:12.2f} {pct(r['error_after']):>8s}" if "after" in r else ""
        p = "OOM" if r["predicted"] is None else f"{r['predicted']:.2f}"
        print(f"{r['id']:58s} {r['metric'][:34]:34s} {m:>10s} {p:>10s} {pct(r['error']):>8s}{tail}")
    for key, label in (("error", "pre-registered"), ("error_after", f"after {after}")):
        errs = [abs(r[key]) for r in rows if r.get(key) is not None]
        if errs:
            within = sum(e <= 0.15 for e in errs)
            print(f"{label}: {within} of {len(errs)} compared figures within 15 %; median |error| "
                  f"{100 * sorted(errs)[len(errs) // 2]:.1f} %")
    return 0


#: Mean responses (tokens) `implied` simulates each reference at, the plan's lognormal shape (sigma) kept.
IMPLIED_MEANS = (250, 400, 600, 900, 1300, 2000, 3000, 4500)


def _unstated_response(rid: str) -> bool:
    return DAPO_MATH_7B_RESPONSE in PLANS[rid]["args"]


def _implied_mean(curve: list[tuple[float, float]], measured: float) -> float | None:
    """The mean response at which the simulated figure equals `measured` (log-log between grid points), or None
    outside the grid."""
    for (m0, p0), (m1, p1) in zip(curve, curve[1:], strict=False):
        if min(p0, p1) <= measured <= max(p0, p1) and p0 != p1:
            w = (math.log(measured) - math.log(p0)) / (math.log(p1) - math.log(p0))
            return math.exp(math.log(m0) + w * (math.log(m1) - math.log(m0)))
    return None


def implied(ids: list[str], clip: float = 0.0) -> int:
    from vime.config import parse_args
    from vime.runs.sim import simulate

    sigma = float(DAPO_MATH_7B_RESPONSE.split(",")[1])
    print(f"mean response (tokens) at which the simulation gives each figure; lognormal sigma {sigma}"
          f"{f', a share {clip} of responses at the cap' if clip else ''}, the plans with their REVISIONS; grid {IMPLIED_MEANS}")
    for rid in ids:
        plan = PLANS[rid]
        meas = json.loads((DATA / rid / "measured.json").read_text()).get("figures", {})
        words = [*plan["args"], *(w for ws, _ in REVISIONS.get(rid, []) for w in ws), "--num-rollout", str(STEPS)]
        at = len(words) - words[::-1].index("--response-length")  # the last one given is the one parsed
        cap = int(words[words.index("--rollout-max-response-len") + 1])
        curves: dict[str, list[tuple[float, float]]] = {metric: [] for metric in plan["map"]}
        for mean in IMPLIED_MEANS:
            # the body's mean such that the whole mean (the clipped share at the cap included) is `mean`
            body = (mean - clip * cap) / (1.0 - clip)
            if body < 1:
                continue
            words[at] = _mean_response(body, sigma) + (f",{clip}" if clip else "")
            sim = simulate(parse_args(words, command="simulate"))
            if not sim.fits:
                continue
            q = _quantities(sim)
            for metric, keys in plan["map"].items():
                curves[metric].append((mean, sum(q[k] for k in keys)))
        found = []
        for metric, curve in curves.items():
            m = _measured_value(meas, metric)
            if not m or len(curve) < 2:
                continue
            mean = _implied_mean(curve, m)
            lo, hi = curve[0], curve[-1]
            where = (f"{mean:7.0f}" if mean else
                     f"{'<' if m < min(lo[1], hi[1]) else '>'} grid ({lo[1]:.1f} at {lo[0]}, {hi[1]:.1f} at {hi[0]})")
            print(f"{rid:58s} {metric:22s} measured {m:9.2f}  implied mean response {where}")
            if mean:
                found.append(mean)
        if len(found) > 1:
            print(f"{rid:58s} {'spread':22s} {max(found) / min(found):.2f}x between its figures' implied means")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("predict", help="simulate every planned reference and write its predicted.json")
    p.add_argument("ids", nargs="*", help="reference ids (default: all planned)")
    p.add_argument("--after", metavar="NAME", help="a later prediction after a model fix: predicted.NAME.json")
    c = sub.add_parser("compare", help="measured vs predicted per reported metric")
    c.add_argument("--json", action="store_true")
    c.add_argument("--after", metavar="NAME", help="also show predicted.NAME.json")
    i = sub.add_parser("implied", help="where the mean response is not stated: the mean each figure implies")
    i.add_argument("ids", nargs="*", help="reference ids (default: every plan with an unstated mean response)")
    i.add_argument("--clip", type=float, default=0.0, metavar="SHARE",
                   help="a share of responses cut at the cap (--response-length lognormal:MU,SIGMA,CLIP)")
    a = ap.parse_args(argv)
    if a.cmd == "implied":
        if not 0 <= a.clip < 1:
            raise SystemExit(f"--clip {a.clip}: a share of responses, 0 ≤ SHARE < 1")
        return implied(a.ids or sorted(r for r in PLANS if _unstated_response(r)), a.clip)
    if a.cmd == "predict":
        unknown = [i for i in a.ids if i not in PLANS]
        if unknown:
            raise SystemExit(f"no plan for {unknown}; planned: {', '.join(sorted(PLANS))}")
        return predict(a.ids or sorted(PLANS), a.after)
    return compare(a.json, a.after)


if __name__ == "__main__":
    raise SystemExit(main())
