"""Fixtures shipped with the package for tests, scripts and the CPU demo (a tiny local model); not used by a run."""
