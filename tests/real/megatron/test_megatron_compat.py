"""The CPU compatibility layer for megatron-core 0.16.1: what it redirects, that it undoes itself, and its version pin."""

from __future__ import annotations

import warnings

import pytest
import torch

from vime.errors import TrainerError
from vime.real.megatron import compat

pytestmark = pytest.mark.megatron


def test_megatron_imports_without_warnings():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        mcore = compat.import_megatron()
    assert mcore.__version__ == compat.PINNED_MEGATRON_VERSION


def test_other_megatron_versions_are_refused_on_cpu():
    with pytest.raises(TrainerError, match="0.16.1"):
        compat.check_version("0.17.0")
    compat.check_version(compat.PINNED_MEGATRON_VERSION)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the layer applies only without CUDA")
def test_cuda_placements_land_on_the_cpu_inside_and_fail_outside():
    compat.import_megatron()
    original = torch.cuda.current_device
    with compat.cpu_compat() as applied:
        assert applied and compat.is_installed()
        assert torch.zeros(3, device="cuda").device.type == "cpu"
        assert torch.tensor([1.0], device=torch.device("cuda", 0)).device.type == "cpu"
        assert torch.empty(2, device=torch.cuda.current_device()).device.type == "cpu"
        x = torch.ones(2)
        assert x.cuda() is x
        assert x.to("cuda").device.type == "cpu"
        assert x.type() == "torch.cuda.FloatTensor"  # Megatron's optimizer dtype checks
        assert x.type(torch.float64).dtype == torch.float64  # a conversion is left alone
        torch.cuda.synchronize()
    assert not compat.is_installed()
    assert torch.cuda.current_device is original
    assert torch.ones(1).type() == "torch.FloatTensor"
    with pytest.raises((AssertionError, RuntimeError)):
        torch.zeros(1, device="cuda")


@pytest.mark.skipif(torch.cuda.is_available(), reason="the layer applies only without CUDA")
def test_installs_nest_and_the_last_uninstall_restores():
    compat.import_megatron()
    from megatron.core.tensor_parallel import random as mrandom

    before = mrandom._CUDA_RNG_STATE_TRACKER
    assert compat.install() and compat.install()
    compat.uninstall()
    assert compat.is_installed()
    assert isinstance(mrandom.get_cuda_rng_tracker(), compat.CpuRngStatesTracker)
    compat.uninstall()
    assert not compat.is_installed() and mrandom._CUDA_RNG_STATE_TRACKER is before


def test_cpu_rng_tracker_forks_a_stream_without_touching_the_default_one():
    tracker = compat.CpuRngStatesTracker()
    tracker.add(compat.MODEL_PARALLEL_RNG, 123)
    torch.manual_seed(0)
    with tracker.fork():
        a = torch.rand(3)
    after_fork = torch.rand(3)
    torch.manual_seed(0)
    assert torch.equal(torch.rand(3), after_fork)  # the default stream did not advance
    again = compat.CpuRngStatesTracker()
    again.add(compat.MODEL_PARALLEL_RNG, 123)
    with again.fork():
        assert torch.equal(torch.rand(3), a)  # same seed, same stream
    with pytest.raises(TrainerError, match="already registered"):
        tracker.add(compat.MODEL_PARALLEL_RNG, 5)
    with pytest.raises(TrainerError, match="never added"):
        with tracker.fork("other"):
            pass
