"""Weight transports from the trainer to the engines: CUDA IPC buckets (colocated GPUs) and HF checkpoints on disk."""
