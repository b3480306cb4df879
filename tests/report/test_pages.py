"""Every report page in headless Chromium (over the DevTools protocol): it renders without console errors or network
requests, its screenshot is not blank, and the DOM has what a reader needs — axis ticks with units, phase bands,
legends, collapsed GPUs that expand, the OOM marked, a zoom that all time charts follow, hover values."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest

from vime.config import parse_args
from vime.report.html import render_html
from vime.report.html_sweep import render_sweep_html
from vime.report.view import fmt_seconds
from vime.runs.document import build_document
from vime.runs.fixes import fix_lines, simulate_fixes
from vime.runs.sim import simulate
from vime.runs.sweep import parse_sweep, placeholders, run_points, search
from vime.testing.browser import Browser, find_chromium

ROOT = Path(__file__).resolve().parents[2]
H200 = ROOT / "bench" / "data" / "h200_train_e2e" / "qwen3-4b-cumem-1g_mbs2"
PHASE_LABELS = ["Rollout", "Offload", "Train", "Onload weights", "Weight sync", "Onload KV cache"]
PHASES = ["rollout", "offload", "train", "onload_weights", "weight_sync", "onload_kv"]


def _png_distinct_bytes(png: bytes) -> int:
    """Distinct byte values in the decoded scanlines of a PNG (1 for a blank page)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat = 8, b""
    while pos < len(png):
        (length,) = struct.unpack(">I", png[pos:pos + 4])
        kind = png[pos + 4:pos + 8]
        if kind == b"IDAT":
            idat += png[pos + 8:pos + 8 + length]
        pos += 12 + length
    return len(set(zlib.decompress(idat)))


@pytest.fixture(scope="module")
def browser():
    if find_chromium() is None:
        if os.environ.get("CI"):
            pytest.fail("chromium is not installed; .ci/run installs Debian's chromium")
        pytest.skip("chromium not installed (apt-get install chromium)")
    with Browser(width=1280, height=900) as b:
        yield b


def _show(b: Browser, page: Path) -> None:
    """Open `page`; it rendered, nothing failed, nothing was fetched, and it is not blank."""
    b.open(page.as_uri())
    assert b.eval("document.body.dataset.rendered") == "ok"
    assert b.eval("document.body.dataset.jsError || ''") == ""
    assert not b.console_errors and not b.exceptions, (b.console_errors, b.exceptions)
    fetched = [u for u in b.requests if not u.startswith(("file:", "data:", "about:"))]
    assert not fetched, f"the page fetched {fetched}"
    assert _png_distinct_bytes(b.screenshot()) > 16, "screenshot is blank"


def _texts(b: Browser, selector: str) -> list[str]:
    return b.eval(f"Array.from(document.querySelectorAll({json.dumps(selector)})).map(e => e.textContent)")


def _rect(b: Browser, selector: str) -> dict[str, float]:
    """The viewport rectangle of the first match, scrolled into view."""
    return b.eval(f"(() => {{ const e = document.querySelector({json.dumps(selector)}); e.scrollIntoView({{block: 'center'}});"
                  f" const r = e.getBoundingClientRect(); return {{x: r.x, y: r.y, w: r.width, h: r.height}}; }})()")


def _write(tmp_path: Path, name: str, text: str) -> Path:
    page = tmp_path / name
    page.write_text(text, encoding="utf-8")
    return page


# --------------------------------------------------------------------------------------------
# One run
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_steps():
    # micro-batches of 4: at the seed's 8 the DP ranks' activations (the loss's entropy temporaries included) differ
    # by more than ALIKE_SHARE of a GPU at moments, and GPUs 6–7 get a chart of their own
    sim = simulate(parse_args(["--num-rollout", "2", "--micro-batch-size", "4"], command="simulate"))
    return build_document(sim, deterministic=True), sim.backends.recorder


def test_one_step_page_axes_bands_legends_and_collapsed_gpus(browser: Browser, two_steps: Any, tmp_path: Path) -> None:
    doc, rec = two_steps
    _show(browser, _write(tmp_path, "step.html", render_html(doc, rec, trace_href="trace.json")))
    b = browser
    assert b.eval("document.querySelector('#verdict').textContent").strip().startswith(f"✓ Fits: T_step {fmt_seconds(doc['summary']['t_step'])}")
    # a time axis with units under the timeline and under every memory chart, and values on the memory axis
    ticks = _texts(b, "#timeline .axis-x .tick text")
    assert len(ticks) >= 5 and all(t.endswith(" s") for t in ticks), ticks
    charts = b.eval("document.querySelectorAll('#memory-charts svg.memory').length")
    assert charts == 2  # GPUs 0–7 as one chart, host memory
    for i in range(charts):
        sel = f"document.querySelectorAll('#memory-charts svg.memory')[{i}]"
        assert b.eval(f"{sel}.querySelectorAll('.axis-x .tick').length") >= 5
        assert all(t.endswith("GiB") or t == "0" for t in b.eval(f"Array.from({sel}.querySelectorAll('.axis-y .tick text')).map(e => e.textContent)"))
        bands = b.eval(f"Array.from({sel}.querySelectorAll('rect.phase-band')).map(e => e.dataset.phase)")
        assert set(PHASES) <= set(bands) and len(bands) == 3 + 2 * 6  # start-up's three, six per step
    # the timeline and the memory charts share the plot's left edge and width
    boxes = b.eval("Array.from(document.querySelectorAll('svg.time-chart .overlay')).map(e => "
                   "{const r = e.getBoundingClientRect(); return [Math.round(r.left), Math.round(r.width)];})")
    assert len({tuple(x) for x in boxes}) == 1, boxes
    # legends: phases and memory owners/tags in words
    assert set(PHASE_LABELS) <= set(_texts(b, "#phase-chart .legend .key"))
    mem_keys = _texts(b, "#memory-charts .gpu-group .legend .key")
    assert {"engine · KV cache", "engine · weights", "trainer · activations", "trainer · parameters"} <= set(mem_keys)
    # eight GPUs with the same allocations: one chart, stated as such, each GPU a click away
    group = "#memory-charts .gpu-group[data-gpus='0,1,2,3,4,5,6,7']"
    title = b.eval(f"document.querySelector(\"{group} .group-title\").textContent")
    assert title == "GPUs 0–7 alike", title
    assert "trainer · activations by up to" in b.eval(f"document.querySelector(\"{group} .group-note\").textContent")
    b.eval(f"document.querySelector(\"{group} button.expand\").click()")
    assert b.eval(f"document.querySelectorAll(\"{group} .chart.member svg.memory\").length") == 8
    assert b.eval(f"document.querySelector(\"{group}\").dataset.collapsed") == "false"
    b.eval(f"document.querySelector(\"{group} button.expand\").click()")
    assert b.eval(f"document.querySelector(\"{group}\").dataset.collapsed") == "true"
    # tables in words and units, the trace linked
    # the six phases, then time outside them when the step has any (the health check between rollout and offload)
    gap = ["Outside the phases"] if "gap" in doc["summary"]["phases"] else []
    assert _texts(b, "#phases table tbody td:first-child") == [*PHASE_LABELS, *gap, "T_step"]
    assert _texts(b, "#phases table tbody td:nth-child(3)")[-1] == fmt_seconds(doc["summary"]["t_step"])
    assert fmt_seconds(10.18) == "10.2 s" and fmt_seconds(0.2561) == "256 ms"  # three figures, a unit
    assert b.eval("document.querySelector('#files a').getAttribute('href')") == "trace.json"


def test_one_step_page_zooms_together_and_shows_values_on_hover(browser: Browser, two_steps: Any, tmp_path: Path) -> None:
    doc, rec = two_steps
    _show(browser, _write(tmp_path, "step.html", render_html(doc, rec)))
    b = browser
    full = b.eval("[vimeReport.time.lo, vimeReport.time.hi]")
    r = _rect(b, "#timeline svg .overlay")
    y = r["y"] + r["h"] / 2
    b.drag(r["x"] + 0.4 * r["w"], y, r["x"] + 0.6 * r["w"], y)
    lo, hi = b.eval("[vimeReport.time.lo, vimeReport.time.hi]")
    span = full[1] - full[0]
    assert lo == pytest.approx(full[0] + 0.4 * span, rel=0.02) and hi == pytest.approx(full[0] + 0.6 * span, rel=0.02)
    assert b.eval("location.hash").startswith("#t=")
    ticks = _texts(b, "#memory-charts svg.memory .axis-x .tick text")
    assert ticks and all(t.endswith(" s") for t in ticks)
    first = [float(t.split()[0]) for t in ticks[:3]]
    assert lo <= first[0] < hi  # the memory charts followed the zoom
    # hover: the values under the cursor, in words
    m = _rect(b, "#memory-charts svg.memory .overlay")
    b.mouse("mouseMoved", m["x"] + 0.5 * m["w"], m["y"] + 0.5 * m["h"])
    tip = b.eval("document.getElementById('vime-tip').hidden ? '' : document.getElementById('vime-tip').textContent")
    assert "total" in tip and "free" in tip and "GiB" in tip, tip
    # double-click zooms out; the step buttons zoom to a step
    m = _rect(b, "#timeline svg .overlay")
    for clicks in (1, 2):
        b.mouse("mousePressed", m["x"] + 10, m["y"] + 10, clicks=clicks)
        b.mouse("mouseReleased", m["x"] + 10, m["y"] + 10, clicks=clicks)
    assert b.eval("[vimeReport.time.lo, vimeReport.time.hi]") == full
    b.eval("Array.from(document.querySelectorAll('#zoom-bar button')).find(x => x.textContent === 'step 1').click()")
    lo, hi = b.eval("[vimeReport.time.lo, vimeReport.time.hi]")
    assert hi - lo == pytest.approx(doc["steps"][1]["t_step"], rel=1e-3)


def _cpu_run(args: Any, sim: Any) -> tuple[dict[str, Any], Any]:
    """A real CPU run's document and recorder as `vime train` makes them: the orchestrator's phases and calls
    (here the simulation's, on a monotonic clock's seconds), host memory sampled, no GPU."""
    from vime.report.recorder import HOST, Recorder
    from vime.runs.document import run_document

    rec = Recorder()
    t0 = 1000.0  # a monotonic clock's seconds: the page starts at the run's first event
    for name, rid, a, z in sim.backends.recorder.phase_spans:
        rec.on_phase(name, True, t0 + a, rid)
        rec.on_phase(name, False, t0 + z, rid)
    for s in sim.backends.recorder.spans:
        if s.track != "phases":
            rec.on_call(s.track, s.name, t0 + s.t0, t0 + s.t1)
    rec.on_memory(HOST, "host", "used", 2**30, total=2**30, t=t0 - 200)  # the servers' launch, before start-up
    for i in range(60):
        used = (3 + (i % 7) * 0.5) * 2**30
        rec.on_memory(HOST, "host", "used", int(used), total=int(used), t=t0 + i * 0.5)
    return run_document(args, sim.report, rec, {HOST: 16 * 2**30}, backend="real"), rec


def test_measured_run_page_as_a_cpu_run_feeds_it(browser: Browser, tmp_path: Path) -> None:
    args = parse_args(["--backend", "sim", "--num-rollout", "2"], command="train")
    sim = simulate(args)
    doc, rec = _cpu_run(args, sim)
    _show(browser, _write(tmp_path, "measured.html", render_html(doc, rec)))
    b = browser
    assert b.eval("document.querySelector('header .eyebrow').textContent").startswith("vime train (measured)")
    assert b.eval("document.querySelector('#verdict').textContent").strip().startswith("✓ Ran to the end: T_step")
    assert b.eval("document.querySelector('#memory-charts .group-title').textContent") == "Host memory in use"
    assert _texts(b, "#memory-charts .legend .key") == ["host · in use (measured)"]
    assert _texts(b, "#peaks tbody td:first-child") == ["host"]
    assert "GPU -1" not in b.eval("document.body.textContent")
    # the first view is start-up and the steps; the launch before them is one click away
    # (start-up's own span encloses its parts, the trainer's first sleep included: the view draws the parts)
    first_phase = 200 + min(a for name, _, a, _ in sim.backends.recorder.phase_spans if name != "startup")
    lo, hi = b.eval("[vimeReport.time.lo, vimeReport.time.hi]")
    assert first_phase - 2 < lo < first_phase and b.eval("vimeReport.time.full[0]") == 0
    b.eval("Array.from(document.querySelectorAll('#zoom-bar button')).find(x => x.textContent === 'everything recorded').click()")
    assert b.eval("[vimeReport.time.lo, vimeReport.time.hi]") == [0, hi]
    assert _texts(b, "#timeline .axis-x .tick text")[0] == "0 s"


def test_uncertainty_bands_show_where_the_document_has_them(browser: Browser, two_steps: Any, tmp_path: Path) -> None:
    """Issue 17 adds a band to each predicted phase: the table gives the range and the chart a whisker."""
    doc, rec = two_steps
    banded = json.loads(json.dumps(doc))
    for p in banded["summary"]["phases"].values():
        p["band"] = [round(p["seconds"] * 0.8, 4), round(p["seconds"] * 1.25, 4)]
    t = banded["summary"]["t_step"]
    banded["summary"]["t_step_band"] = [round(t * 0.85, 4), round(t * 1.2, 4)]
    _show(browser, _write(tmp_path, "bands.html", render_html(banded, rec)))
    assert browser.eval("document.querySelectorAll('#phase-chart g.band').length") == 1
    r = banded["summary"]["phases"]["rollout"]
    assert _texts(browser, "#phases table tbody td:nth-child(3)")[0] == \
        f"{fmt_seconds(r['seconds'])} ({fmt_seconds(r['band'][0])} – {fmt_seconds(r['band'][1])})"
    lo, hi = banded["summary"]["t_step_band"]
    assert f"range {fmt_seconds(lo)} – {fmt_seconds(hi)}" in browser.eval("document.querySelector('.kpis').textContent")


def test_many_engines_fold_into_one_timeline_row(browser: Browser, two_steps: Any, tmp_path: Path) -> None:
    from vime.report.recorder import Recorder

    doc, rec = two_steps
    many = Recorder()
    many.phase_spans, many.samples = list(rec.phase_spans), list(rec.samples)
    many.spans = [s for s in rec.spans if s.track != "engine0"]
    for s in [s for s in rec.spans if s.track == "engine0"]:
        many.spans += [type(s)(f"engine{i}", s.name, s.t0, s.t1, {}) for i in (0, *range(4, 16))]
    _show(browser, _write(tmp_path, "engines.html", render_html(doc, many)))
    engines = [t for t in _texts(browser, "#timeline text.row-label") if t.startswith("engine")]
    assert engines == ["engine0", "engine1", "engine2", "engine3", "engine14", "engine15"]
    assert "… 10 more engines" in _texts(browser, "#timeline text.row-label")
    browser.eval("document.querySelector('button.expand-engines').click()")
    engines = [t for t in _texts(browser, "#timeline text.row-label") if t.startswith("engine")]
    assert len(engines) == 16 and browser.eval("document.querySelector('button.expand-engines').textContent") == \
        "fold the engines"


def test_identical_gpus_collapse_into_one_chart(browser: Browser, tmp_path: Path) -> None:
    sim = simulate(parse_args(["--num-rollout", "1", "--response-length", "fixed:256", "--prompt-length", "fixed:64"],
                              command="simulate"))
    _show(browser, _write(tmp_path, "same.html", render_html(build_document(sim), sim.backends.recorder)))
    group = "#memory-charts .gpu-group[data-gpus='0,1,2,3,4,5,6,7']"
    assert browser.eval(f"document.querySelector(\"{group} .group-title\").textContent") == "GPUs 0–7 identical"
    assert browser.eval(f"document.querySelector(\"{group}\").dataset.kind") == "identical"
    note = browser.eval(f"document.querySelector(\"{group} .group-note\").textContent")
    assert "engine0 on GPUs 0–1" in note and "engine3 on GPUs 6–7" in note
    assert len(_texts(browser, "#peaks tbody tr")) == 1 and _texts(browser, "#peaks tbody td")[0] == "GPUs 0–7"


def test_oom_page_marks_the_moment_and_lists_the_simulated_fixes(browser: Browser, tmp_path: Path) -> None:
    sim = simulate(parse_args(["--model", "Qwen3-14B", "--num-rollout", "1"], command="simulate"))
    assert sim.oom is not None
    sim.fix_results = simulate_fixes(sim)
    sim.fixes = fix_lines(sim.fix_results)
    doc = build_document(sim)
    _show(browser, _write(tmp_path, "oom.html", render_html(doc, sim.backends.recorder)))
    b = browser
    verdict = b.eval("document.querySelector('#verdict').textContent")
    assert "Out of memory during train (step 0) on GPU 0: trainer · activations" in verdict and "fixes fit" in verdict
    # the phases up to the OOM, not a bar of zeros
    assert b.eval("document.querySelector('#phases h2').textContent") == "What ran before the OOM"
    assert b.eval("Array.from(document.querySelectorAll('#phase-chart rect.phase-seg')).map(e => e.dataset.phase)") == \
        ["rollout", "offload", "train"]
    assert b.eval("document.querySelectorAll('#phase-chart .oom-marker').length") == 1
    assert b.eval("document.querySelector('#phases table')") is None
    # the moment on the GPU's chart (and the allocation that did not fit), and on the timeline
    assert b.eval("document.querySelector('#memory-charts .gpu-group.has-oom .oom-marker').dataset.gpu") == "0"
    assert b.eval("document.querySelectorAll('#memory-charts .gpu-group.has-oom .oom-ask').length") == 1
    asked = f"asked for {sim.oom.requested / 1024**3:.1f} GiB, {sim.oom.free / 1024**3:.1f} GiB free"
    assert asked in b.eval("document.querySelector('#memory-charts .oom-marker text').textContent")
    assert b.eval("document.querySelectorAll('#timeline .oom-marker').length") == 1
    assert any(t.strip() == "the OOM" for t in _texts(b, "#zoom-bar button"))
    # the fixes, each simulated
    badges = _texts(b, "#fixes tbody .badge")
    assert badges[0] == "fits" and len(badges) == len(doc["verdict"]["fix_results"]) >= 3


# --------------------------------------------------------------------------------------------
# A sweep and a search
# --------------------------------------------------------------------------------------------


def test_sweep_page_ranks_stacks_phases_and_marks_oom_rows(browser: Browser, tmp_path: Path) -> None:
    base = parse_args(["--model", "Qwen3-14B", "--num-rollout", "1"], command="simulate")
    results = run_points(base, parse_sweep(["tensor-model-parallel-size=1,2,4"]), workers=1)
    _show(browser, _write(tmp_path, "sweep.html", render_sweep_html(results, base, kind="sweep",
                                                                    axes=["tensor_model_parallel_size"])))
    b = browser
    assert b.eval("document.querySelector('#verdict').textContent").strip().startswith("✓ Fastest: TP 4")
    rows = b.eval("Array.from(document.querySelectorAll('#rank-chart .rank-row')).map(e => e.dataset.status)")
    assert rows[0] == "fits" and "oom" in rows
    fits = "#rank-chart .rank-row[data-status=fits]"
    assert set(b.eval(f"Array.from(document.querySelectorAll('{fits} rect.phase-seg')).map(e => e.dataset.phase)")) == set(PHASES)
    reason = _texts(b, "#rank-chart .rank-row[data-status=oom] .oom-reason")
    assert reason and all(r.startswith("OOM during") for r in reason)
    assert b.eval("document.querySelectorAll('#rank-chart .oom-short').length") == len(reason)
    assert b.eval("document.querySelectorAll('#rank-chart .capacity').length") == 3
    ticks = _texts(b, "#rank-chart .axis-x .tick text")
    assert any(t.endswith(" s") for t in ticks) and any(t.endswith("GiB") for t in ticks)
    assert "Rollout" in _texts(b, "#rank-chart .legend .key")
    # the sweep's own axis: T_step against TP, the OOM point marked
    assert b.eval("document.getElementById('sweep-lines').hidden") is False
    assert b.eval("document.querySelectorAll('#sweep-chart .pt-oom').length") == len(reason)
    assert _texts(b, "#sweep-chart .axis-x .tick text")[:1] == ["1"]
    # the table sorts by a column
    b.eval("document.querySelector('#table th').click()")
    b.eval("document.querySelector('#table th').click()")
    assert _texts(b, "#table tbody tr td:first-child")[0] == "3"


@pytest.fixture(scope="module")
def small_search():
    base = parse_args(["--num-rollout", "1", "--model", "Qwen3-0.6B", "--rollout-batch-size", "8"], command="simulate")
    best, ranked = search(base, goal="fastest", max_gpus=2, workers=1)
    assert best is not None
    return base, best, ranked


def test_search_page_draws_the_frontier_cost_and_the_command(browser: Browser, small_search: Any, tmp_path: Path) -> None:
    base, best, ranked = small_search
    page = render_sweep_html(ranked, base, kind="search", goal="fastest", best=best, placeholders=placeholders(best.argv))
    _show(browser, _write(tmp_path, "search.html", page))
    b = browser
    assert b.eval("document.querySelectorAll('#frontier-chart circle.pt').length") == len(ranked)
    assert b.eval("document.querySelectorAll('#frontier-chart .pt.best').length") == 1
    assert b.eval("document.querySelector('#frontier-chart .frontier-line').getAttribute('d')").startswith("M")
    assert _texts(b, "#frontier-chart .axis-x .tick text") == ["1", "2"]
    assert all(t == "0" or t.endswith(" s") for t in _texts(b, "#frontier-chart .axis-y .tick text"))
    assert {"TP 1", "TP 2", "frontier"} <= set(_texts(b, "#frontier-chart .legend .key"))
    assert b.eval("document.querySelectorAll('#cost-chart .pt.best').length") == 1
    cmd = b.eval("document.getElementById('cmd-best').textContent")
    assert cmd == " ".join(best.argv) and cmd.startswith("vime train --hf-checkpoint /path/to/Qwen3-0.6B-hf-checkpoint")
    assert "is a placeholder" in b.eval("document.querySelector('#command ul').textContent")


# --------------------------------------------------------------------------------------------
# A run beside its simulation
# --------------------------------------------------------------------------------------------


def test_train_compare_sim_page_draws_both_runs_with_the_error_of_each_phase(browser: Browser, tmp_path: Path) -> None:
    """`vime train --backend sim` emits what a real run does: its page beside its simulation has zero error."""
    page = tmp_path / "twin.html"
    out = subprocess.run([sys.executable, "-m", "vime.cli", "train", "--backend", "sim", "--num-rollout", "2", "--json",
                          "--report", str(page), "--compare-sim"], capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    events = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    cmp = next(e for e in events if e["event"] == "compare")
    assert cmp["schema"] == "vime.compare/1" and cmp["ok"]
    assert all(abs(s["phases"]["t_step"]["error_pct"]) < 1e-6 for s in cmp["steps"])
    _show(browser, page)
    b = browser
    assert b.eval("document.querySelectorAll('#compare-chart .bar-measured').length") == 6
    assert set(_texts(b, "#compare-chart .err-label")) == {"+0.0 %"}
    labels = _texts(b, "#timeline text.row-label")
    assert labels[:2] == ["measured", "simulated"] and any(x.startswith("measured · engine") for x in labels)
    assert b.eval("document.querySelectorAll('#memory-charts .mem-line').length") == 2  # GPU 0, both runs
    assert b.eval("document.querySelectorAll('#memory-charts rect.phase-band').length") >= 12
    b.eval("document.querySelector('#memory-charts button.expand').click()")
    assert b.eval("document.querySelectorAll('#memory-charts .mem-line').length") == 16  # all 8 GPUs, both runs


def test_a_cpu_run_beside_its_simulation_draws_its_host_memory_apart(browser: Browser, tmp_path: Path) -> None:
    """A run without GPUs measured the host's memory in use: the compare page draws it in its own chart, and
    each simulated GPU says it has no measured line."""
    from vime.report.compare_views import view_from_recorder
    from vime.report.html_compare import render_compare_html
    from vime.runs.twin import Twin, compare_with_twin

    args = parse_args(["--backend", "sim", "--num-rollout", "2"], command="train")
    sim = simulate(args)
    doc, rec = _cpu_run(args, sim)
    twin = Twin(sim, build_document(sim), ["simulated on H100-SXM-80G (the default; pass --hardware for your GPU)"])
    cmp = compare_with_twin(doc, rec, twin)
    assert "memory" not in cmp  # no GPU was measured: no peak to compare
    page = render_compare_html(cmp, measured_view=view_from_recorder(doc, rec),
                               simulated_view=view_from_recorder(twin.doc, sim.backends.recorder), title="cpu run")
    _show(browser, _write(tmp_path, "cpu-compare.html", page))
    b = browser
    titles = _texts(b, "#memory-charts .group-title")
    assert titles == ["GPU 0", "Host memory in use (measured)"], titles
    assert b.eval("document.querySelectorAll('#memory-charts [data-gpus=host] .mem-line[data-side=measured]').length") == 1
    assert "no measured memory for this GPU (a run without GPUs measures the host's memory, drawn below)" in \
        b.eval("document.querySelector('#memory-charts .gpu-group').textContent")
    assert "GPU -1" not in b.eval("document.body.textContent")


def test_compare_page_of_the_measured_h200_run(browser: Browser, tmp_path: Path) -> None:
    page, out = tmp_path / "h200.html", tmp_path / "cmp.json"
    res = subprocess.run([sys.executable, "-m", "vime.cli", "compare", "--train", str(H200 / "train.jsonl"),
                          "--sim", str(H200 / "sim.json"), "--mem", str(H200 / "gpu_mem.csv"), "--report", str(page),
                          "--out", str(out)], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert res.returncode == 1, res.stderr  # the run's memory moved between steps: a problem the table names
    assert "PROBLEMS: GPU memory did not return" in res.stdout
    # the comparison moved into the package holds everything the H200 run's own compare.json holds (it adds
    # the number of runs, their spread and each steady phase's allowance)
    def within(saved: Any, now: Any, where: str = "") -> None:
        if isinstance(saved, dict):
            for k, v in saved.items():
                assert k in now, f"{where}/{k}"
                within(v, now[k], f"{where}/{k}")
        else:
            assert saved == now, where

    within(json.loads((H200 / "compare.json").read_text()), json.loads(out.read_text()))
    _show(browser, page)
    b = browser
    errors = dict(zip(_texts(b, "#compare-chart text[text-anchor=end]"), _texts(b, "#compare-chart .err-label"), strict=False))
    assert errors["Rollout"] == "-21.5 %" and errors["Train"] == "+14.3 %"
    assert b.eval("document.querySelectorAll('#memory-charts .mem-line[data-side=measured]').length") == 1
    assert "simulated peak" in b.eval("document.querySelector('#memory-charts .sim-peak + text').textContent")
    assert _texts(b, "#timeline text.row-label")[:2] == ["measured", "simulated"]
