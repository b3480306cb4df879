"""The saved-for-backward accounting of bench/megatron_step.py (issue 12): its bookkeeping on a toy module, and a real Megatron step on the CPU."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.megatron

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "bench" / "megatron_step.py"
SHAPES = [(1, 32), (1, 64), (2, 32)]


def _load_script():
    spec = importlib.util.spec_from_file_location("megatron_step_under_test", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_module_kind_replaces_the_layer_index_only():
    ms = _load_script()
    assert ms.module_kind("decoder.layers.12.self_attention.core_attention") == (
        "decoder.layers.*.self_attention.core_attention", 12)
    assert ms.module_kind("decoder.layers.0") == ("decoder.layers.*", 0)
    assert ms.module_kind("decoder.final_layernorm") == ("decoder.final_layernorm", None)
    assert ms.module_kind("output_layer") == ("output_layer", None)


class _Block(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.fc = torch.nn.Linear(width, 2 * width, bias=False)

    def forward(self, x):
        y = self.fc(x)
        a, b = torch.chunk(y, 2, dim=-1)
        return torch.nn.functional.silu(a) * b  # silu keeps a (a view of y), mul keeps silu(a) and b


class _Toy(torch.nn.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.layers = torch.nn.ModuleList(_Block(width) for _ in range(layers))
        self.head = torch.nn.Linear(width, 3, bias=False)

    def forward(self, x):
        for blk in self.layers:
            x = blk(x)
        return self.head(x)


def test_accounting_counts_each_storage_once_skips_weights_and_groups_by_module():
    ms = _load_script()
    torch.manual_seed(0)
    width, layers, tokens = 8, 3, 5
    model = _Toy(width, layers)
    weights = {q.untyped_storage().data_ptr() for q in model.parameters()}
    x = torch.randn(tokens, width, requires_grad=True)
    with ms.SavedTensorAccounting(model, weights) as acct:
        out = model(x)
    assert not acct.handles and not acct.stack  # hooks removed, every module popped
    out.sum().backward()  # the pack hook handed autograd the tensors themselves
    assert x.grad is not None and x.grad.shape == x.shape
    s = acct.summary(tokens, layers)
    f32 = 4
    # per layer: fc's input (tokens·width), y (shared by the silu and mul views: 2·width), silu(a) (width)
    per_layer = tokens * width * f32 * (1 + 2 + 1)
    assert s["per_layer_bytes"] == [per_layer] * layers
    assert s["per_kind_bytes_per_layer_token"] == {
        "layers.*": tokens * 3 * width * f32 / tokens,
        "layers.*.fc": tokens * width * f32 / tokens,
    }
    # the head keeps its input (the last block's output); no weight storage is counted anywhere
    assert s["outside_layers_bytes_per_token"] == {"head": width * f32}
    assert s["total_saved_bytes"] == layers * per_layer + tokens * width * f32
    assert all(r["module"].startswith("layers.0") for r in s["layer0_largest"])


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("mstep") / "step.json"
    shapes = ",".join(f"{b}x{s}" for b, s in SHAPES)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--shapes", shapes,
         "--steps", "1", "--warmup", "0", "--out", str(out)],
        cwd=ROOT, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_the_step_records_its_software_stack(tiny_run):
    sw = tiny_run["software"]
    assert tiny_run["ok"]
    assert sw["megatron_core"] and sw["torch"] == torch.__version__
    assert sw["attention"] == "local spec: unfused DotProductAttention"
    assert sw["layer0_classes"]["core_attention"].endswith(".DotProductAttention")
    assert sw["main_grad_dtypes"] == ["float32"]  # the fp32 dry run
    for entry in tiny_run["shapes"]:  # the timed steps stay as before, the accounted step is extra
        assert len(entry["steps"]) == 1 and entry["fwd_s_median"] > 0


def test_every_layer_saves_the_same_and_the_buckets_add_up(tiny_run):
    layers = tiny_run["config"]["num_layers"]
    for entry in tiny_run["shapes"]:
        s = entry["accounting"]["saved"]
        tokens = entry["mbs"] * entry["seq"]
        assert s["tokens"] == tokens
        assert len(set(s["per_layer_bytes"])) == 1 and s["per_layer_bytes"][0] > 0
        by_kind = sum(s["per_kind_bytes_per_layer_token"].values()) * layers * tokens
        assert by_kind == pytest.approx(sum(s["per_layer_bytes"]))
        assert s["layers_total_bytes"] == sum(s["per_layer_bytes"])
        assert s["outside_layers_total_bytes"] > 0  # embedding, final norm, output layer, loss
        assert s["total_saved_bytes"] == (s["layers_total_bytes"] + s["outside_layers_total_bytes"]
                                          + sum(s["shared_bytes"].values()))
        sizes = [r["bytes"] for r in s["layer0_largest"]]
        assert sizes == sorted(sizes, reverse=True) and len(sizes) > 5


def test_score_buckets_scale_with_batch_times_s_squared_and_the_rest_with_tokens(tiny_run):
    layers = tiny_run["config"]["num_layers"]
    totals = {}
    for entry in tiny_run["shapes"]:
        tokens = entry["mbs"] * entry["seq"]
        kinds = entry["accounting"]["saved"]["per_kind_bytes_per_layer_token"]
        totals[(entry["mbs"], entry["seq"])] = {k: v * layers * tokens for k, v in kinds.items()}
    soft = "decoder.layers.*.self_attention.core_attention.scale_mask_softmax"
    base = totals[(1, 32)][soft]
    assert base > 0
    assert totals[(1, 64)][soft] == 4 * base  # s² per sequence
    assert totals[(2, 32)][soft] == 2 * base  # and one matrix per sequence
    # a per-token bucket (the MLP output projection keeps its input) grows with tokens only
    fc2 = "decoder.layers.*.mlp.linear_fc2"
    assert totals[(1, 64)][fc2] == 2 * totals[(1, 32)][fc2] == totals[(2, 32)][fc2] > 0


def test_kernel_table_classes_counts_and_ranks_the_kernels():
    ms = _load_script()
    table = ms.kernel_table([("sm90_xmma_gemm_bf16", 3e-4), ("vectorized_elementwise_kernel<mul>", 1e-5),
                             ("vectorized_elementwise_kernel<mul>", 3e-5), ("cunn_SoftMaxForward", 2e-4),
                             ("reduce_kernel<sum>", 5e-5), ("weird_kernel", 1e-6)], top=2)
    assert table["count"] == 6 and table["s"] == pytest.approx(5.91e-4)
    assert table["by_class"]["gemm"] == {"count": 1, "s": 3e-4, "mean_s": 3e-4}
    assert table["by_class"]["elementwise"]["count"] == 2
    assert table["by_class"]["elementwise"]["mean_s"] == pytest.approx(2e-5)
    assert table["by_class"]["softmax"]["s"] == 2e-4 and table["by_class"]["other"]["count"] == 1
    assert [t["name"] for t in table["top"]] == ["sm90_xmma_gemm_bf16", "cunn_SoftMaxForward"]


def test_kernels_on_a_cpu_is_refused_naming_the_flag(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", "--preset", "tiny", "--kernels",
                          "--out", str(tmp_path / "x.json")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "--kernels" in out.stderr and "--device cpu" in out.stderr
    assert not (tmp_path / "x.json").exists()
