"""Rollout: data source, asyncio generate loop, reward hub, filters and the batch builder."""
