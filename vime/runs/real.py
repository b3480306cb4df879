"""Real runs: vLLM servers behind vllm-router and Megatron actors on Ray, driven by the same Orchestrator."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from vime.errors import ConfigError
from vime.orchestrator import RunReport, StartupReport, StepReport
from vime.runs.loop import build_orchestrator, build_rollout


def run_real(args: Any, *, on_startup: Callable[[StartupReport], None] | None = None,
             on_step: Callable[[StepReport], None] | None = None, observers: Sequence[Any] = (),
             on_placement: Callable[[dict[str, Any]], None] | None = None,
             wrap: Callable[[Any], dict[str, Any]] | None = None,
             on_faults: Callable[[dict[str, Any]], None] | None = None) -> RunReport:
    """Launch the real backends (`vime.real.session`), run start-up and every step on a real event loop.

    `on_placement` gets, once the backends are up, where they run (`vime.real.session.placement_report`).
    `wrap(session)` may return replacements ``{"engines": ..., "router": ..., "trainer": ...}`` for
    what the orchestrator drives (recording wrappers: `vime.report.calls.CallLog.wrap`), as
    `vime.runs.sim.simulate`'s `wrap` does for simulated backends; the session still owns and
    tears down the real ones. With ``--fault`` (`vime.real.faults`) `on_faults` gets the fault section
    (`vime.faults.fault_report`) once the run ends, also when it ends in an error.
    """
    try:
        from vime.real.session import real_session
    except ImportError as exc:
        raise ConfigError(
            "`vime train --backend real` needs the real backends (vime.real.session: vLLM servers behind "
            "vllm-router, Megatron actors on Ray), which are not available in this installation "
            f"({exc}); install `vime[vllm,train]`, or run the loop on the simulator with --backend sim") from exc

    async def main() -> RunReport:
        with signals_wake_the_loop():
            async with real_session(args) as session:
                if on_placement is not None:
                    on_placement(session.placement)
                replaced = wrap(session) if wrap is not None else {}
                engines = replaced.get("engines", session.engines)
                router = replaced.get("router", session.router)
                trainer = replaced.get("trainer", session.trainer)
                extra: list[Any] = []
                faults = None
                if getattr(args, "fault", ()):
                    from vime.real.faults import RealFaults

                    faults = RealFaults(args, session)
                    (engines, router), extra = faults.wrap(list(engines), router), [faults]
                rollout = build_rollout(args, router, num_engines=len(engines), tokenizer=session.tokenizer)
                orch = build_orchestrator(args, engines=engines, router=router, trainer=trainer,
                                          data_source=session.data_source, rollout=rollout,
                                          eval_sources=session.eval_sources,
                                          observers=[*session.observers, *observers, *extra])
                steps: list[StepReport] = []

                def step_done(report: StepReport) -> None:
                    steps.append(report)
                    if on_step is not None:
                        on_step(report)
                try:
                    return await orch.run(on_startup=on_startup, on_step=step_done)
                finally:
                    if faults is not None:
                        await faults.close()
                        if on_faults is not None:
                            from vime.faults import fault_report

                            on_faults(fault_report(faults.log, steps, group_size=int(args.n_samples_per_prompt),
                                                   save=args.save))

    return asyncio.run(main())


@contextlib.contextmanager
def signals_wake_the_loop() -> Iterator[None]:
    """Ctrl-C wakes the running loop at once, whichever thread the kernel handed it to.

    The kernel may deliver a process's SIGINT to one of Ray's or gRPC's threads; Python's C handler then only
    flags it, and a main thread asleep in epoll (a long train call, nothing else due) would run the handler
    at its next event. A wakeup fd the loop watches ends that sleep. Call it inside the running loop."""
    loop = asyncio.get_running_loop()
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    loop.add_reader(r, _drain, r)
    old = signal.set_wakeup_fd(w)
    try:
        yield
    finally:
        signal.set_wakeup_fd(old)
        loop.remove_reader(r)
        os.close(r)
        os.close(w)


def _drain(fd: int) -> None:
    with contextlib.suppress(BlockingIOError):
        os.read(fd, 512)
