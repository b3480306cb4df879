"""The protocol conformance suites (DESIGN.md: one suite per protocol, run against every implementation).

`engine` (RolloutEngine), `allocator` (Allocator) and `trainer` (Trainer) each hold factory-driven
`check_*` functions and `ALL_CHECKS`; a test module per implementation writes the factory and
parametrises over the checks. Importable as `conformance.*` from any test module because
tests/conftest.py puts tests/ on sys.path (pytest's rootdir-relative `prepend` import mode).
"""

import pytest

# The checks are plain asserts in non-test modules: ask pytest to rewrite them too, so a failing
# check shows the compared values (must run before the submodules are imported).
pytest.register_assert_rewrite("conformance.engine", "conformance.allocator", "conformance.trainer")
