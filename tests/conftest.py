"""Test-wide settings: hypothesis without wall-clock deadlines (CI shares 2 cores; timing is not what we test)."""

from hypothesis import HealthCheck, settings

settings.register_profile("vime", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("vime")
