"""The shared lifecycle tables and tag rules of vime.protocols (the same for sim and real)."""

import pytest

from vime.errors import LifecycleError, UnknownTagError
from vime.protocols import (
    AllocatorLifecycle,
    EngineLifecycle,
    EngineMemory,
    TagState,
    TrainerLifecycle,
    TrainerState,
    normalize_wake_tags,
    sleep_offload_tags,
)


def test_wake_tags_normalised_as_seed_steps_10_to_13():
    assert normalize_wake_tags(["kv_cache", "cuda_graph"]) == ["kv_cache"]
    assert normalize_wake_tags(["weights"]) == ["weights"]
    assert normalize_wake_tags(["kv_cache", "weights"]) == ["weights", "kv_cache"]
    assert normalize_wake_tags(None) is None


def test_unknown_wake_tag_raises_before_io():
    with pytest.raises(UnknownTagError, match="kv-cache"):
        normalize_wake_tags(["kv-cache"])


def test_sleep_levels_offload_tags_as_seed_step_36():
    assert "weights" in sleep_offload_tags(1)
    assert set(sleep_offload_tags(2)) == {"runtime", "cuda_graph"}
    with pytest.raises(ValueError):
        sleep_offload_tags(3)


def test_engine_step_cycle_of_the_seed():
    e = EngineLifecycle("engine0")
    e.check_sleep(2)
    e.on_sleep(2)
    with pytest.raises(LifecycleError, match="asleep \\(level 2\\)"):
        e.check_generate()
    e.on_wake(e.check_wake(["weights"]))
    assert e.memory is EngineMemory.WEIGHTS_ONLY
    with pytest.raises(LifecycleError):
        e.check_generate()
    e.check_pause("abort")
    e.on_pause("abort")
    e.check_flush()
    e.check_start_update()
    e.on_start_update()
    e.check_update()
    with pytest.raises(LifecycleError, match="already in progress"):
        e.check_start_update()
    e.check_finish_update(1)
    e.on_finish_update(1)
    e.on_resume()
    e.on_wake(e.check_wake(["kv_cache", "cuda_graph"]))
    assert e.memory is EngineMemory.AWAKE and e.sleep_level == 0
    e.check_generate()


def test_engine_misuse_is_reported_with_a_hint():
    e = EngineLifecycle("engine1")
    with pytest.raises(LifecycleError, match="start_weight_update first"):
        e.check_update()
    with pytest.raises(LifecycleError, match="pause generation"):
        e.check_flush()
    e.on_start_update()
    e.on_finish_update(3)
    e.on_start_update()
    with pytest.raises(LifecycleError, match="version must increase"):
        e.check_finish_update(3)
    with pytest.raises(LifecycleError, match="level must be 1 or 2"):
        e.check_sleep(0)


def test_wake_all_from_any_state_is_awake():
    for state in EngineMemory:
        e = EngineLifecycle("e", memory=state)
        e.on_wake(e.check_wake(None))
        assert e.memory is EngineMemory.AWAKE


def test_trainer_table():
    t = TrainerLifecycle()
    t.apply("sleep")
    assert t.state is TrainerState.ASLEEP
    with pytest.raises(LifecycleError, match="wake_up\\(\\) first"):
        t.check("train")
    t.apply("export_weights")
    t.apply("wake_up")
    with pytest.raises(LifecycleError, match="already awake"):
        t.check("wake_up")


def test_allocator_table_double_pause_and_resume_without_pause():
    a = AllocatorLifecycle("trainer.rank0", frozenset({"params", "grads", "optimizer"}))
    with pytest.raises(LifecycleError, match="resume without pause"):
        a.check_wake(["params"])
    a.check_sleep(["params", "grads"])
    a.on_sleep(offload=["params"], discard=["grads"])
    assert a.state("params") is TagState.OFFLOADED and a.state("grads") is TagState.DISCARDED
    with pytest.raises(LifecycleError, match="offloaded"):
        a.check_sleep(["params"])
    with pytest.raises(UnknownTagError):
        a.check_sleep(["kv_cache"])
    a.check_wake(["params", "grads"])
    a.on_wake(["params", "grads"])
    assert a.asleep_tags() == []


def test_vime_errors_rebuild_from_args_and_pickle():
    """simpy re-raises failed events as type(e)(*e.args) and Ray pickles exceptions: both must keep the message."""
    import pickle

    from vime.errors import EngineError, OutOfMemoryError

    errors = [LifecycleError("engine0", "generate", "asleep", "wake it"),
              UnknownTagError("engine0", "wake_up", "kv", {"weights"}),
              EngineError("e1", "generate", "HTTP 500 body", 500, True),
              OutOfMemoryError(3, "actor", "grads", 10 * 1024**3, 1024**3, "train", 1.5)]
    for e in errors:
        for copy in (type(e)(*e.args), pickle.loads(pickle.dumps(e))):
            assert type(copy) is type(e) and str(copy) == str(e)
    assert errors[2].status == 500 and errors[2].retryable
