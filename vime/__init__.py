"""vime: RL post-training whose step orchestration runs on real GPUs or in a simulator of GPU memory and timing."""

__version__ = "0.1.0"
