"""Real backends: `vllm/` (client, router, launcher), `weights/` (IPC, disk), `megatron/` (actors on Ray), `cumem/`, the session. Heavy imports stay lazy."""
