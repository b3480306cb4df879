"""Megatron-core trainer: GPTModel from HF configs, Ray actors running the GRPO loss, the Trainer protocol over them.

Megatron, Ray and transformers are imported lazily inside the modules that need them.
"""
