"""Real backends: vLLM HTTP client, launcher and router, Megatron actors on Ray, CuMem allocator. Heavy imports stay lazy."""
