"""Simulated backends: a virtual clock shared by asyncio and simpy, and models of GPU memory and timing."""
