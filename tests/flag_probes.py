"""Probes for the flag-effect test: each turns resolved Args into what one piece of the real run does with them.

Every probe calls the code `vime train --backend real` runs (the Megatron actor's config and loss, the
`vllm serve` argv, the rollout against a recording router, the batch builder, the orchestrator's calls
on the simulated backends, which the real run shares) and returns a plain, comparable value. No
servers, no Ray: pure functions, small torch tensors and the virtual clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from vime.errors import VimeError
from vime.protocols import GenerateRequest, GenerateResult
from vime.rollout.data_source import ByteTokenizer

#: the model every actor probe builds its config for (the tiny Qwen3 of the CPU tests)
HF = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 128, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 16, "max_position_embeddings": 64, "tie_word_embeddings": True, "rms_norm_eps": 1e-6,
      "torch_dtype": "float32"}

#: the same shape as a Qwen3-MoE of 4 experts (the expert-parallel flags need one)
HF_MOE = {**HF, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_experts": 4,
          "num_experts_per_tok": 2, "moe_intermediate_size": 64, "norm_topk_prob": True}

#: what the fake engines answer: a math answer whose label some prompts carry
ANSWER = "\\boxed{1}"


def write_inputs(root: Path) -> dict[str, str]:
    """The files the flags name: prompts (with alternative keys), an eval set, two dense model directories and a MoE one."""
    rows = [{"prompt": f"prompt {i}" + " long" * (i % 7), "label": str(i % 3), "question": f"q{i}",
             "answer": str((i + 1) % 3)} for i in range(64)]
    data = root / "prompts.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ev = root / "eval.jsonl"
    # pre-tokenised, so the simulated backends (no tokenizer) read it too
    ev.write_text("".join(json.dumps({"prompt": f"eval {i}", "token_ids": list(f"eval {i}".encode()), "label": "1"})
                          + "\n" for i in range(8)))
    paths = {"data": str(data), "eval": str(ev), "dir": str(root)}
    for name, cfg in (("model", HF), ("model2", HF), ("moe", HF_MOE)):
        d = root / name
        d.mkdir()
        (d / "config.json").write_text(json.dumps(cfg))
        paths[name] = str(d)
    return paths


# --- the Megatron actor ------------------------------------------------------------------------
def actor(a: Any) -> Any:
    from vime.real.megatron.actor import ActorConfig

    return ActorConfig.from_args(a, HF)


def actor_field(name: str) -> Any:
    """An ActorConfig field the actor reads (named where it does, in the entry's note)."""
    return lambda a: getattr(actor(a), name)


def optimizer(a: Any) -> dict[str, Any]:
    """The fields of Megatron's OptimizerConfig the actor builds (vime.real.megatron.build)."""
    from vime.real.megatron.build import optimizer_settings

    return optimizer_settings(actor(a))


def ddp(a: Any) -> dict[str, Any]:
    """The fields of Megatron's DistributedDataParallelConfig the actor builds (vime.real.megatron.build)."""
    from vime.real.megatron.build import ddp_settings

    return ddp_settings(actor(a))


def model(a: Any) -> dict[str, Any]:
    """The TransformerConfig fields the options set (precision, recompute)."""
    from vime.real.megatron.build import model_settings

    return model_settings(actor(a))


class _Scorer:
    """TokenScorer's contract for one rank holding the whole vocabulary, in plain torch."""

    def token_stats(self, logits: torch.Tensor, tokens: torch.Tensor, with_entropy: bool,
                    entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        logp = lp.gather(-1, tokens[:, 1:].unsqueeze(-1)).squeeze(-1)
        ent = -(lp.exp() * lp).sum(-1)
        return logp, (ent if entropy_grad else ent.detach()) if with_entropy else None


def loss(a: Any) -> tuple[Any, ...]:
    """The real actor's loss (vime.real.megatron.loss.policy_loss) on a fixed micro-batch: its value, the size of
    its gradient and its metrics. Old, rollout and reference log-probs sit away from the current ones, so clip
    ranges, dual clip, TIS bounds and KL estimators all bite."""
    from vime.real.megatron.batches import make_micro_batch
    from vime.real.megatron.loss import policy_loss, response_slice

    cfg = actor(a)
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 6, 16, generator=g)
    tokens = [[1, 2, 3, 4, 5, 6], [7, 8, 9, 10]]
    resp = [3, 2]
    mb = make_micro_batch(tokens, resp, advantages=[torch.tensor([1.0, -1.0, 0.5]), torch.tensor([-1.0, 2.0])])
    cur_all, _ = _Scorer().token_stats(logits, mb.tokens, False)
    cur = [response_slice(cur_all, i, len(t), r) for i, (t, r) in enumerate(zip(tokens, resp, strict=True))]
    mb.old_log_probs = [cur[0] - torch.tensor([0.3, -2.0, -0.6]), cur[1] - torch.tensor([2.0, 0.4])]
    mb.rollout_log_probs = [mb.old_log_probs[0] + torch.tensor([-1.0, 1.0, 0.0]), mb.old_log_probs[1] + 1.0]
    mb.ref_log_probs = [cur[0] - 0.5, cur[1] + 0.7]
    logits.requires_grad_(True)
    value, metrics = policy_loss(cfg, _Scorer(), mb, logits)
    value.backward()
    assert logits.grad is not None
    return (round(float(value.detach()), 6), round(float(logits.grad.abs().sum()), 6),
            tuple(sorted((k, round(float(v.detach()), 6)) for k, v in metrics.items())))


def advantages(a: Any) -> list[list[float]]:
    """The real actor's per-token advantages (vime.real.megatron.actor.rank_advantages) for two rows."""
    from vime.real.megatron.actor import rank_advantages

    batch = SimpleNamespace(rewards=[1.0, 0.0], response_lengths=[3, 2], loss_masks=[[1, 1, 1], [1, 1]])
    old = [torch.tensor([-1.0, -0.5, -0.2]), torch.tensor([-0.3, -0.9])]
    ref = [torch.tensor([-1.4, -0.1, -0.2]), torch.tensor([-0.8, -0.4])]
    out = rank_advantages(actor(a), batch, old, ref)
    return [[round(float(x), 6) for x in row] for row in out]


# --- the engines' command line -----------------------------------------------------------------
def server(a: Any, device: str = "cuda") -> list[Any]:
    """Every `vllm serve` argv and GPU list the run would start (vime.real.vllm.launcher), with the session's
    overrides for the device (vime.real.session.server_overrides)."""
    from vime.real.session import server_overrides
    from vime.real.vllm.launcher import engine_specs, server_command

    n = a.rollout_num_engines
    specs = engine_specs(a, device=device, ports=list(range(9000, 9000 + n)), enable_scale_out=False,  # type: ignore[arg-type]
                         **server_overrides(a, device))
    return [(server_command(s, python="python"), s.cuda_visible_devices, s.cpu_reload_fix) for s in specs]


def weights_path(a: Any) -> Any:
    """Where disk weight sync writes (vime.real.session.weight_dir_of) and the CPU servers' overrides."""
    from vime.real.session import weight_dir_of

    return str(weight_dir_of(a, Path("/work"))), server(a, "cpu")


def placement(a: Any) -> dict[str, Any]:
    from vime.placement import plan_placement

    return plan_placement(a.cluster, use_gpus=True).to_dict()


# --- the rollout ---------------------------------------------------------------------------------
class ChatTokenizer(ByteTokenizer):
    """Bytes, with a chat template that wraps the prompt."""

    def apply_chat_template(self, prompt: Any, tokenize: bool = True, add_generation_prompt: bool = True) -> Any:
        text = prompt if isinstance(prompt, str) else " ".join(m["content"] for m in prompt)
        return self.encode(f"<user>{text}</user><assistant>")


@dataclass
class Router:
    """A recording router: every request answered with `ANSWER`'s bytes at once (virtual time)."""

    requests: list[GenerateRequest] = field(default_factory=list)
    in_flight: int = 0
    max_in_flight: int = 0

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        import asyncio

        self.requests.append(request)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        await asyncio.sleep(1.0)
        self.in_flight -= 1
        ids = list(ANSWER.encode())[: request.sampling_params["max_tokens"]]
        return GenerateResult(ids, [-0.5] * len(ids), "stop", len(request.token_ids), len(ids), weight_version="1",
                              engine="e0")

    async def abort_all(self) -> None:
        return None


def rollout(a: Any) -> tuple[Any, ...]:
    """One rollout as the real run makes it (vime.runs.loop.build_rollout over --prompt-data): each request's
    prompt, wire sampling params and session header, the in-flight peak, and each sample's reward."""
    from vime.rollout.data_source import DataSource
    from vime.runs.loop import build_rollout
    from vime.sim import clock

    tok = ChatTokenizer()
    router = Router()
    ro = build_rollout(a, router, num_engines=a.rollout_num_engines, tokenizer=tok, progress=False)  # type: ignore[arg-type]
    source = DataSource.from_config(a.data, a.rollout, seed=a.seed, tokenizer=tok)
    out = clock.run(ro.generate_rollout(0, source))
    reqs = tuple((tuple(r.token_ids), tuple(sorted(r.sampling_params.items())), r.session_id) for r in router.requests)
    rewards = tuple((s.index, json.dumps(s.reward, sort_keys=True)) for s in sorted(out.samples, key=lambda s: s.index))
    return reqs, router.max_in_flight, rewards


def wire(a: Any) -> dict[str, Any]:
    """A new sample's vLLM sampling params and log-prob count (vime.algo.sampling, what Rollout sends)."""
    from vime.algo.sampling import build_inference_sampling_params, default_sampling_params, logprobs_count

    return build_inference_sampling_params(default_sampling_params(a.rollout), logprobs_count(a.rollout))


def remote_reward(a: Any) -> tuple[str, float]:
    """Where the remote reward model is asked (RewardHub over a mock transport) and what it answered."""
    import httpx

    from vime.rollout.rm_hub import RewardHub
    from vime.sim import clock
    from vime.types import Sample

    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, json={"reward": 0.5})

    hub = RewardHub(a.data, seed=a.seed, transport=httpx.MockTransport(answer))
    sample = Sample(group_index=0, index=0, tokens=[1, 2])
    sample.response = ANSWER
    value = clock.run(hub.score(sample))
    return seen[0], value


def batch(a: Any) -> tuple[Any, ...]:
    """The TrainBatch of one rollout (vime.runs.loop.build_batch_builder): rewards, advantages' inputs, the
    micro-batch schedule and the log-prob recompute decision (seed steps 30–31, 38)."""
    from vime.runs.loop import build_batch_builder
    from vime.types import Sample

    n, groups = a.n_samples_per_prompt, a.rollout_batch_size
    samples = []
    for i in range(n * groups):
        s = Sample(group_index=i // n, index=i, tokens=[1, 2, 3])
        s.append_response_tokens([4, 5][: 1 + i % 2], [-0.1] * (1 + i % 2),
                                 meta_info={"weight_version": "1", "finish_reason": {"type": "stop"}})
        s.reward = {"reward": float(i % 3 == 0), "acc": float(i % 2)}
        samples.append(s)
    b = build_batch_builder(a).build(0, samples)
    return (tuple(round(r, 6) for r in b.rewards), b.recompute_log_probs, repr(b.schedule))


# --- the orchestrator's calls, on the simulated backends the real run's orchestration shares ----
_SIMULATED: dict[str, Any] = {}


def _simulated(args: Any) -> Any:
    """One run on the simulated backends (cached per configuration): its calls and its requests."""
    key = json.dumps(args.to_dict(), sort_keys=True, default=str)
    if key not in _SIMULATED:
        _SIMULATED[key] = _simulate(args)
    return _SIMULATED[key]


def _simulate(args: Any) -> Any:
    from vime.report.calls import CallLog
    from vime.runs.sim import simulate

    # the simulated backends have no tokenizer for the text prompts: their own synthetic prompts instead
    a = args.replace(backend="sim", model="Qwen3-0.6B", prompt_data=None)
    log = CallLog()
    requests: list[Any] = []

    def wrap(b: Any) -> dict[str, Any]:
        wrapped = log.wrap(b.engines, b.router, b.trainer)
        inner = wrapped["router"]

        class Recording:
            def __getattr__(self, name: str) -> Any:
                return getattr(inner, name)

            async def generate(self, request: Any) -> Any:
                requests.append((len(request.token_ids), tuple(sorted(request.sampling_params.items()))))
                return await inner.generate(request)

        return {**wrapped, "router": Recording()}

    try:
        simulate(a, observers=[log], wrap=wrap)
    except VimeError as exc:
        return ("error", type(exc).__name__, str(exc)), ()
    calls = tuple((seg, c["component"], c["call"], json.dumps(c["args"], sort_keys=True))
                  for seg, entries in log.to_dict().items() for c in entries)
    return calls, tuple(requests)


def calls(a: Any) -> Any:
    """Every protocol call the orchestrator makes (engines, router, trainer), per segment, with arguments."""
    return _simulated(a)[0]


def requests(a: Any) -> Any:
    """Every generate request the orchestrator's rollouts and evaluations send (prompt length, wire params)."""
    return _simulated(a)[1]


# --- around the run -------------------------------------------------------------------------------
def trackers(a: Any) -> Any:
    from vime.trackers import TensorBoardTracker, Trackers, WandbTracker

    return Trackers.kinds(a.logging), WandbTracker.init_kwargs(a.logging, {}), TensorBoardTracker.directory(a.logging)


def ray_address(a: Any) -> Any:
    from vime.real.cluster import ray_address_of

    return ray_address_of(a.ray_address, environ={})


def real_faults(a: Any) -> tuple[tuple[str, str, int | None], ...]:
    """What the real run's fault observer arms as each rollout's phases begin (timers cancelled: nothing is killed)."""
    import asyncio

    from vime.real.faults import RealFaults

    async def arm() -> tuple[tuple[str, str, int | None], ...]:
        faults = RealFaults(a, session=None)
        for rid in range(a.num_rollout):
            for phase in ("rollout", "train"):
                faults.on_phase(phase, True, 0.0, rid)
        armed = tuple((h._callback.__name__, h._args[0].kind, h._args[0].step) for h in faults._pending)  # type: ignore[attr-defined]
        for h in faults._pending:
            h.cancel()
        return armed

    return asyncio.run(arm())
