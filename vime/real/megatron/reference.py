"""The frozen reference policy of a KL loss: a second GPTModel on the same rank, and its log-probs per micro-batch (issue 19)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch

from vime.real.megatron import model as mmodel
from vime.real.megatron.batches import MicroBatch, log_prob_micro_batches, run_schedule
from vime.real.megatron.loss import TokenScorer, response_slice
from vime.real.megatron.weights import device_views, host_views, load_hf_into

if TYPE_CHECKING:
    from vime.real.megatron.actor import ActorConfig


class ReferenceModel:
    """The reference weights (``--ref-load``, else the policy's initial weights), frozen, in bf16 like the
    policy; no gradients, no optimizer state. Where they live (``--ref-placement``): "gpu", in the trainer's
    "params" offload tag, so they leave the GPU when the trainer sleeps and come back with it; "host", in
    pinned host memory, copied to the GPU for each `log_probs` and dropped after (the freed blocks stay in
    PyTorch's cache, where the training's activations reuse them)."""

    def __init__(self, spec: mmodel.ModelSpec, cfg: ActorConfig, *, tp: int, tp_rank: int, cpu: bool,
                 offload: Any, path: str | None, policy: Any = None, ep: int = 1, ep_rank: int = 0,
                 etp: int | None = None, etp_rank: int = 0,
                 align: Callable[[list[MicroBatch]], list[MicroBatch]] | None = None) -> None:
        tf_config = mmodel.transformer_config(spec, tp=tp, ep=ep, etp=etp, dtype=cfg.torch_dtype, cpu_init=cpu,
                                              calculate_per_token_loss=False)
        self.on_host = cfg.ref_placement == "host"
        # on the host it is built on the GPU as the policy is (the same init path), outside the sleeping region
        with contextlib.nullcontext() if self.on_host else offload.region("params"):
            module = mmodel.build_gpt_model(spec, tf_config)
            if cfg.torch_dtype != torch.float32:
                module = module.to(cfg.torch_dtype)
            if not cpu:
                module = module.cuda()
        for p in module.parameters():
            p.requires_grad_(False)
        if path is not None:
            load_hf_into(module, spec, path, tp=tp, tp_rank=tp_rank, ep=ep, ep_rank=ep_rank, etp=etp, etp_rank=etp_rank)
        elif policy is not None:  # the policy's weights as they are now (its initial ones)
            src = dict(policy.named_parameters())
            with torch.no_grad():
                for name, p in module.named_parameters():
                    p.copy_(src[name])
        module.eval()
        self.module = module
        #: --ref-placement host: each parameter's host copy, views of one pinned buffer (as the weight backup's);
        #: the parameters point at these between uses
        self.host: dict[str, torch.Tensor] = {}
        if self.on_host:
            named = list(module.named_parameters())
            self.host = host_views([(n, p.detach()) for n, p in named], pinned=not cpu)
            for name, p in named:
                self.host[name].copy_(p.detach())
                p.data = self.host[name]
        # pads the micro-batches as the policy's are padded (MoE layouts: batches.moe_widths)
        self.align = align
        self.source = path or "the initial policy"

    def log_probs(self, batch: Any, groups: Sequence[Sequence[int]], scorer: TokenScorer,
                  device: torch.device) -> list[torch.Tensor]:
        """Per-response-token log-probs of every row of `batch` under the reference, in row order."""
        out: dict[int, torch.Tensor] = {}

        def collect(mb: MicroBatch, logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
            logp, _ = scorer.token_stats(logits, mb.tokens, with_entropy=False)
            for i, (t, r) in enumerate(zip(mb.total_lengths, mb.response_lengths, strict=True)):
                out[mb.rows[i]] = response_slice(logp, i, t, r).detach().float()
            return logp.sum() * 0.0, {}

        with torch.no_grad(), self._on(device):
            mbs = log_prob_micro_batches(batch, groups, device)
            run_schedule(self.module, self.align(mbs) if self.align else mbs, True, collect)
        return [out[i] for i in range(len(batch.tokens))]

    @contextlib.contextmanager
    def _on(self, device: torch.device) -> Iterator[None]:
        """The weights on `device` for the duration (a host-placed reference's copy in, then dropped)."""
        if not self.on_host:
            yield
            return
        params = dict(self.module.named_parameters())
        try:
            for name, there in device_views(self.host, device).items():
                params[name].data = there
            yield
        finally:
            for name, host in self.host.items():
                params[name].data = host
