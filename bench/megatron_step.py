"""A real Megatron-core training step on one GPU (local layer spec, bf16, random init, Qwen3-like shape): forward, backward, optimizer and peak memory, optionally with the trainer state in vime's CuMem regions (issues 12 and 11).

    python bench/megatron_step.py --preset qwen3-1.7b --shapes 1x4096,4x2048 --out step.json [--cumem]

`--device cpu --preset tiny` runs the same code path on a CPU (gloo) to check the script
(`--cpu-bf16` builds the model in bf16 as on the GPU). After the timed steps of each shape one
extra, untimed step is accounted (`--no-account` turns it off): memory by phase on CUDA, and on
any device the bytes autograd saves for the backward, by storage, grouped by the module that
saved them (issue 12: where the activation model misses bytes). `--kernels` (GPU only) profiles one more step per
shape and keeps the GPU's kernels per phase by class and the top names (where an eager stack's time goes).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import time
from contextlib import nullcontext

PRESETS = {
    # layers, hidden, heads, kv heads, head dim, ffn, vocab, tied embeddings (Qwen3 family shapes)
    "tiny": dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2, kv_channels=16,
                 ffn_hidden_size=128, vocab_size=512, tie=True),
    # Qwen3-1.7B's ratios (ffn = 3h, GQA 2:1, heads = h / 128 ... scaled) at CPU size, for the accounting
    "qwen3-mini": dict(num_layers=2, hidden_size=256, num_attention_heads=4, num_query_groups=2,
                       kv_channels=64, ffn_hidden_size=768, vocab_size=4096, tie=True),
    "qwen3-0.6b": dict(num_layers=28, hidden_size=1024, num_attention_heads=16, num_query_groups=8,
                       kv_channels=128, ffn_hidden_size=3072, vocab_size=151936, tie=True),
    "qwen3-1.7b": dict(num_layers=28, hidden_size=2048, num_attention_heads=16, num_query_groups=8,
                       kv_channels=128, ffn_hidden_size=6144, vocab_size=151936, tie=True),
    "qwen3-4b": dict(num_layers=36, hidden_size=2560, num_attention_heads=32, num_query_groups=8,
                     kv_channels=128, ffn_hidden_size=9728, vocab_size=151936, tie=True),
}


def flops_per_step(p: dict, mbs: int, seq: int) -> dict:
    """Matmul FLOPs of forward (x3 for fwd+bwd) for one micro-batch: linear layers, attention, LM head."""
    h, L, f, v = p["hidden_size"], p["num_layers"], p["ffn_hidden_size"], p["vocab_size"]
    nh, nkv, hd = p["num_attention_heads"], p["num_query_groups"], p["kv_channels"]
    tokens = mbs * seq
    linear = 2 * tokens * L * (h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * f)
    attn = 2 * 2 * mbs * L * nh * hd * seq * seq  # QK^T and PV, full (unfused local attention computes all)
    head = 2 * tokens * h * v
    fwd = linear + attn + head
    return {"tokens": tokens, "fwd_flops": fwd, "fwd_bwd_flops": 3 * fwd,
            "linear_flops": linear, "attn_flops": attn, "head_flops": head}


#: kernel classes by name fragment, first match wins (the unfused stack's elementwise kernels are what hidden-1024
#: layers spend beyond the model's bytes: bench/data/h200_notes.md, sixteenth session)
KERNEL_CLASSES = (("gemm", ("gemm", "cutlass", "sm90_xmma", "nvjet", "cublas")), ("softmax", ("softmax",)),
                  ("reduce", ("reduce", "norm")), ("copy", ("copy", "cat", "memcpy", "memset", "fill")),
                  ("elementwise", ("elementwise", "vectorized", "unrolled")))


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((cls for cls, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


#: The profiled step's phase ranges (record_function); the profiler also lists each on the GPU, as one long "kernel"
#: (the s17 files' "other" class holds them: 118 ms of the 0.6B's 232.6 ms forward, bench/data/h200_notes.md).
PHASES = ("step_fwd", "step_bwd", "step_opt")


def kernel_table(kernels: list[tuple[str, float]], top: int = 25) -> dict:
    """Device kernels of one step, (name, seconds) each: how many, their total, by class (count, seconds, the mean),
    and the `top` names by time."""
    by_class: dict[str, dict] = {}
    by_name: dict[str, list[float]] = {}
    for name, sec in kernels:
        c = by_class.setdefault(kernel_class(name), {"count": 0, "s": 0.0})
        c["count"] += 1
        c["s"] += sec
        by_name.setdefault(name, []).append(sec)
    for c in by_class.values():
        c["mean_s"] = c["s"] / c["count"]
    names = sorted(by_name.items(), key=lambda kv: -sum(kv[1]))[:top]
    return {"count": len(kernels), "s": sum(sec for _, sec in kernels), "by_class": by_class,
            "top": [{"name": n[:160], "count": len(v), "s": sum(v)} for n, v in names]}


def count_params(p: dict) -> int:
    h, L, f, v = p["hidden_size"], p["num_layers"], p["ffn_hidden_size"], p["vocab_size"]
    nh, nkv, hd = p["num_attention_heads"], p["num_query_groups"], p["kv_channels"]
    per_layer = h * (nh + 2 * nkv) * hd + nh * hd * h + 3 * h * f + 2 * h + 2 * hd
    return L * per_layer + v * h * (1 if p["tie"] else 2) + h


def _dtype(d) -> str:
    return str(d).replace("torch.", "")


_LAYER = re.compile(r"^(?P<pre>.*?layers)\.(?P<idx>\d+)(?P<rest>(\..*)?)$")
OUTSIDE = "<outside model>"


def module_kind(name: str) -> tuple[str, int | None]:
    """`decoder.layers.3.mlp.linear_fc1` -> (`decoder.layers.*.mlp.linear_fc1`, 3); others -> (name, None)."""
    m = _LAYER.match(name)
    if m is None:
        return name, None
    return f"{m['pre']}.*{m['rest']}", int(m["idx"])


class SavedTensorAccounting:
    """Which module saved how many bytes for the backward during one forward (issue 12 calibration).

    Module pre/post hooks keep a stack of running module names; autograd's pack hook records, per
    underlying storage (first saver wins), its byte size, dtype and the saving module, and returns
    the tensor itself (sizes only are kept, never references). Storages of parameters and of their
    main_grad are skipped; a storage saved by modules of more than one layer (causal mask, RoPE
    tables) goes to the `shared` bucket.
    """

    def __init__(self, root, skip_ptrs: set[int]):
        self.root = root
        self.skip = skip_ptrs
        self.stack: list[str] = []
        self.seen: dict[int, dict] = {}
        self.handles: list = []

    def __enter__(self):
        import torch

        for name, mod in self.root.named_modules():
            label = name or "<root>"
            self.handles.append(mod.register_forward_pre_hook(lambda _m, _a, n=label: self.stack.append(n)))
            try:  # always_call: pop even when a module raises (torch >= 2.0)
                h = mod.register_forward_hook(lambda _m, _a, _o, n=label: self._pop(n), always_call=True)
            except TypeError:
                h = mod.register_forward_hook(lambda _m, _a, _o, n=label: self._pop(n))
            self.handles.append(h)
        self._ctx = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc):
        self._ctx.__exit__(*exc)
        for h in self.handles:
            h.remove()
        self.handles.clear()
        return False

    def _pop(self, name: str) -> None:
        if self.stack and self.stack[-1] == name:
            self.stack.pop()

    def _pack(self, t):
        try:
            st = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # e.g. a sparse or wrapper tensor: nothing to count
            return t
        ptr = st.data_ptr()
        if ptr == 0 or ptr in self.skip:
            return t
        who = self.stack[-1] if self.stack else OUTSIDE
        rec = self.seen.get(ptr)
        if rec is None:
            self.seen[ptr] = {"module": who, "bytes": int(st.nbytes()), "dtype": _dtype(t.dtype),
                              "shape": list(t.shape), "layers": {module_kind(who)[1]}}
        else:
            rec["layers"].add(module_kind(who)[1])
        return t

    def summary(self, tokens: int, num_layers: int, top: int = 15) -> dict:
        """Bytes per module kind (per layer, per token), per layer, outside the layers; layer 0's largest."""
        by_kind: dict[str, int] = {}
        by_layer = [0] * num_layers
        outside: dict[str, int] = {}
        shared: dict[str, int] = {}
        layer0: list[dict] = []
        for rec in self.seen.values():
            kind, idx = module_kind(rec["module"])
            layers = {i for i in rec["layers"] if i is not None}
            if len(layers) > 1:
                shared[kind] = shared.get(kind, 0) + rec["bytes"]
                continue
            if idx is None:
                outside[kind] = outside.get(kind, 0) + rec["bytes"]
                continue
            by_kind[kind] = by_kind.get(kind, 0) + rec["bytes"]
            if 0 <= idx < num_layers:
                by_layer[idx] += rec["bytes"]
            if idx == 0:
                layer0.append({"module": rec["module"], "dtype": rec["dtype"], "shape": rec["shape"],
                               "bytes": rec["bytes"], "bytes_per_token": rec["bytes"] / tokens})
        layer0.sort(key=lambda r: -r["bytes"])
        layer_total = sum(by_kind.values())
        return {
            "tokens": tokens,
            "storages": len(self.seen),
            "per_kind_bytes_per_layer_token": {k: v / num_layers / tokens
                                               for k, v in sorted(by_kind.items())},
            "per_layer_bytes": by_layer,
            "per_layer_bytes_per_token": [b / tokens for b in by_layer],
            "layers_total_bytes": layer_total,
            "outside_layers_bytes_per_token": {k: v / tokens for k, v in sorted(outside.items())},
            "outside_layers_total_bytes": sum(outside.values()),
            "shared_bytes": shared,
            "total_saved_bytes": layer_total + sum(outside.values()) + sum(shared.values()),
            "layer0_largest": layer0[:top],
        }


class _CpuOptimizer:
    """Stands in for Megatron's optimizer in the CPU dry run only (same step() return shape)."""

    def __init__(self, inner):
        self.optimizer = inner

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self):
        import torch

        params = [q for g in self.optimizer.param_groups for q in g["params"]]
        for q in params:  # Megatron DDP accumulates into main_grad
            if getattr(q, "main_grad", None) is not None:
                q.grad = q.main_grad.to(q.dtype)
        norm = torch.nn.utils.clip_grad_norm_(params, 1.0)
        self.optimizer.step()
        return True, float(norm), None


def describe_stack(ddp_model, opt, bf16: bool) -> dict:
    """Versions and what the built model really runs: attention and norm classes, grad dtype, optimizer."""
    import torch

    info: dict = {"torch": torch.__version__, "cuda": torch.version.cuda, "bf16": bf16}
    try:
        import megatron.core as mcore

        info["megatron_core"] = getattr(mcore, "__version__", None)
    except ImportError:
        info["megatron_core"] = None
    if not info["megatron_core"]:
        from importlib.metadata import PackageNotFoundError, version

        try:
            info["megatron_core"] = version("megatron-core")
        except PackageNotFoundError:
            pass

    def cls(obj) -> str | None:
        return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"

    layer = ddp_model.module.decoder.layers[0]
    attn = layer.self_attention
    info["layer0_classes"] = {
        "core_attention": cls(getattr(attn, "core_attention", None)),
        "input_layernorm": cls(getattr(layer, "input_layernorm", None)),
        "q_layernorm": cls(getattr(attn, "q_layernorm", None)),
        "k_layernorm": cls(getattr(attn, "k_layernorm", None)),
        "pre_mlp_layernorm": cls(getattr(layer, "pre_mlp_layernorm", None)),
        "linear_qkv": cls(getattr(attn, "linear_qkv", None)),
        "mlp": cls(getattr(layer, "mlp", None)),
        "final_layernorm": cls(getattr(ddp_model.module.decoder, "final_layernorm", None)),
        "output_layer": cls(getattr(ddp_model.module, "output_layer", None)),
    }
    core = getattr(attn, "core_attention", None)
    unfused = type(core).__name__ == "DotProductAttention"
    info["attention"] = ("local spec: unfused DotProductAttention" if unfused
                         else f"{type(core).__name__} (not the unfused local DotProductAttention)")
    softmax = getattr(core, "scale_mask_softmax", None)
    if softmax is not None:
        info["softmax"] = {"class": cls(softmax),
                           "fusion": getattr(softmax, "scaled_masked_softmax_fusion", None),
                           "softmax_in_fp32": getattr(softmax, "softmax_in_fp32", None)}
    params = list(ddp_model.parameters())
    info["param_dtype"] = _dtype(params[0].dtype)
    grads = {_dtype(q.main_grad.dtype) for q in params if getattr(q, "main_grad", None) is not None}
    info["main_grad_dtypes"] = sorted(grads)
    bufs = getattr(ddp_model, "buffers", None)
    if isinstance(bufs, list | tuple):
        info["ddp_buffer_grad_dtypes"] = sorted({_dtype(getattr(b, "grad_dtype", "?")) for b in bufs})
    info["optimizer_class"] = type(opt).__name__
    inner = getattr(opt, "optimizer", None)
    if inner is not None:
        d = getattr(inner, "defaults", {})
        info["torch_optimizer"] = {"class": type(inner).__name__, "foreach": d.get("foreach"),
                                   "fused": d.get("fused")}
    return info


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="qwen3-1.7b", choices=sorted(PRESETS))
    ap.add_argument("--shapes", default="1x4096,4x2048", help="micro-batch x sequence, comma separated")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--cumem", action="store_true", help="params/grads/optimizer in vime CuMem regions; pause+resume after the steps")
    ap.add_argument("--account", action=argparse.BooleanOptionalAction, default=True,
                    help="one extra untimed step per shape with memory by phase and saved-tensor accounting")
    ap.add_argument("--cpu-bf16", action="store_true",
                    help="CPU dry run: bf16 parameters and activations as on the GPU")
    ap.add_argument("--cast-bf16", action="store_true",
                    help="cast the whole module to bf16 after building it, as Megatron-LM's Float16Module "
                         "and vime's actor do (without it the local spec's torch RMSNorm weights stay fp32)")
    ap.add_argument("--kernels", action="store_true",
                    help="one extra step per shape under torch.profiler: the GPU's kernels by class and the top names")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    if args.kernels and args.device != "cuda":
        ap.error("--kernels times the GPU's kernels; with --device cpu there are none (run it on a GPU, or drop it)")

    import torch
    import torch.nn.functional as F
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.profiler import record_function

    p = PRESETS[args.preset]
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    cuda = args.device == "cuda"
    bf16 = cuda or args.cpu_bf16
    result: dict = {"preset": args.preset, "config": p, "params": count_params(p), "device": args.device,
                    "cumem": args.cumem, "cast_bf16": args.cast_bf16, "argv": sys.argv, "shapes": [],
                    "ok": False}

    def dump() -> None:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if cuda:
        torch.cuda.set_device(0)
    else:
        # Dry run only: Megatron's DDP buffers ask torch.cuda for "the current device".
        torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment]
    torch.distributed.init_process_group("nccl" if cuda else "gloo", init_method=f"tcp://127.0.0.1:{port}",
                                         world_size=1, rank=0)
    parallel_state.initialize_model_parallel(1, 1)
    torch.manual_seed(1234)
    if cuda:
        from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed

        model_parallel_cuda_manual_seed(1234)
    else:
        from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

        get_cuda_rng_tracker().fork = lambda *a, **k: nullcontext()  # dry run: no CUDA RNG to fork

    hook = None
    if args.cumem:
        from vime.real.cumem.torch_hook import trainer_cumem

        hook = trainer_cumem(0)

    def region(tag: str):
        return hook.region(tag) if hook is not None else nullcontext()

    max_seq = max(s for _, s in shapes)
    config = TransformerConfig(
        num_layers=p["num_layers"], hidden_size=p["hidden_size"], num_attention_heads=p["num_attention_heads"],
        num_query_groups=p["num_query_groups"], kv_channels=p["kv_channels"], ffn_hidden_size=p["ffn_hidden_size"],
        normalization="RMSNorm", layernorm_epsilon=1e-6, gated_linear_unit=True, activation_func=F.silu,
        add_bias_linear=False, qk_layernorm=True, hidden_dropout=0.0, attention_dropout=0.0,
        bf16=bf16, params_dtype=torch.bfloat16 if bf16 else torch.float32,
        pipeline_dtype=torch.bfloat16 if bf16 else torch.float32,
        use_cpu_initialization=not cuda, apply_rope_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False, persist_layer_norm=False,
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    t0 = time.perf_counter()
    with region("params"):
        model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=p["vocab_size"],
                         max_sequence_length=max_seq, position_embedding_type="rope", rotary_base=1000000,
                         share_embeddings_and_output_weights=p["tie"])
        if args.cast_bf16 and bf16:
            model = model.to(torch.bfloat16)
        if cuda:
            model.cuda()
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=False, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    with region("grads"):
        model = DistributedDataParallel(config=config, ddp_config=ddp_config, module=model)
    opt_config = OptimizerConfig(optimizer="adam", lr=1e-5, weight_decay=0.01, bf16=cuda,
                                 use_distributed_optimizer=False, clip_grad=1.0)
    with region("optimizer"):
        if cuda:
            opt = get_megatron_optimizer(opt_config, [model])
        else:  # dry run: Megatron's optimizer wrappers put their loss scale on "cuda"
            opt = _CpuOptimizer(torch.optim.AdamW(model.parameters(), lr=1e-5))
        inner = getattr(opt, "optimizer", None)
        result["torch_optimizer"] = type(inner).__name__
        if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            # Adam state up front, inside its tag (torch would create it lazily in the first step)
            for group in inner.param_groups:
                for prm in group["params"]:
                    inner.state[prm] = {"step": torch.tensor(0.0), "exp_avg": torch.zeros_like(prm),
                                        "exp_avg_sq": torch.zeros_like(prm)}
    if cuda:
        torch.cuda.synchronize()
        result["state_bytes_after_init"] = torch.cuda.memory_allocated()
        if hook is not None:
            result["cumem_bytes_by_tag"] = {t: hook.allocator.allocated_bytes(t) for t in ("params", "grads", "optimizer")}
    result["build_s"] = time.perf_counter() - t0
    result["software"] = describe_stack(model, opt, bf16)
    dump()

    def sync() -> None:
        if cuda:
            torch.cuda.synchronize()

    dev = torch.device(args.device)
    gen = torch.Generator(device="cpu").manual_seed(7)

    def one_step(mbs: int, seq: int) -> dict:
        ids = torch.randint(0, p["vocab_size"], (mbs, seq), generator=gen).to(dev)
        labels = torch.roll(ids, -1, dims=1)
        pos = torch.arange(seq, device=dev).unsqueeze(0).expand(mbs, -1)
        sync()
        t0 = time.perf_counter()
        model.zero_grad_buffer()
        opt.zero_grad()
        # On the GPU Megatron builds the causal mask itself; its helper hard-codes "cuda".
        mask = None if cuda else torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)
        with record_function("step_fwd"):  # the phases --kernels splits the kernels by
            out = model(ids, pos, mask, labels=labels)
            loss = out.float().mean()
            sync()
        t1 = time.perf_counter()
        with record_function("step_bwd"):
            loss.backward()
            # One rank: the data-parallel all-reduce is the identity (scale 1/dp = 1). It is skipped
            # because NCCL's own cudaMallocAsync failed on the H200 once PyTorch's cache held the
            # activations of a 4096-token step ("Failed to CUDA calloc async 4 bytes").
            if torch.distributed.get_world_size() > 1:
                model.finish_grad_sync()
            sync()
        t2 = time.perf_counter()
        with record_function("step_opt"):
            ok, grad_norm, _ = opt.step()
            sync()
        t3 = time.perf_counter()
        return {"fwd_s": t1 - t0, "bwd_s": t2 - t1, "opt_s": t3 - t2, "step_s": t3 - t0,
                "loss": float(loss.item()), "grad_norm": float(grad_norm or 0.0), "update_ok": bool(ok)}

    # Storages the accounting leaves out: the weights and their gradient buffers (not activations).
    weight_ptrs: set[int] = set()
    for prm in model.parameters():
        weight_ptrs.add(prm.untyped_storage().data_ptr())
        if getattr(prm, "main_grad", None) is not None:
            weight_ptrs.add(prm.main_grad.untyped_storage().data_ptr())

    def accounted_step(mbs: int, seq: int) -> dict:
        """One untimed step: memory_allocated/peaks by phase (CUDA), what the forward saved for backward."""
        ids = torch.randint(0, p["vocab_size"], (mbs, seq), generator=gen).to(dev)
        labels = torch.roll(ids, -1, dims=1)
        pos = torch.arange(seq, device=dev).unsqueeze(0).expand(mbs, -1)
        mask = None if cuda else torch.triu(torch.ones(1, 1, seq, seq, dtype=torch.bool), diagonal=1)
        model.zero_grad_buffer()
        opt.zero_grad()
        mem: dict = {}

        def mark(key: str) -> None:
            if cuda:
                torch.cuda.synchronize()
                mem[key] = torch.cuda.memory_allocated()

        def phase_peak(key: str) -> None:
            if cuda:
                torch.cuda.synchronize()
                mem[key] = torch.cuda.max_memory_allocated()
                torch.cuda.reset_peak_memory_stats()

        mark("allocated_before_forward")
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        acct = SavedTensorAccounting(model.module, weight_ptrs)
        with acct:
            out = model(ids, pos, mask, labels=labels)
            loss = out.float().mean()
        mark("allocated_after_forward")
        phase_peak("peak_forward")
        loss.backward()
        if torch.distributed.get_world_size() > 1:
            model.finish_grad_sync()
        del out
        mark("allocated_after_backward")
        phase_peak("peak_backward")
        opt.step()
        mark("allocated_after_optimizer")
        phase_peak("peak_optimizer")
        summary = acct.summary(mbs * seq, p["num_layers"])
        if cuda:
            mem["forward_kept_bytes"] = mem["allocated_after_forward"] - mem["allocated_before_forward"]
            mem["forward_kept_bytes_per_token"] = mem["forward_kept_bytes"] / (mbs * seq)
            mem["saved_minus_kept_bytes"] = summary["total_saved_bytes"] - mem["forward_kept_bytes"]
        return {"memory": mem, "saved": summary, "loss": float(loss.item())}

    for mbs, seq in shapes:
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        try:
            for _ in range(args.warmup):
                one_step(mbs, seq)
            steps = [one_step(mbs, seq) for _ in range(args.steps)]
        except torch.cuda.OutOfMemoryError as e:
            # A shape that does not fit is a result too (the simulator predicts it): record it, go on.
            result.setdefault("oom", []).append({
                "mbs": mbs, "seq": seq, "error": str(e)[:400],
                "max_allocated_bytes": torch.cuda.max_memory_allocated(),
                "total_bytes": torch.cuda.get_device_properties(0).total_memory})
            print(f"megatron {args.preset} mbs={mbs} seq={seq}: out of memory", flush=True)
            model.zero_grad_buffer()
            opt.zero_grad()
            torch.cuda.empty_cache()
            dump()
            continue
        entry = {"mbs": mbs, "seq": seq, **flops_per_step(p, mbs, seq), "steps": steps}
        for k in ("fwd_s", "bwd_s", "opt_s", "step_s"):
            entry[k + "_median"] = statistics.median(s[k] for s in steps)
        if cuda:
            entry["peak_allocated_bytes"] = torch.cuda.max_memory_allocated()
            entry["peak_reserved_bytes"] = torch.cuda.max_memory_reserved()
            entry["tflops_fwd_bwd"] = entry["fwd_bwd_flops"] / (entry["fwd_s_median"] + entry["bwd_s_median"]) / 1e12
        if args.account:
            entry["accounting"] = accounted_step(mbs, seq)
        if args.kernels:
            from torch.autograd import DeviceType
            from torch.profiler import ProfilerActivity, profile

            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                one_step(mbs, seq)
            events = prof.events()
            # each phase ends in a synchronize, so its kernels start inside its CPU range
            ranges = {e.name[5:]: (e.time_range.start, e.time_range.end) for e in events
                      if e.name in PHASES and e.device_type != DeviceType.CUDA}
            entry["kernels"] = {}
            for phase, (lo, hi) in ranges.items():
                entry["kernels"][phase] = kernel_table([
                    (e.name, e.time_range.elapsed_us() / 1e6) for e in events  # not the ranges' own GPU mirror
                    if e.device_type == DeviceType.CUDA and lo <= e.time_range.start <= hi and e.name not in PHASES])
            print("  kernels: " + ", ".join(f"{ph} {k['count']} in {k['s'] * 1e3:.1f} ms" for ph, k in
                                            entry["kernels"].items()), flush=True)
        result["shapes"].append(entry)
        print(f"megatron {args.preset} mbs={mbs} seq={seq}: fwd {entry['fwd_s_median'] * 1e3:.1f} ms "
              f"bwd {entry['bwd_s_median'] * 1e3:.1f} ms opt {entry['opt_s_median'] * 1e3:.1f} ms "
              f"loss {steps[-1]['loss']:.4f}", flush=True)
        dump()

    if hook is not None:
        alloc = hook.allocator
        mbs, seq = shapes[0]
        cycles = []
        for c in range(3):
            sync()
            free0 = torch.cuda.mem_get_info()[0]
            ps = alloc.pause()
            free1 = torch.cuda.mem_get_info()[0]
            rs = alloc.resume()
            after = one_step(mbs, seq)
            cycles.append({"cycle": c, "pause": ps.as_dict(), "resume": rs.as_dict(),
                           "device_freed_bytes": free1 - free0, "step_after": after})
            print(f"cumem cycle {c}: pause {ps.seconds:.3f}s ({ps.gib_per_s:.1f} GiB/s, host alloc "
                  f"{ps.host_alloc_seconds:.2f}s) resume {rs.seconds:.3f}s ({rs.gib_per_s:.1f} GiB/s) "
                  f"freed {(free1 - free0) / 2**30:.1f} GiB loss after {after['loss']:.4f}", flush=True)
        result["cumem_cycles"] = cycles
    result["ok"] = True
    dump()
    torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    sys.exit(main())
