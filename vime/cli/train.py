"""`vime train`: run the RL loop on ``--backend sim`` or ``real`` and print start-up and each step's phase times."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from typing import Any

from vime.errors import ConfigError, VimeError
from vime.faults import faults_of, stop_message
from vime.orchestrator import PHASES, StartupReport, StepReport

_SHORT = {"rollout": "rollout", "offload": "offload", "train": "train", "onload_weights": "onload_w",
          "weight_sync": "sync", "onload_kv": "onload_kv"}


def format_step(report: StepReport) -> str:
    """One line per step: T_step, each phase in seconds and percent, the gap, and rollout counts."""
    total = report.t_step or 1.0
    phases = "  ".join(f"{_SHORT[p]} {t:8.3f}s {100 * t / total:5.1f}%" for p, t in report.phases().items())
    extra = ""
    if report.t_save:
        extra += f"  save {report.t_save:.3f}s"
    if report.t_eval:
        extra += f"  eval {report.t_eval:.3f}s"
    if report.lost_engines:
        extra += "  LOST " + ",".join(report.lost_engines)
        if report.restarted_engines:
            extra += " (restarted " + ",".join(report.restarted_engines) + ")"
    if hasattr(report, "staleness_mean"):  # --async-mode one-step-off / fully-async (vime.async_loop.AsyncStepReport)
        extra += (f"  staleness {report.staleness_mean:.2f}/{report.staleness_max}  partial {100 * report.partial_share:.0f}%"
                  f"  {report.samples_per_s:.1f} samples/s  idle engines {100 * report.engine_idle_share:.0f}%"
                  f" trainer {100 * report.trainer_idle_share:.0f}%")
    r = report.rollout
    return (f"step {report.rollout_id:>4}  T_step {report.t_step:9.3f}s  {phases}{extra}  gap {report.t_gap:.3f}s"
            f"  | v{report.rollout_weight_version}→v{report.published_version}"
            f"  samples {report.num_samples} (gen {r.get('generated_samples', 0)}, drop {r.get('dropped_samples', 0)},"
            f" abort {r.get('aborted_samples', 0)})  reward {report.reward_mean:.3f}"
            f"  resp_len {report.response_length_mean:.1f}")


def format_startup(report: StartupReport) -> str:
    return (f"start-up {report.t_total:.3f}s  onload_weights {report.t_onload_weights:.3f}s  "
            f"weight_sync {report.t_weight_sync:.3f}s ({report.buckets} buckets, v{report.weight_version})  "
            f"onload_kv {report.t_onload_kv:.3f}s")


class _Printer:
    """Prints start-up and each step as it finishes: a table line, or one JSON object per line with --json.

    With a `calls` log (``--record-calls``) each report carries the protocol calls of its segment
    (``"calls"`` in JSON, one indented line per call in the table).
    """

    def __init__(self, as_json: bool, out: Any = None, calls: Any = None) -> None:
        self.as_json = as_json
        self.out = out or sys.stdout
        self.calls = calls
        self.fault_report: dict[str, Any] | None = None  # the last --fault section printed

    def header(self, backend: str, extra: dict[str, Any]) -> None:
        if self.as_json:
            self._emit({"event": "run", "backend": backend, **extra})
        else:
            print(f"vime train --backend {backend}: " + ", ".join(f"{k} {v}" for k, v in extra.items()),
                  file=self.out, flush=True)
            print("phases: " + ", ".join(f"{_SHORT[p]} = T_{p}" for p in PHASES), file=self.out, flush=True)

    def placement(self, placement: dict[str, Any]) -> None:
        """Where a real run's engines and trainer ranks landed (plan node → Ray node, addresses)."""
        if self.as_json:
            self._emit({"event": "placement", **placement})
            return
        for e in placement.get("engine_hosts", []):
            print(f"placement: {e['name']} at {e['url']} on node {e['node_ip']}", file=self.out, flush=True)
        for r in placement.get("trainer_ranks", []):
            print(f"placement: trainer rank {r['rank']} on node {r['node_ip']}", file=self.out, flush=True)

    def startup(self, report: StartupReport) -> None:
        calls = self._calls("startup")
        if self.as_json:
            self._emit({"event": "startup", **report.to_dict(), **calls})
        else:
            print(format_startup(report), file=self.out, flush=True)
            self._print_calls(calls)

    def step(self, report: StepReport) -> None:
        calls = self._calls(report.rollout_id)
        if self.as_json:
            self._emit({"event": "step", "rollout_id": report.rollout_id, "phases": report.phases(),
                        "t_gap": report.t_gap, "t_step": report.t_step, "metrics": report.metrics(), **calls})
        else:
            print(format_step(report), file=self.out, flush=True)
            self._print_calls(calls)

    def _calls(self, segment: str | int) -> dict[str, Any]:
        return {} if self.calls is None else {"calls": self.calls.pop(segment)}

    def _print_calls(self, calls: dict[str, Any]) -> None:
        from vime.report.calls import CallEntry

        for c in calls.get("calls", []):
            e = CallEntry.from_dict(c)
            print(f"    {e.describe():<70} {e.t1 - e.t0:9.4f}s", file=self.out, flush=True)

    def compare(self, doc: dict[str, Any]) -> None:
        """The run beside its simulation (--compare-sim): a table, or one ``compare`` event with --json."""
        if self.as_json:
            self._emit({"event": "compare", **doc})
        else:
            from vime.report.compare import format_table

            print("measured beside simulated (error = (simulated - measured) / measured)", file=self.out, flush=True)
            for note in doc.get("notes", []):
                print(f"  note: {note}", file=self.out, flush=True)
            print(format_table(doc), file=self.out, flush=True)

    def faults(self, rep: dict[str, Any]) -> None:
        """What the --fault specs did, what was lost, how to resume (one ``faults`` event with --json)."""
        self.fault_report = rep
        if self.as_json:
            self._emit({"event": "faults", **rep})
        else:
            from vime.faults import format_fault_report

            print(format_fault_report(rep), file=self.out, flush=True)

    def _emit(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, sort_keys=True) + "\n")  # one write: a line no other writer can split
        self.out.flush()


def step_bar(args: Any, stream: Any = None) -> Any:
    """A progress bar over the run's steps on `stream` (stderr), shown only on a terminal and never with --json
    (the rollout draws its own bar per rollout, vime.rollout.generate)."""
    from tqdm import tqdm

    stream = stream or sys.stderr
    show = bool(getattr(stream, "isatty", lambda: False)()) and not args.json
    return tqdm(total=max(0, args.num_rollout - args.start_rollout_id), unit="step", desc="train", file=stream,
                disable=not show, leave=False)


def run_train(args: Any) -> int:
    """`vime train`: run the loop on ``--backend sim`` or ``real`` and print each step's phase times
    (and log them to the trackers the flags turn on)."""
    from vime.trackers import Trackers

    backend = args.backend
    if backend not in ("sim", "real"):
        raise ConfigError(f"--backend {backend!r} is unknown; use sim or real")
    calls: Any = None
    recording: dict[str, Any] = {}
    if args.record_calls:
        from vime.report.calls import CallLog

        calls = CallLog()
        log = calls
        recording = {"observers": [log], "wrap": lambda b: log.wrap(b.engines, b.router, b.trainer)}
    printer = _Printer(args.json, calls=calls)
    trackers = Trackers.from_config(args.logging, args.to_dict())  # a missing tracker package fails here, before any backend starts

    bar = step_bar(args)

    def on_step(report: StepReport) -> None:
        bar.update(1)
        printer.step(report)
        trackers.step(report)

    try:
        if backend == "sim":
            from vime.runs.sim import simulate

            printer.header("sim", {"hardware": args.hardware, "model": args.model,
                                   "engines": args.rollout_num_engines, "samples_per_rollout": args.samples_per_rollout,
                                   "seed": args.seed})
            sim = simulate(args, progress=None, on_startup=printer.startup, on_step=on_step, **recording)
            faults = faults_of(sim)
            if faults is not None:
                printer.faults(faults)
                if faults["outcome"] == "stopped":
                    print(f"vime train: {stop_message(faults)}", file=sys.stderr)
                    return 1
            if sim.oom is not None:
                raise sim.oom
            if args.trace_out or args.report:
                from vime.runs.document import build_document

                _write_outputs(args, build_document(sim), sim.backends.recorder, printer)
            return 0
        try:
            # --json: stdout carries the events alone; everything else printed there while the run lasts (Ray's
            # forwarded worker output, libraries) goes to stderr, or it can land inside an event's line
            with contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext():
                return _run_real(args, printer, on_step, recording)
        except VimeError:
            rep = printer.fault_report
            if rep is None or rep["outcome"] != "stopped":
                raise
            # the run ended as its --fault said: one line with the resume, not the error's chain
            print(f"vime train: {stop_message(rep)}", file=sys.stderr)
            return 1
    finally:
        bar.close()
        trackers.close()


def _run_real(args: Any, printer: _Printer, on_step: Any, recording: dict[str, Any]) -> int:
    """The real backend's part of `run_train`."""
    from vime.runs.real import run_real

    printer.header("real", {"hf_checkpoint": args.hf_checkpoint, "engines": args.rollout_num_engines})
    if not (args.trace_out or args.report):
        run_real(args, on_startup=printer.startup, on_step=on_step, on_placement=printer.placement,
                 on_faults=printer.faults, **recording)
        return 0
    from vime.real.telemetry import MemorySampler, MonotonicClock
    from vime.report.recorder import Recorder
    from vime.runs.document import run_document

    recorder = Recorder(MonotonicClock())
    with MemorySampler(recorder) as sampler:
        report = run_real(args, on_startup=printer.startup, on_step=on_step, wrap=recording.get("wrap"),
                          observers=[recorder, *recording.get("observers", [])], on_placement=printer.placement,
                          on_faults=printer.faults)
    _write_outputs(args, run_document(args, report, recorder, sampler.capacity, backend="real"), recorder, printer,
                   device_names=sampler.names)
    return 0


def _write_outputs(args: Any, doc: dict[str, Any], recorder: Any, printer: _Printer,
                   device_names: list[str] | None = None) -> None:
    """--trace-out and --report of a finished run (written atomically); with --compare-sim the report is the
    run beside its simulation, and the comparison is printed too."""
    from vime.cli.simulate import trace_href
    from vime.outputs import write_atomic

    if args.trace_out:
        from vime.report.trace import recorder_trace

        write_atomic(args.trace_out, json.dumps(recorder_trace(recorder), separators=(",", ":")))
    if args.report and args.compare_sim:
        from vime.report.compare_views import view_from_recorder
        from vime.report.html import layout_line
        from vime.report.html_compare import render_compare_html
        from vime.runs.twin import compare_with_twin, simulate_twin

        twin = simulate_twin(args, device_names or [])
        if doc.get("schema", "").startswith("vime.simulate"):
            twin.notes.insert(0, "this run was itself simulated (--backend sim): the comparison checks the plumbing")
        cmp = compare_with_twin(doc, recorder, twin)
        printer.compare(cmp)
        cfg = twin.doc["config"]
        what = os.path.basename(str(args.hf_checkpoint).rstrip("/")) if args.hf_checkpoint else twin.doc["model"]["name"]
        page = render_compare_html(
            cmp, measured_view=view_from_recorder(doc, recorder), simulated_view=view_from_recorder(twin.doc, twin.sim.backends.recorder),
            title=f"{what}: this run beside its simulation on {twin.doc['hardware']['name']}",
            sub=f"{layout_line(cfg)} · " + "; ".join(twin.notes), trace_href=trace_href(args))
        write_atomic(args.report, page)
    elif args.report:
        from vime.report.html import render_html

        write_atomic(args.report, render_html(doc, recorder, trace_href=trace_href(args)))
