"""CUDA-IPC weight export on a GPU: a second process (spawned, as a vLLM worker is) opens every bucket's handles and reads back the exact bytes (seed steps 48–50)."""

from __future__ import annotations

import base64
import pickle

import pytest
import torch

from vime.real.weights import ipc as iw


def _receiver(inbox, outbox) -> None:
    """A stand-in vLLM worker: for each update_info it looks up its GPU's UUID, rebuilds every tensor
    with its own device index and copies it out (vLLM's load_weights copies too), then replies = ack."""
    try:
        while True:
            msg = inbox.get()
            if msg is None:
                return
            if msg == "ping":
                outbox.put("pong")
                continue
            info = pickle.loads(base64.b64decode(msg))
            uuid = iw.device_uuid(0)
            out = {}
            for name, handles in zip(info["names"], info["ipc_handles"], strict=True):
                t = iw.open_handle(handles[uuid], 0)
                assert list(t.shape) == info["shapes"][info["names"].index(name)]
                out[name] = t.cpu().reshape(-1).view(torch.uint8).numpy().tobytes()
            torch.cuda.synchronize()
            outbox.put(out)
    except BaseException as exc:  # the parent must see the failure, not a timeout
        outbox.put(("error", repr(exc)))


def _start():
    ctx = torch.multiprocessing.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receiver, args=(inbox, outbox), daemon=True)
    proc.start()
    return proc, inbox, outbox


def _stop(proc, inbox) -> None:
    inbox.put(None)
    proc.join(60)
    if proc.is_alive():
        proc.kill()
        proc.join(10)


def test_the_receiver_process_starts_under_spawn():
    """The plumbing of the GPU test (spawned child importing this module), checked on any machine."""
    proc, inbox, outbox = _start()
    try:
        inbox.put("ping")
        assert outbox.get(timeout=120) == "pong"
    finally:
        _stop(proc, inbox)
    assert proc.exitcode == 0


def _state(seed: int) -> dict[str, torch.Tensor]:
    """About 40 MB of HF-named tensors on the host (as the trainer's backup is), mixed dtypes and odd sizes."""
    g = torch.Generator().manual_seed(seed)
    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": torch.randn(1000, 1024, generator=g).to(torch.bfloat16)}
    for i in range(4):
        out[f"model.layers.{i}.self_attn.qkv_proj.weight"] = torch.randn(1536, 1024, generator=g).to(torch.bfloat16)
        out[f"model.layers.{i}.input_layernorm.weight"] = torch.randn(1024, generator=g)
        out[f"model.layers.{i}.mlp.down_proj.weight"] = torch.randn(1024, 2731, generator=g).to(torch.float16)
        out[f"model.layers.{i}.scale"] = torch.randn((), generator=g)
    out["model.norm.weight"] = torch.randn(1023, generator=g).to(torch.bfloat16)
    return out


def _raw(t: torch.Tensor) -> bytes:
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _publish(ex: iw.IpcExporter, state, bucket_bytes: int, inbox, outbox) -> tuple[int, dict[str, bytes]]:
    """One export as MegatronTrainer._export_ipc drives it: stage i after the receiver acked i-1."""
    plan = ex.begin(state, bucket_bytes)
    got: dict[str, bytes] = {}
    prev = None
    for layout in plan:
        bucket = iw.fill_bucket(layout, [ex.stage(layout.index, prev)])
        iw.check_coverage(bucket, {iw.device_uuid(0)})
        info = bucket.update_info()
        info["ipc_handles"] = bucket.ipc_handles
        inbox.put(base64.b64encode(pickle.dumps(info)))
        reply = outbox.get(timeout=120)
        assert not isinstance(reply, tuple), reply
        got.update(reply)
        prev = layout.index
    ex.end(prev)
    return len(plan), got


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_handles_opened_in_a_second_process_reproduce_the_bytes():
    proc, inbox, outbox = _start()
    try:
        ex = iw.IpcExporter(torch.device("cuda", 0))
        for step, seed in enumerate((1, 2)):  # two steps: new weights through the same staging buffer
            state = _state(seed)
            n, got = _publish(ex, state, 8 << 20, inbox, outbox)
            assert n >= 4  # several buckets, so the buffer really is overwritten between them
            assert set(got) == set(state)
            for name, t in state.items():
                assert got[name] == _raw(t), f"step {step}: {name} differs after the IPC round trip"
            if step == 0:
                base = ex.staging.buffer.data_ptr()
        assert ex.staging.allocations == 1 and ex.staging.buffer.data_ptr() == base
    finally:
        _stop(proc, inbox)
    assert proc.exitcode == 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_qkv_cut_on_the_gpu_reaches_the_engine_as_the_host_split():
    """The fused QKV crosses pinned and whole, q, k, v are cut in the staging buffer: the engine reads the host split's bytes."""
    from vime.real.megatron import model as mmodel

    spec = mmodel.ModelSpec(model_type="qwen3", vocab_size=64, hidden_size=1024, intermediate_size=2048, num_layers=2,
                            num_heads=16, num_kv_heads=4, head_dim=64, rms_norm_eps=1e-6, rope_theta=1e6,
                            max_position_embeddings=128, tie_word_embeddings=True, qk_norm=True, qkv_bias=False)
    g = torch.Generator().manual_seed(5)
    host: dict[str, torch.Tensor] = {}
    cut: dict[str, object] = {}
    for i in range(2):
        fused = torch.randn((16 + 2 * 4) * 64, 1024, generator=g).to(torch.bfloat16).pin_memory()
        name = f"decoder.layers.{i}.self_attention.linear_qkv.weight"
        host.update(mmodel.megatron_to_hf(spec, name, fused))
        cut.update(mmodel.megatron_to_hf(spec, name, fused, cut_on_device=True))
        down = torch.randn(1024, 2048, generator=g).to(torch.bfloat16).pin_memory()
        host[f"model.layers.{i}.mlp.down_proj.weight"] = cut[f"model.layers.{i}.mlp.down_proj.weight"] = down
    proc, inbox, outbox = _start()
    try:
        ex = iw.IpcExporter(torch.device("cuda", 0))
        n, got = _publish(ex, cut, 3 << 20, inbox, outbox)
        assert n >= 3 and set(got) == set(host)
        for name, t in host.items():
            assert got[name] == _raw(t), f"{name} differs from the host split"
    finally:
        _stop(proc, inbox)
    assert proc.exitcode == 0
