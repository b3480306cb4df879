"""Test-wide settings: hypothesis without wall-clock deadlines (CI shares 2 cores; timing is not what we test), no inherited RAY_ADDRESS."""

import os

from hypothesis import HealthCheck, settings

# a test joins only a Ray cluster it started itself (and names): a RAY_ADDRESS inherited from the
# shell would send `vime train` runs, here and in their subprocesses, to someone else's cluster
os.environ.pop("RAY_ADDRESS", None)

settings.register_profile("vime", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("vime")
