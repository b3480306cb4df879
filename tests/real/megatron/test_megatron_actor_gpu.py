"""One Megatron rank on a GPU, in process (NCCL, bf16, no compat layer): HF load, GRPO steps, export, sleep/wake."""

from __future__ import annotations

import pytest
import torch
from megatron_rollouts import CHOSEN, eval_rows, synthetic_batch

pytestmark = [pytest.mark.gpu, pytest.mark.megatron,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              # In process, megatron-core's environment warnings (no TE/Apex, CUDA_DEVICE_MAX_CONNECTIONS,
              # deprecated collectives) reach pytest, which turns warnings into errors.
              pytest.mark.filterwarnings("ignore::UserWarning:megatron"),
              pytest.mark.filterwarnings("ignore::FutureWarning:torch.distributed"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]


@pytest.fixture(scope="module")
def actor(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from vime.real.megatron import model as mmodel
    from vime.real.megatron.actor import ActorConfig, MegatronActor, free_port

    path = tmp_path_factory.mktemp("tiny")
    cfg = Qwen3Config(vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                      tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen3ForCausalLM(cfg).save_pretrained(path)
    a = MegatronActor(ActorConfig(hf_config=mmodel.load_hf_config(str(path)), hf_checkpoint=str(path), lr=2e-3,
                                  offload_backend="cumem"), 0, 1)
    info = a.setup("127.0.0.1", free_port())
    assert info["offload_backend"] == "cumem"
    a.hf_dir = path
    return a


def test_gpu_rank_loads_hf_trains_exports_and_sleeps(actor):
    from transformers import Qwen3ForCausalLM

    assert actor.cfg.torch_dtype == torch.bfloat16
    rows = eval_rows()
    hf = Qwen3ForCausalLM.from_pretrained(str(actor.hf_dir), dtype=torch.bfloat16).cuda().eval()
    with torch.no_grad():
        want = hf(torch.tensor(rows, device="cuda")).logits.float().cpu()
    got = actor.full_logits(rows)
    torch.testing.assert_close(got, want, atol=5e-2, rtol=5e-2)

    before = float(torch.softmax(got[:, -1], -1)[:, CHOSEN].mean())
    for rid in range(4):
        m = actor.train(rid, synthetic_batch(rid, global_batch_size=8).for_rank(0))
        assert m["grad_norm"] > 0
    logits = actor.full_logits(rows)
    assert float(torch.softmax(logits[:, -1], -1)[:, CHOSEN].mean()) > 1.5 * before

    buckets = actor.export_weights(1 << 20)
    exported = {n: t for b in buckets for n, t in b.tensors.items()}
    state = actor.hf_state(from_backup=False)
    assert exported.keys() == state.keys()
    assert all(torch.equal(exported[n].cpu(), state[n].cpu()) for n in state)

    info = actor.sleep()
    assert info["offloaded_bytes"] > 0
    actor.wake_up()
    torch.testing.assert_close(actor.full_logits(rows), logits)
    print("GPU figures", m, actor.memory())
