"""A simulated run's uncertainty on its report page: phase bands for the charts, and how firm each phase is."""

from __future__ import annotations

import copy
import html
from typing import Any

from vime.report.view import PHASE_LABELS, PHASE_ORDER, fmt_seconds


def with_bands(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with its ``uncertainty`` bands copied where the page's phase table and chart read them
    (summary.phases[p].band, summary.t_step_band); unchanged when it has none (a measured run, a
    profile without measured spread)."""
    unc = doc.get("uncertainty") or {}
    if unc.get("basis") is None:
        return doc
    out = copy.deepcopy(doc)
    summary = out.get("summary", {})
    for name, p in summary.get("phases", {}).items():
        b = unc.get("phases", {}).get(name) or {}
        if b.get("low_s") is not None:
            p["band"] = [b["low_s"], b["high_s"]]
    t = unc.get("t_step")
    if t:
        summary["t_step_band"] = [t["low_s"], t["high_s"]]
    return out


def _e(x: Any) -> str:
    return html.escape(str(x), quote=True)


def uncertainty_section(doc: dict[str, Any]) -> str:
    """The section "How firm each phase is" (empty for a document without ``uncertainty``)."""
    unc = doc.get("uncertainty")
    if not unc:
        return ""
    phases = doc.get("summary", {}).get("phases", {})
    if unc.get("basis") is None:
        return (f'<section id="uncertainty"><h2>How firm each phase is</h2><p class="hint">No band: '
                f'{_e(unc.get("note", ""))}</p></section>')
    quantities = unc.get("quantities", {})
    rows = []
    for name in PHASE_ORDER:
        if name not in phases:
            continue
        b = unc.get("phases", {}).get(name, {})
        if b.get("low_s") is None:
            band, factors = "no band", _e(b.get("why", ""))
        else:
            band = f"{fmt_seconds(b['low_s'])} – {fmt_seconds(b['high_s'])}"
            factors = f"×{b['low_factor']:.2f} – ×{b['high_factor']:.2f}"
        rests = ", ".join(f"{q} ({quantities[q]['rows']} rows)" if q in quantities else f"{q} (not measured)"
                          for q in b.get("rests_on", [])) or "—"
        rows.append(f"<tr><td>{_e(PHASE_LABELS.get(name, name))}</td><td class=num>{_e(fmt_seconds(phases[name]['seconds']))}"
                    f"</td><td class=num>{_e(band)}</td><td class=num>{factors}</td><td>{_e(rests)}</td></tr>")
    t = unc.get("t_step")
    if t:
        t_step = doc.get("summary", {}).get("t_step", 0.0)
        unbanded = f" (without a band: {', '.join(t['unbanded'])})" if t.get("unbanded") else ""
        rows.append(f"<tr><td><b>T_step</b></td><td class=num><b>{_e(fmt_seconds(t_step))}</b></td><td class=num>"
                    f"{_e(fmt_seconds(t['low_s']))} – {_e(fmt_seconds(t['high_s']))}</td><td></td>"
                    f"<td>the phases' bands added{_e(unbanded)}</td></tr>")
    sources = "".join(f"<li><b>{_e(k)}</b> ×{q['low']:.3f} – ×{q['high']:.3f}: {_e(q['source'])}</li>"
                      for k, q in quantities.items())
    return ('<section id="uncertainty"><h2>How firm each phase is</h2>'
            f'<p class="hint">{_e(unc.get("note", ""))}.</p>'
            '<table><thead><tr><th>phase</th><th class=num>predicted</th><th class=num>band</th>'
            '<th class=num>measured / predicted</th><th>rests on</th></tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>'
            f'<details><summary>Where each spread comes from</summary><ul>{sources}</ul></details></section>')


__all__ = ["with_bands", "uncertainty_section"]
