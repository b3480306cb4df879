"""JSON Schemas of what `vime simulate --json` prints (``vime.simulate/1.3``) and of its trace file, for validation."""

from __future__ import annotations

from typing import Any

_NUM = {"type": "number"}
_NUM_OR_NULL = {"type": ["number", "null"]}
_PHASES = ["rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv"]

SIMULATE_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["schema", "vime_version", "config", "hardware", "model", "startup", "steps", "summary",
                 "rollout", "memory", "verdict", "uncertainty"],
    "properties": {
        "schema": {"const": "vime.simulate/1.3"},
        "vime_version": {"type": "string"},
        "config": {"type": "object", "required": ["rollout_batch_size", "n_samples_per_prompt", "global_batch_size",
                                                  "tensor_model_parallel_size", "data_parallel_size"]},
        "hardware": {"type": "object", "required": ["name", "memory_gib", "bf16_tflops", "hbm_tb_per_s"]},
        "model": {"type": "object", "required": ["name", "params_b", "layers", "hidden_size"]},
        "startup": {"type": ["object", "null"]},
        "steps": {"type": "array", "items": {
            "type": "object", "required": ["rollout_id", "phases", "t_gap", "t_step", "metrics"],
            "properties": {"phases": {"type": "object", "required": _PHASES,
                                      "additionalProperties": _NUM},
                           "t_step": _NUM, "t_gap": _NUM,
                           "metrics": {"type": "object", "additionalProperties": _NUM}}}},
        "summary": {"type": "object", "required": ["t_step", "phases"], "properties": {
            "t_step": _NUM,
            "phases": {"type": "object", "required": _PHASES, "additionalProperties": {
                "type": "object", "required": ["seconds", "percent"],
                "properties": {"seconds": _NUM, "percent": _NUM}}}}},
        "rollout": {"type": "object", "required": ["tokens_generated", "tokens_per_s_per_gpu", "longest_sample_tokens",
                                                   "engine_busy_share", "kv_blocks_total", "kv_blocks_peak",
                                                   "kv_blocks_used_share", "preemptions"]},
        "memory": {"type": "object", "required": ["gpus", "host_pinned_peak_gib"], "properties": {
            "gpus": {"type": "array", "items": {
                "type": "object",
                "required": ["gpu", "capacity_gib", "peak_gib", "headroom_gib", "peak_phase", "by_owner_tag_gib",
                             "tag_peaks_gib", "phase_peaks_gib"],
                "properties": {"by_owner_tag_gib": {"type": "object", "additionalProperties": _NUM},
                               "tag_peaks_gib": {"type": "object", "additionalProperties": _NUM},
                               "phase_peaks_gib": {"type": "object", "additionalProperties": _NUM}}}},
            "host_pinned_peak_gib": _NUM}},
        "verdict": {"type": "object", "required": ["fits", "oom", "fixes", "at_risk"], "properties": {
            "fits": {"type": "boolean"}, "at_risk": {"type": "boolean"},
            "oom": {"oneOf": [{"type": "null"}, {"type": "object", "required": [
                "phase", "gpu", "owner", "tag", "requested_gib", "free_gib", "short_by_gib", "time_s"]}]},
            "fixes": {"type": "array", "items": {"type": "string"}},
            "fix_results": {"type": "array", "items": {"type": "object", "required": ["fix", "changes", "fits", "result"],
                                                        "properties": {"fits": {"type": "boolean"},
                                                                       "t_step_s": {"type": ["number", "null"]}}}}}},
        "uncertainty": {"type": "object", "required": ["basis", "note", "phases", "t_step", "memory", "quantities"],
                        "properties": {
            "memory": {"type": "object", "required": ["rests_on", "low_factor", "high_factor", "gpus"], "properties": {
                "low_factor": _NUM_OR_NULL, "high_factor": _NUM_OR_NULL,
                "gpus": {"type": "array", "items": {"type": "object",
                                                    "required": ["gpu", "peak_low_gib", "peak_high_gib", "high_phase",
                                                                 "high_factor", "at_risk"],
                                                    "properties": {"at_risk": {"type": "boolean"}}}}}},
            "basis": {"type": ["string", "null"]},
            "phases": {"type": "object", "required": _PHASES, "additionalProperties": {
                "type": "object", "required": ["low_s", "high_s", "low_factor", "high_factor", "rests_on", "unmeasured"],
                "properties": {k: _NUM_OR_NULL for k in ("low_s", "high_s", "low_factor", "high_factor")}
                | {"rests_on": {"type": "array", "items": {"type": "string"}},
                   "unmeasured": {"type": "array", "items": {"type": "string"}}, "why": {"type": "string"}}}},
            "t_step": {"oneOf": [{"type": "null"}, {"type": "object", "required": ["low_s", "high_s", "unbanded"]}]},
            "quantities": {"type": "object", "additionalProperties": {
                "type": "object", "required": ["low", "high", "rows", "source"]}}}},
        "async": {"type": "object", "required": ["mode", "all", "steady"], "properties": {
            "mode": {"enum": ["one-step-off", "fully-async"]}, "warmup_steps": {"type": "integer"},
            "all": {"type": "object", "additionalProperties": _NUM},
            "steady": {"type": "object", "additionalProperties": _NUM}}},
        "wall_s": _NUM,
    },
}

TRACE_EVENT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["ph", "pid", "tid"],
    "properties": {
        "ph": {"enum": ["B", "E", "C", "i", "M"]},
        "pid": {"type": "integer"}, "tid": {"type": "integer"}, "ts": _NUM, "name": {"type": "string"},
        "args": {"type": "object"},
    },
    "allOf": [{"if": {"properties": {"ph": {"enum": ["B", "E", "C", "i"]}}}, "then": {"required": ["ts", "name"]}}],
}
