/* vime report pages: SVG charts drawn from the page's JSON view model (#vime-data). Hand-written, no library,
   no network. Page kinds: "run" (one run, simulated or measured), "sweep", "search", "compare".
   Time charts of a page share one time axis: a drag on any of them zooms all, a double-click zooms out. */
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var body = document.body;
  window.addEventListener("error", function (e) { body.setAttribute("data-js-error", String(e.message || e)); });
  var D = JSON.parse(document.getElementById("vime-data").textContent);
  var TIP = document.getElementById("vime-tip");
  var LEFT = 150, RIGHT = 18, uid = 0;

  // ---------------------------------------------------------------------------------------------- DOM helpers
  function S(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function E(tag, attrs, parent, text) {
    var e = document.createElement(tag);
    for (var k in attrs) if (attrs[k] !== undefined && attrs[k] !== null) e.setAttribute(k, attrs[k]);
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function esc(s) {
    return String(s).replace(/[&<>"]/g, function (c) { return {"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;"}[c]; });
  }
  function f2(x) { return Math.round(x * 100) / 100; }

  // ---------------------------------------------------------------------------------------------- units
  function fmtS(s) {
    if (s === null || s === undefined || !isFinite(s)) return "—";
    var a = Math.abs(s), sign = s < 0 ? "-" : "";
    if (a === 0) return "0 s";
    if (a < 1e-3) return sign + (a * 1e6).toFixed(0) + " µs";
    if (a < 1) return sign + (+(a * 1e3).toPrecision(3)) + " ms";
    if (a < 10) return sign + a.toFixed(2) + " s";
    if (a < 100) return sign + (+a.toPrecision(3)) + " s";
    if (a < 600) { var m = Math.floor(Math.round(a) / 60), r = Math.round(a) % 60; return sign + m + " min " + (r < 10 ? "0" : "") + r + " s"; }
    if (a < 3600) return sign + (a / 60).toFixed(1) + " min";
    var mm = Math.round(a / 60), h = Math.floor(mm / 60), rr = mm % 60;
    return sign + h + " h " + (rr < 10 ? "0" : "") + rr + " min";
  }
  function fmtG(g) {
    if (g === null || g === undefined || !isFinite(g)) return "—";
    if (g === 0) return "0";
    if (Math.abs(g) < 1) return (g * 1024).toFixed(0) + " MiB";
    return Math.abs(g) < 100 ? g.toFixed(1) + " GiB" : g.toFixed(0) + " GiB";
  }
  function fmtN(x, d) { return x === null || x === undefined ? "—" : x.toLocaleString("en-US", {maximumFractionDigits: d || 0}); }

  // ---------------------------------------------------------------------------------------------- ticks
  function niceStep(raw) {
    var p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
    return (m < 1.5 ? 1 : m < 3 ? 2 : m < 7 ? 5 : 10) * p;
  }
  function linTicks(lo, hi, n) {
    if (!(hi > lo)) return [lo];
    var st = niceStep((hi - lo) / Math.max(1, n)), out = [];
    for (var v = Math.ceil(lo / st - 1e-9) * st; v <= hi + st * 1e-9; v += st) out.push(+v.toPrecision(12));
    return out;
  }
  /* Ticks for a time range in seconds: the unit follows the span (µs, ms, s, min, h) and labels carry it. */
  function timeTicks(lo, hi, px) {
    var span = hi - lo, n = Math.max(2, Math.floor(px / 90));
    var unit = span < 2e-3 ? [1e-6, "µs"] : span < 2 ? [1e-3, "ms"] : span < 300 ? [1, "s"] : span < 3 * 3600 ? [60, "min"] : [3600, "h"];
    var ticks = linTicks(lo / unit[0], hi / unit[0], n).map(function (v) { return v * unit[0]; });
    var st = ticks.length > 1 ? (ticks[1] - ticks[0]) / unit[0] : 1;
    var dec = Math.max(0, -Math.floor(Math.log10(st) + 1e-9));
    return {ticks: ticks, label: function (t) { return (t / unit[0]).toFixed(dec) + " " + unit[1]; }, unit: unit[1]};
  }
  /* Ticks for a duration axis from 0: one unit and one number format for every label. */
  function secTicks(max, n) {
    var tt = timeTicks(0, max, n * 90);
    return {ticks: tt.ticks, label: function (v) { return v === 0 ? "0" : tt.label(v); }};
  }
  function log2Ticks(lo, hi) {
    var out = [];
    for (var v = Math.pow(2, Math.floor(Math.log2(lo))); v <= hi * 1.0001; v *= 2) if (v >= lo / 1.0001) out.push(v);
    return out;
  }

  // ---------------------------------------------------------------------------------------------- tooltip
  function showTip(html, ev) {
    if (!html) { hideTip(); return; }
    TIP.innerHTML = html;
    TIP.hidden = false;
    var x = ev.clientX + 14, y = ev.clientY + 14, r = TIP.getBoundingClientRect();
    if (x + r.width > window.innerWidth - 8) x = ev.clientX - r.width - 14;
    if (y + r.height > window.innerHeight - 8) y = ev.clientY - r.height - 14;
    TIP.style.left = Math.max(4, x) + "px";
    TIP.style.top = Math.max(4, y) + "px";
  }
  function hideTip() { TIP.hidden = true; }
  function tipRows(rows) {
    return "<table>" + rows.map(function (r) {
      return "<tr><td>" + (r.color ? '<i class="sw" style="background:' + r.color + '"></i>' : "") + esc(r.k) +
        '</td><td class="num">' + esc(r.v) + "</td></tr>";
    }).join("") + "</table>";
  }
  function legend(parent, items, cls) {
    var box = E("div", {class: "legend " + (cls || "")}, parent);
    items.forEach(function (it) {
      var k = E("span", {class: "key", "data-key": it.key || it.label}, box);
      var i = E("i", {}, k);
      i.style.background = it.color;
      if (it.dashed) { i.style.background = "none"; i.style.borderTop = "2px dashed " + it.color; i.style.height = "0"; }
      k.appendChild(document.createTextNode(it.label));
    });
    return box;
  }
  function hatch(svg, color) {
    var id = "hatch" + (++uid), defs = S("defs", {}, svg);
    var p = S("pattern", {id: id, width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)"}, defs);
    S("rect", {width: 6, height: 6, fill: color, "fill-opacity": 0.18}, p);
    S("line", {x1: 0, y1: 0, x2: 0, y2: 6, stroke: color, "stroke-width": 3}, p);
    return "url(#" + id + ")";
  }
  function widthOf(el) { return Math.max(640, Math.floor(el.clientWidth || (document.querySelector("main") || body).clientWidth || 900)); }

  // ---------------------------------------------------------------------------------------------- shared time axis
  var TIME = {lo: 0, hi: 1, full: [0, 1], home: [0, 1], charts: [], bar: null};
  function setView(lo, hi, quiet) {
    var f = TIME.full, span = f[1] - f[0];
    lo = Math.max(f[0], lo); hi = Math.min(f[1], hi);
    if (!(hi - lo > span * 1e-6)) return;
    TIME.lo = lo; TIME.hi = hi;
    TIME.charts.forEach(function (c) { if (c.visible()) c.render(); });
    updateBar();
    if (!quiet && window.history && history.replaceState) {
      var whole = Math.abs(lo - TIME.home[0]) < 1e-9 && Math.abs(hi - TIME.home[1]) < 1e-9;
      try { history.replaceState(null, "", whole ? location.pathname + location.search : "#t=" + f2(lo) + "," + f2(hi)); } catch (e) { /* file: URLs in some browsers */ }
    }
  }
  function resetView() { setView(TIME.home[0], TIME.home[1]); }
  function updateBar() {
    if (!TIME.bar) return;
    var f = TIME.full;
    TIME.bar.querySelectorAll("button[data-t0]").forEach(function (b) {
      b.classList.toggle("active", Math.abs(+b.getAttribute("data-t0") - TIME.lo) < 1e-6 && Math.abs(+b.getAttribute("data-t1") - TIME.hi) < 1e-6);
    });
    var r = TIME.bar.querySelector(".range");
    var whole = TIME.lo <= f[0] && TIME.hi >= f[1];
    if (r) r.textContent = whole ? "everything: " + fmtS(f[0]) + " – " + fmtS(f[1]) :
      "showing " + fmtS(TIME.lo) + " – " + fmtS(TIME.hi) + " (" + fmtS(TIME.hi - TIME.lo) + ") of " + fmtS(f[0]) + " – " + fmtS(f[1]);
  }
  function zoomBar(el, presets) {
    if (!el) return;
    TIME.bar = el;
    E("span", {}, el, "Zoom:");
    var head = [{label: "whole run", t0: TIME.home[0], t1: TIME.home[1]}];
    if (TIME.lo > TIME.full[0] + 1e-9 || TIME.hi < TIME.full[1] - 1e-9) {
      head.push({label: "everything recorded", t0: TIME.full[0], t1: TIME.full[1]});  // e.g. a real run's server launch
    }
    var all = head.concat(presets);
    var steps = all.filter(function (p) { return /^step /.test(p.label); });
    var many = steps.length > 8;  // a long run: the first and last steps as buttons, every step in a list
    all.forEach(function (p) {
      if (many && steps.indexOf(p) > 0 && steps.indexOf(p) < steps.length - 1) return;
      var b = E("button", {type: "button", "data-t0": p.t0, "data-t1": p.t1, class: p.cls || ""}, el, p.label);
      b.addEventListener("click", function () { setView(p.t0, p.t1); });
    });
    if (many) {
      var sel = E("select", {"aria-label": "zoom to a step"}, el);
      E("option", {value: ""}, sel, "step …");
      steps.forEach(function (p, i) { E("option", {value: i}, sel, p.label); });
      sel.addEventListener("change", function () { var p = steps[+sel.value]; if (p) setView(p.t0, p.t1); });
    }
    E("span", {class: "range"}, el);
    updateBar();
  }

  /* A chart on the shared time axis. opts: height, plotTop, plotH, draw(svg, plot, sc), hover(t, y, ev) -> html. */
  function timeChart(host, opts) {
    var c = {host: host, opts: opts};
    c.visible = function () { return host.isConnected && host.offsetParent !== null; };
    c.render = function () {
      while (host.firstChild) host.removeChild(host.firstChild);
      var W = widthOf(host), w = W - LEFT - RIGHT, H = opts.height;
      var svg = S("svg", {class: "vime-chart time-chart " + (opts.cls || ""), width: W, height: H, viewBox: "0 0 " + W + " " + H,
        role: "img", "aria-label": opts.label || opts.cls || "chart"}, host);
      var clip = "clip" + (++uid), defs = S("defs", {}, svg), cp = S("clipPath", {id: clip}, defs);
      S("rect", {x: LEFT, y: 0, width: w, height: H}, cp);
      var lo = TIME.lo, hi = TIME.hi;
      var sc = {lo: lo, hi: hi, left: LEFT, w: w, W: W, H: H, top: opts.plotTop, h: opts.plotH,
        x: function (t) { return LEFT + (t - lo) / (hi - lo) * w; },
        t: function (px) { return lo + (px - LEFT) / w * (hi - lo); }};
      var plot = S("g", {"clip-path": "url(#" + clip + ")"}, svg);
      opts.draw(svg, plot, sc);
      var cross = S("line", {class: "cross", x1: 0, x2: 0, y1: opts.plotTop, y2: opts.plotTop + opts.plotH, visibility: "hidden"}, svg);
      var brush = S("rect", {class: "brush", x: 0, y: opts.plotTop, width: 0, height: opts.plotH, visibility: "hidden"}, svg);
      var ov = S("rect", {class: "overlay", x: LEFT, y: opts.plotTop, width: w, height: opts.plotH, fill: "transparent",
        style: "cursor: crosshair"}, svg);
      c.sc = sc; c.cross = cross;
      var start = null;
      function px(ev) { var r = svg.getBoundingClientRect(); return [ev.clientX - r.left, ev.clientY - r.top]; }
      ov.addEventListener("mousedown", function (ev) { start = px(ev)[0]; ev.preventDefault(); });
      ov.addEventListener("mousemove", function (ev) {
        var p = px(ev), t = sc.t(p[0]);
        TIME.charts.forEach(function (o) { if (o.cross && o.sc) { var x = o.sc.x(t); o.cross.setAttribute("x1", x); o.cross.setAttribute("x2", x); o.cross.setAttribute("visibility", "visible"); } });
        if (start !== null) {
          brush.setAttribute("x", Math.min(start, p[0])); brush.setAttribute("width", Math.abs(p[0] - start));
          brush.setAttribute("visibility", "visible");
        }
        showTip(opts.hover ? opts.hover(t, p[1], ev) : null, ev);
      });
      ov.addEventListener("mouseleave", function () {
        hideTip();
        TIME.charts.forEach(function (o) { if (o.cross) o.cross.setAttribute("visibility", "hidden"); });
      });
      ov.addEventListener("mouseup", function (ev) {
        if (start === null) return;
        var x1 = px(ev)[0], a = Math.min(start, x1), b = Math.max(start, x1);
        start = null;
        brush.setAttribute("visibility", "hidden");
        if (b - a > 3) setView(sc.t(a), sc.t(b));
      });
      ov.addEventListener("dblclick", function () { resetView(); });
      return svg;
    };
    TIME.charts.push(c);
    c.render();
    return c;
  }
  window.addEventListener("mouseup", function () {
    document.querySelectorAll("svg.vime-chart .brush").forEach(function (b) { b.setAttribute("visibility", "hidden"); });
  });

  function xAxis(svg, sc, y, title) {
    var g = S("g", {class: "axis axis-x"}, svg), tt = timeTicks(sc.lo, sc.hi, sc.w);
    S("line", {x1: sc.left, x2: sc.left + sc.w, y1: y, y2: y}, g);
    tt.ticks.forEach(function (t) {
      var x = sc.x(t);
      if (x < sc.left - 0.5 || x > sc.left + sc.w + 0.5) return;
      var tk = S("g", {class: "tick", transform: "translate(" + x.toFixed(1) + "," + y + ")"}, g);
      S("line", {y1: 0, y2: 4}, tk);
      S("text", {y: 15, "text-anchor": "middle"}, tk, tt.label(t));
    });
    if (title) S("text", {class: "axis-title", x: sc.left - 8, y: y + 15, "text-anchor": "end"}, g, title);
    return tt;
  }
  function vGrid(svg, sc, top, h) {
    var g = S("g", {class: "grid"}, svg);
    timeTicks(sc.lo, sc.hi, sc.w).ticks.forEach(function (t) {
      var x = sc.x(t);
      if (x >= sc.left && x <= sc.left + sc.w) S("line", {x1: x, x2: x, y1: top, y2: top + h}, g);
    });
  }
  function phaseAt(phases, t) {
    for (var i = phases.length - 1; i >= 0; i--) if (phases[i].t0 <= t && t < phases[i].t1) return phases[i];
    return null;
  }
  function phaseName(p) { return p ? p.label + (p.rollout_id !== null && p.rollout_id !== undefined ? " (step " + p.rollout_id + ")" : " (start-up)") : "between phases"; }
  function bisect(ts, t) { var lo = 0, hi = ts.length - 1; if (!ts.length || t < ts[0]) return -1; while (lo < hi) { var m = (lo + hi + 1) >> 1; if (ts[m] <= t) lo = m; else hi = m - 1; } return lo; }

  // ---------------------------------------------------------------------------------------------- one run: timeline
  /* Engines beyond this many are folded into one row (first and last kept) until the reader asks for all. */
  var MAX_ENGINE_ROWS = 8;
  function drawTimeline(host, V, extraRows, expanded) {
    var steps = V.windows || [], rows = [];
    rows.push({kind: "steps", label: "", h: 16});
    (extraRows || [{kind: "phases", label: "phases", phases: V.phases}]).forEach(function (r) { rows.push({kind: "phases", label: r.label, phases: r.phases, h: 22}); });
    var tracks = V.tracks || [], engines = tracks.filter(function (t) { return /engine\d+$/.test(t.name); });
    var fold = !expanded && engines.length > MAX_ENGINE_ROWS ? engines.slice(4, engines.length - 2) : [];
    tracks.forEach(function (tr) {
      var k = fold.indexOf(tr);
      if (k > 0) return;
      if (k === 0) { rows.push({kind: "more", label: "… " + fold.length + " more engines", h: 14}); return; }
      rows.push({kind: "track", label: tr.label, track: tr, h: Math.max(1, tr.lanes) * 11 + 5});
    });
    var y = 4;
    rows.forEach(function (r) { r.y = y; y += r.h + 2; });
    var plotH = y - 4, H = y + 26;
    var names = V.call_names || [], colors = V.call_colors || [];
    var chart = timeChart(host, {height: H, plotTop: 4, plotH: plotH, cls: "timeline", label: "timeline of phases and calls",
      draw: function (svg, plot, sc) {
        vGrid(svg, sc, 4, plotH);
        rows.forEach(function (r, i) {
          if (i % 2 === 0 && r.kind === "track") S("rect", {x: sc.left, y: r.y - 1, width: sc.w, height: r.h + 2, fill: "#f7f8fa"}, plot);
          if (r.label) S("text", {x: sc.left - 8, y: r.y + r.h / 2 + 4, "text-anchor": "end", class: "row-label" + (r.kind === "more" ? " more" : "")}, svg, r.label);
          if (r.kind === "more") return;
          if (r.kind === "steps") {
            steps.forEach(function (s, j) {
              var x0 = sc.x(s.t0), x1 = sc.x(s.t1);
              S("rect", {x: x0, y: r.y, width: Math.max(0.5, x1 - x0), height: r.h, fill: j % 2 ? "#e9edf3" : "#dde3ec", class: "step-window"}, plot);
              if (x1 - x0 > 44) S("text", {x: (Math.max(x0, sc.left) + Math.min(x1, sc.left + sc.w)) / 2, y: r.y + 12, "text-anchor": "middle"}, plot, s.label);
            });
          } else if (r.kind === "phases") {
            r.phases.forEach(function (p) {
              var x0 = sc.x(p.t0), x1 = sc.x(p.t1);
              S("rect", {x: x0, y: r.y, width: Math.max(0.5, x1 - x0), height: r.h, fill: p.color, class: "phase-span", "data-phase": p.name}, plot);
              var vis = Math.min(x1, sc.left + sc.w) - Math.max(x0, sc.left);
              if (vis > 30) fitLabel(plot, Math.max(x0, sc.left) + 4, r.y + 15, vis - 8, [p.label]);
            });
          } else {
            r.track.spans.forEach(function (s) {
              var x0 = sc.x(s[0]), x1 = sc.x(s[1]);
              if (x1 < sc.left || x0 > sc.left + sc.w) return;
              S("rect", {x: x0, y: r.y + 2 + s[3] * 11, width: Math.max(0.8, x1 - x0), height: 9, fill: colors[s[2]], class: "call-span"}, plot);
            });
          }
        });
        if (V.oom) {
          var g = S("g", {class: "oom-marker"}, svg), x = sc.x(V.oom.t);
          S("line", {x1: x, x2: x, y1: 2, y2: 4 + plotH}, g);
          S("text", {x: x - 4, y: 14, "text-anchor": "end"}, g, "✕ OOM on GPU " + V.oom.gpu);
        }
        xAxis(svg, sc, 4 + plotH + 2, "");
      },
      hover: function (t, py) {
        var row = null;
        rows.forEach(function (r) { if (py >= r.y && py <= r.y + r.h + 2) row = r; });
        if (!row) return null;
        var head = '<div class="tip-title">t = ' + fmtS(t) + "</div>";
        if (row.kind === "more") return head + esc(row.label) + ": the button under the timeline shows every engine";
        if (row.kind === "steps") {
          var w = steps.filter(function (s) { return s.t0 <= t && t < s.t1; })[0];
          return w ? head + esc(w.label) + ": " + fmtS(w.t1 - w.t0) : head;
        }
        if (row.kind === "phases") {
          var p = phaseAt(row.phases, t);
          return head + (row.label !== "phases" ? esc(row.label) + ": " : "") + (p ? esc(phaseName(p)) + " — " + fmtS(p.t1 - p.t0) + " (" + fmtS(p.t0) + " → " + fmtS(p.t1) + ")" : "between phases");
        }
        var hits = row.track.spans.filter(function (s) { return s[0] <= t && t <= s[1]; });
        if (!hits.length) return head + esc(row.label) + ": idle";
        return head + esc(row.label) + tipRows(hits.map(function (s) { return {k: names[s[2]], v: fmtS(s[1] - s[0]), color: colors[s[2]]}; }));
      }});
    var used = {};
    (V.tracks || []).forEach(function (tr) { tr.spans.forEach(function (s) { used[s[2]] = 1; }); });
    var phaseSeen = {}, items = [];
    (extraRows || [{phases: V.phases}]).forEach(function (r) { r.phases.forEach(function (p) { if (!phaseSeen[p.name]) { phaseSeen[p.name] = 1; items.push({key: "phase:" + p.name, label: p.label, color: p.color}); } }); });
    var lgHost = host.parentNode.insertBefore(E("div", {class: "timeline-legend"}), host.nextSibling);
    var lg = legend(lgHost, items, "phase-legend");
    if (fold.length || (expanded && engines.length > MAX_ENGINE_ROWS)) {
      var btn = E("button", {type: "button", class: "expand-engines"}, lgHost.insertBefore(E("div", {class: "toolbar"}), lgHost.firstChild),
        expanded ? "fold the engines" : "show all " + engines.length + " engines");
      btn.addEventListener("click", function () {
        TIME.charts.splice(TIME.charts.indexOf(chart), 1);
        while (host.firstChild) host.removeChild(host.firstChild);
        lgHost.parentNode.removeChild(lgHost);
        drawTimeline(host, V, extraRows, !expanded);
      });
    }
    if (Object.keys(used).length) {
      E("span", {class: "key", style: "color:#5d6675"}, lg, "calls:");
      names.forEach(function (n, i) { if (used[i]) { var k = E("span", {class: "key", "data-key": "call:" + n}, lg); var sw = E("i", {}, k); sw.style.background = colors[i]; k.appendChild(document.createTextNode(n)); } });
    }
    return chart;
  }

  // ---------------------------------------------------------------------------------------------- one run: memory
  function totalsOf(group) {
    var keys = Object.keys(group.series), tot = group.t.map(function () { return 0; });
    keys.forEach(function (k) { group.series[k].forEach(function (v, j) { tot[j] += v; }); });
    return tot;
  }
  /* One memory chart: stacked areas by owner/tag, phase bands behind, capacity, the OOM if it happened here. */
  function memoryChart(host, group, data, V, legendMap, gpuLabel) {
    var keys = (V.memory.legend || []).map(function (l) { return l.key; }).filter(function (k) { return data.series[k]; });
    var tot = totalsOf(data), ymax = Math.max.apply(null, [group.capacity_gib || 0].concat(tot));
    var oom = V.oom && group.gpus.indexOf(V.oom.gpu) >= 0 ? V.oom : null;
    if (oom && oom.used_gib !== null) ymax = Math.max(ymax, oom.used_gib + oom.requested_gib);
    ymax = ymax * 1.06 || 1;
    var top = 8, h = 150, H = top + h + 26;
    var yt = linTicks(0, ymax, 4);
    function y(v) { return top + h - v / ymax * h; }
    return timeChart(host, {height: H, plotTop: top, plotH: h, cls: "memory", label: "memory over time, " + (gpuLabel || group.label),
      draw: function (svg, plot, sc) {
        var g = S("g", {class: "grid"}, svg);
        yt.forEach(function (v) { S("line", {x1: sc.left, x2: sc.left + sc.w, y1: y(v), y2: y(v)}, g); });
        (V.phases || []).forEach(function (p) {
          var x0 = sc.x(p.t0), x1 = sc.x(p.t1);
          S("rect", {class: "phase-band", "data-phase": p.name, x: x0, y: top, width: Math.max(0.5, x1 - x0), height: h, fill: p.color, "fill-opacity": 0.13}, plot);
        });
        var ts = data.t, n = ts.length, tEnd = Math.max(V.t_end, ts[n - 1] || 0);
        var i0 = Math.max(0, bisect(ts, sc.lo)), i1 = Math.min(n - 1, bisect(ts, sc.hi) + 1);
        var lower = [];
        for (var j = i0; j <= i1; j++) lower.push(0);
        keys.forEach(function (k) {
          var vals = data.series[k], up = [], dn = [], cur = [];
          for (var j = i0; j <= i1; j++) {
            var a = sc.x(ts[j]), b = sc.x(j + 1 < n ? ts[j + 1] : tEnd), lo = lower[j - i0], hi = lo + vals[j];
            cur.push(hi);
            up.push(a.toFixed(1) + "," + y(hi).toFixed(1), b.toFixed(1) + "," + y(hi).toFixed(1));
            dn.push(a.toFixed(1) + "," + y(lo).toFixed(1), b.toFixed(1) + "," + y(lo).toFixed(1));
          }
          lower = cur;
          var lg = legendMap[k] || {color: "#999", label: k};
          S("polygon", {class: "mem-area", "data-key": k, points: up.concat(dn.reverse()).join(" "), fill: lg.color, "fill-opacity": 0.9}, plot);
        });
        var ax = S("g", {class: "axis axis-y"}, svg);
        S("line", {x1: sc.left, x2: sc.left, y1: top, y2: top + h}, ax);
        yt.forEach(function (v) {
          var tk = S("g", {class: "tick", transform: "translate(" + sc.left + "," + y(v).toFixed(1) + ")"}, ax);
          S("line", {x1: -4, x2: 0}, tk);
          S("text", {x: -7, y: 4, "text-anchor": "end"}, tk, v === 0 ? "0" : (+v.toPrecision(6)) + " GiB");
        });
        if (group.capacity_gib) {
          var cy = y(group.capacity_gib), right = !(oom && sc.x(oom.t) > sc.left + sc.w * 0.55);
          S("line", {class: "capacity", x1: sc.left, x2: sc.left + sc.w, y1: cy, y2: cy, stroke: "#b42318", "stroke-dasharray": "5 4"}, svg);
          S("text", {x: right ? sc.left + sc.w - 4 : sc.left + 4, y: cy - 4, "text-anchor": right ? "end" : "start", fill: "#b42318"}, svg,
            "capacity " + fmtG(group.capacity_gib));
        }
        if (group.peaks_gib) {
          Object.keys(group.peaks_gib).forEach(function (name) {
            var py = y(group.peaks_gib[name]);
            S("line", {class: "sim-peak", x1: sc.left, x2: sc.left + sc.w, y1: py, y2: py, stroke: "#59a14f", "stroke-dasharray": "2 3", "stroke-width": 2}, svg);
            S("text", {x: sc.left + 4, y: py - 4, fill: "#3d7a37", class: "halo"}, svg, name + " " + fmtG(group.peaks_gib[name]));
          });
        }
        if (oom) {
          var og = S("g", {class: "oom-marker", "data-gpu": oom.gpu}, svg), x = sc.x(oom.t);
          S("line", {x1: x, x2: x, y1: top, y2: top + h}, og);
          if (oom.used_gib !== null) {
            var y0 = y(oom.used_gib), y1 = y(oom.used_gib + oom.requested_gib);
            S("rect", {class: "oom-ask", x: x - 7, y: y1, width: 14, height: Math.max(1, y0 - y1), fill: hatch(svg, "#b42318"), stroke: "#b42318"}, og);
          }
          var left = x > sc.left + sc.w * 0.55;
          S("text", {x: left ? x - 10 : x + 10, y: top + h - 8, "text-anchor": left ? "end" : "start", class: "oom-label"}, og,
            "✕ " + oom.label + (group.gpus.length > 1 ? " (GPU " + oom.gpu + ")" : ""));
        }
        xAxis(svg, sc, top + h + 2, "");
      },
      hover: function (t) {
        var j = bisect(data.t, t);
        var p = phaseAt(V.phases || [], t);
        var head = '<div class="tip-title">' + esc(gpuLabel || group.label) + " · t = " + fmtS(t) + "</div>" + esc(phaseName(p));
        if (j < 0) return head + "<br>nothing allocated yet";
        var rows = keys.map(function (k) { return {k: (legendMap[k] || {}).label || k, v: data.series[k][j], color: (legendMap[k] || {}).color}; })
          .filter(function (r) { return r.v > 0; }).sort(function (a, b) { return b.v - a.v; });
        var more = rows.length > 10 ? rows.length - 10 : 0;
        rows = rows.slice(0, 10).map(function (r) { return {k: r.k, v: fmtG(r.v), color: r.color}; });
        if (more) rows.push({k: more + " more", v: ""});
        rows.push({k: "total", v: fmtG(tot[j])});
        if (group.capacity_gib) rows.push({k: "free", v: fmtG(group.capacity_gib - tot[j])});
        return head + tipRows(rows);
      }});
  }
  function ownerNote(group) {
    var byOwner = {}, roles = {};
    group.members.forEach(function (m) { Object.keys(m.owners).forEach(function (role) { (roles[role] = roles[role] || {})[m.owners[role]] = 1; }); });
    group.members.forEach(function (m) { Object.keys(m.owners).forEach(function (role) { if (Object.keys(roles[role]).length > 1) (byOwner[m.owners[role]] = byOwner[m.owners[role]] || []).push(m.gpu); }); });
    var parts = Object.keys(byOwner).sort().map(function (o) { return o + " on " + ranges(byOwner[o]); });
    return parts.length ? parts.slice(0, 4).join(", ") + (parts.length > 4 ? ", …" : "") : "";
  }
  function ranges(gs) {
    gs = gs.slice().sort(function (a, b) { return a - b; });
    var out = [], run = [];
    gs.forEach(function (g) { if (run.length && g === run[run.length - 1] + 1) run.push(g); else { if (run.length) out.push(run); run = [g]; } });
    if (run.length) out.push(run);
    return (out.length === 1 && out[0].length === 1 ? "GPU " : "GPUs ") + out.map(function (r) { return r.length > 1 ? r[0] + "–" + r[r.length - 1] : "" + r[0]; }).join(", ");
  }
  function drawMemory(host, V) {
    var legendMap = {}, order = {};
    (V.memory.legend || []).forEach(function (l, i) { legendMap[l.key] = l; order[l.key] = i; });
    (V.memory.groups || []).forEach(function (group) {
      var many = group.gpus.length > 1, hasOom = V.oom && group.gpus.indexOf(V.oom.gpu) >= 0;
      var box = E("div", {class: "gpu-group" + (hasOom ? " has-oom" : ""), "data-gpus": group.host ? "host" : group.gpus.join(","),
        "data-kind": group.kind, "data-collapsed": many ? "true" : null}, host);
      var head = E("div", {class: "group-head"}, box);
      E("span", {class: "group-title"}, head, group.label + (group.kind === "identical" ? " identical" : group.kind === "alike" ? " alike" : ""));
      var notes = [];
      if (group.kind === "identical") notes.push("the same memory over time on each GPU");
      if (group.kind === "alike") {
        var d = Object.keys(group.differ_gib).slice(0, 2).map(function (k) { return (legendMap[k] || {label: k}).label + " by up to " + fmtG(group.differ_gib[k]); });
        notes.push((group.same_order === false ? "the same tags, totals within " + Math.round(100 * group.alike_share) + " % of the GPU at every moment"
          : "the same allocations in the same order" + (group.shift_s > 0 ? " (moments up to " + fmtS(group.shift_s) + " apart)" : "")) +
          (d.length ? "; sizes differ: " + d.join(", ") : "") + "; drawn: GPU " + group.shown_gpu + ", the fullest");
      }
      var on = ownerNote(group);
      if (on) notes.push(on);
      if (hasOom) notes.push("out of memory on GPU " + V.oom.gpu + " at " + fmtS(V.oom.t));
      if (group.host) notes = [group.note];
      E("span", {class: "group-note"}, head, notes.join("; "));
      var chartHost = E("div", {class: "chart"}, box);
      memoryChart(chartHost, group, group, V, legendMap, group.host ? "host" : group.label);
      var present = {};
      group.variants.forEach(function (v) { Object.keys(v.series).forEach(function (k) { present[k] = 1; }); });
      legend(box, Object.keys(present).sort(function (a, b) { return order[b] - order[a]; }).map(function (k) { return legendMap[k]; }));
      if (many) {
        var members = E("div", {class: "members", hidden: ""}, box), built = false;
        var btn = E("button", {type: "button", class: "expand", "aria-expanded": "false"}, head, "show each GPU (" + group.gpus.length + ")");
        btn.addEventListener("click", function () {
          var open = members.hidden;
          if (open && !built) {
            built = true;
            group.members.forEach(function (m) {
              var who = Object.keys(m.owners).map(function (r) { return m.owners[r]; }).join(", ");
              E("div", {class: "member-title"}, members, "GPU " + m.gpu + (who ? " — " + who : ""));
              memoryChart(E("div", {class: "chart member", "data-gpu": m.gpu}, members), {gpus: [m.gpu], capacity_gib: group.capacity_gib},
                group.variants[m.variant], V, legendMap, "GPU " + m.gpu);
            });
          }
          members.hidden = !open;
          chartHost.hidden = open;
          box.setAttribute("data-collapsed", open ? "false" : "true");
          btn.setAttribute("aria-expanded", open ? "true" : "false");
          btn.textContent = open ? "collapse to one chart" : "show each GPU (" + group.gpus.length + ")";
          TIME.charts.forEach(function (c) { if (c.visible()) c.render(); });
        });
      }
    });
  }

  /* The first of `texts` that fits in `room` pixels, as a segment label (none when none fits). */
  function fitLabel(parent, x, y, room, texts, color) {
    if (room < 14) return null;
    var t = S("text", {class: "seg-label", x: x, y: y, style: color ? "fill:" + color : null}, parent, texts[0]);
    for (var i = 0; i < texts.length; i++) {
      t.textContent = texts[i];
      if (t.getComputedTextLength() <= room) return t;
    }
    parent.removeChild(t);
    return null;
  }

  // ---------------------------------------------------------------------------------------------- phase bars
  function phaseBars(host, rows) {
    if (!host || !rows || !rows.length) return;
    var W = widthOf(host), w = W - LEFT - 140, bh = 24, gap = 10, top = 6;
    var max = Math.max.apply(null, rows.map(function (r) { return Math.max(r.total, (r.total_band || [0, 0])[1]); })) || 1;
    var H = top + rows.length * (bh + gap) + 26;
    var svg = S("svg", {class: "vime-chart phase-bars", width: W, height: H, viewBox: "0 0 " + W + " " + H}, host);
    var st = secTicks(max, Math.max(2, Math.floor(w / 90))), ticks = st.ticks;
    var scale = w / Math.max(max, ticks[ticks.length - 1]);
    function x(s) { return LEFT + s * scale; }
    var g = S("g", {class: "grid"}, svg);
    ticks.forEach(function (v) { S("line", {x1: x(v), x2: x(v), y1: top, y2: H - 24}, g); });
    var seen = {}, items = [];
    rows.forEach(function (r, i) {
      var y0 = top + i * (bh + gap), acc = 0;
      S("text", {x: LEFT - 8, y: y0 + bh / 2 + 4, "text-anchor": "end", "font-weight": i === 0 ? 600 : 400}, svg, r.label);
      r.segments.forEach(function (s, j) {
        var last = r.oom && j === r.segments.length - 1;
        var rect = S("rect", {class: "phase-seg", "data-phase": s.name, x: x(acc), y: y0, width: Math.max(0.5, s.s * scale), height: bh,
          fill: last ? hatch(svg, s.color) : s.color, stroke: last ? "#b42318" : "none"}, svg);
        var pct = r.total ? 100 * s.s / r.total : 0;
        rect.addEventListener("mousemove", function (ev) {
          var band = r.bands && r.bands[s.name];
          showTip('<div class="tip-title">' + esc(s.label) + " — " + fmtS(s.s) + "</div>" + (last ? "out of memory after " + fmtS(s.s) : pct.toFixed(1) + " % of " + fmtS(r.total)) +
            (band ? "<br>range " + fmtS(band[0]) + " – " + fmtS(band[1]) : "") + "<br>" + esc(r.label), ev);
        });
        rect.addEventListener("mouseleave", hideTip);
        fitLabel(svg, x(acc) + 5, y0 + 16, s.s * scale - 8, [s.label + (r.oom ? "" : " " + pct.toFixed(0) + " %"), s.label, pct.toFixed(0) + " %"],
          last ? "#b42318" : null);
        acc += s.s;
        if (!seen[s.name]) { seen[s.name] = 1; items.push({key: "phase:" + s.name, label: s.label, color: s.color}); }
      });
      var endx = x(acc);
      if (r.oom) {
        var og = S("g", {class: "oom-marker"}, svg);
        S("line", {x1: endx, x2: endx, y1: y0 - 3, y2: y0 + bh + 3}, og);
        S("text", {x: endx + 6, y: y0 + 16}, og, "✕ OOM at " + fmtS(r.total));
      } else {
        S("text", {x: endx + 6, y: y0 + 16, "font-weight": 600}, svg, fmtS(r.total));
      }
      if (r.total_band) {
        var wb = S("g", {class: "band"}, svg), a = x(r.total_band[0]), b = x(r.total_band[1]), ym = y0 + bh / 2;
        S("line", {x1: a, x2: b, y1: ym, y2: ym, stroke: "#1d2330", "stroke-width": 1.5}, wb);
        S("line", {x1: a, x2: a, y1: ym - 6, y2: ym + 6, stroke: "#1d2330"}, wb);
        S("line", {x1: b, x2: b, y1: ym - 6, y2: ym + 6, stroke: "#1d2330"}, wb);
      }
    });
    var ax = S("g", {class: "axis axis-x"}, svg), ya = H - 22;
    S("line", {x1: LEFT, x2: LEFT + w, y1: ya, y2: ya}, ax);
    ticks.forEach(function (v) {
      var tk = S("g", {class: "tick", transform: "translate(" + x(v).toFixed(1) + "," + ya + ")"}, ax);
      S("line", {y1: 0, y2: 4}, tk);
      S("text", {y: 15, "text-anchor": "middle"}, tk, st.label(v));
    });
    legend(host, items, "phase-legend");
  }

  // ---------------------------------------------------------------------------------------------- page: one run
  /* The axis covers [lo, hi] (everything recorded); the first view is [vlo, vhi] (the phases: a real run's
     server launch before start-up stays one click away), or the #t=a,b of the address. */
  function initTime(lo, hi, vlo, vhi) {
    TIME.full = [lo, hi > lo ? hi : lo + 1];
    TIME.lo = Math.max(TIME.full[0], vlo === undefined ? lo : vlo); TIME.hi = Math.min(TIME.full[1], vhi === undefined ? hi : vhi);
    if (!(TIME.hi > TIME.lo)) { TIME.lo = TIME.full[0]; TIME.hi = TIME.full[1]; }
    TIME.home = [TIME.lo, TIME.hi];
    var m = /#t=(-?[\d.]+),(-?[\d.]+)/.exec(location.hash || "");
    if (m && +m[2] > +m[1]) { TIME.lo = Math.max(TIME.full[0], +m[1]); TIME.hi = Math.min(TIME.full[1], +m[2]); }
  }
  /* The first view: everything, unless what precedes the first phase (a real run's server launch) is longer
     than half of what follows it; then from just before the first phase. */
  function phaseExtent(phases, start, end) {
    if (!phases || !phases.length) return [undefined, undefined];
    var lo = Math.min.apply(null, phases.map(function (p) { return p.t0; }));
    if (lo - start <= 0.5 * (end - lo)) return [start, end];
    return [lo - 0.02 * (end - lo), end];
  }
  /* The left gutter fits the longest row label of the page's time charts. */
  function sizeGutter(labels) {
    var w = textWidths(document.querySelector("main") || body, labels);
    LEFT = Math.max(150, Math.min(280, Math.ceil(Math.max.apply(null, w.concat([0])) + 24)));
  }
  function runPage() {
    var V = D.view;
    phaseBars(document.getElementById("phase-chart"), D.bars);
    sizeGutter((V.tracks || []).map(function (t) { return t.label; }).concat(["phases", "… 00 more engines"]));
    var t0 = Math.min(0, V.t_start || 0), ext = D.measured ? phaseExtent(V.phases, t0, V.t_end) : [t0, V.t_end];
    initTime(t0, V.t_end, ext[0], ext[1]);
    var presets = (V.windows || []).slice();
    if (V.oom) {
      var last = presets.filter(function (p) { return p.t0 <= V.oom.t; }).pop();
      presets.push({label: "the OOM", t0: last ? last.t0 : 0, t1: Math.min(V.t_end, V.oom.t + Math.max(0.5, (V.oom.t - (last ? last.t0 : 0)) * 0.1)), cls: "oom"});
    }
    zoomBar(document.getElementById("zoom-bar"), presets);
    drawTimeline(document.getElementById("timeline"), V);
    drawMemory(document.getElementById("memory-charts"), V);
  }

  // ---------------------------------------------------------------------------------------------- page: sweep / search
  function textWidths(host, texts, bold) {
    var m = S("svg", {class: "vime-chart", width: 10, height: 10, style: "position:absolute;visibility:hidden"}, host);
    var out = texts.map(function (t, i) { return S("text", {"font-weight": bold === i ? 700 : 400}, m, t).getComputedTextLength(); });
    host.removeChild(m);
    return out;
  }
  function rankLabel(r, i, best) { return (i === best ? "★ " : "") + r.rank + ". " + r.label; }
  function rankChart(host, rows, best) {
    var W = widthOf(host), gapW = 24;
    var widths = textWidths(host, rows.map(function (r, i) { return rankLabel(r, i, best); }), best);
    var labelW = Math.min(W * 0.42, Math.max(140, Math.max.apply(null, widths.concat([0])) + 18));
    var tw = (W - labelW - gapW - 20) * 0.58, mw = (W - labelW - gapW - 20) - tw;
    var rh = 20, top = 22, H = top + rows.length * rh + 24;
    var svg = S("svg", {class: "vime-chart rank-chart", width: W, height: H, viewBox: "0 0 " + W + " " + H}, host);
    var tmax = Math.max.apply(null, rows.map(function (r) { return r.t_step || 0; }).concat([1e-9]));
    var gmax = Math.max.apply(null, rows.map(function (r) { return Math.max(r.capacity_gib || 0, r.peak_gib || 0) + (r.short_by_gib || 0); }).concat([1e-9]));
    var stt = secTicks(tmax, Math.max(2, Math.floor((tw - 56) / 80))), tt = stt.ticks, gt = linTicks(0, gmax, Math.max(2, Math.floor(mw / 70)));
    var ts = (tw - 56) / Math.max(tmax, tt[tt.length - 1]), gs = mw / Math.max(gmax, gt[gt.length - 1]);
    var x0 = labelW, m0 = labelW + tw + gapW;
    S("text", {x: x0, y: 12, "font-weight": 600}, svg, "T_step by phase");
    S("text", {x: m0, y: 12, "font-weight": 600}, svg, "peak memory (fullest GPU) and capacity");
    var grid = S("g", {class: "grid"}, svg);
    tt.forEach(function (v) { S("line", {x1: x0 + v * ts, x2: x0 + v * ts, y1: top, y2: H - 22}, grid); });
    gt.forEach(function (v) { S("line", {x1: m0 + v * gs, x2: m0 + v * gs, y1: top, y2: H - 22}, grid); });
    var bad = hatch(svg, "#b42318"), seen = {}, items = [];
    rows.forEach(function (r, i) {
      var y = top + i * rh, g = S("g", {class: "rank-row", "data-status": r.status, "data-rank": r.rank}, svg);
      if (i % 2 === 0) S("rect", {x: 0, y: y, width: W, height: rh, fill: "#f7f8fa"}, g);
      var text = rankLabel(r, i, best);
      if (widths[i] > labelW - 18) text = text.slice(0, Math.max(8, Math.floor(text.length * (labelW - 30) / widths[i]))) + "…";
      S("text", {x: x0 - 8, y: y + 14, "text-anchor": "end", "font-weight": i === best ? 700 : 400, fill: r.status === "fits" ? "#1d2330" : "#8a909c", class: "rank-label"}, g, text);
      if (r.status === "fits") {
        var acc = 0;
        Object.keys(r.phases).forEach(function (p) {
          S("rect", {class: "phase-seg", "data-phase": p, x: x0 + acc * ts, y: y + 3, width: Math.max(0.5, r.phases[p] * ts), height: rh - 6, fill: D.phase_colors[p] || "#999"}, g);
          acc += r.phases[p];
          if (!seen[p]) { seen[p] = 1; items.push({key: "phase:" + p, label: D.phase_labels[p] || p, color: D.phase_colors[p] || "#999"}); }
        });
        S("text", {x: x0 + acc * ts + 4, y: y + 14}, g, fmtS(r.t_step));
      } else {
        S("text", {x: x0 + 4, y: y + 14, fill: r.status === "oom" ? "#b42318" : "#8a909c", class: r.status === "oom" ? "oom-reason" : "invalid-reason"}, g,
          (r.reason || r.status).slice(0, Math.floor(tw / 6.2)));
      }
      if (r.status !== "invalid" && r.peak_gib) {
        var fill = r.status === "oom" ? "#e15759" : ((r.headroom_gib || 0) < 0.05 * (r.capacity_gib || 1) ? "#c17d11" : "#8d9bb0");
        S("rect", {class: "mem-bar", x: m0, y: y + 4, width: Math.max(0.5, r.peak_gib * gs), height: rh - 8, fill: fill}, g);
        if (r.short_by_gib) S("rect", {class: "oom-short", x: m0 + (r.capacity_gib || r.peak_gib) * gs, y: y + 4, width: Math.max(2, r.short_by_gib * gs), height: rh - 8, fill: bad, stroke: "#b42318"}, g);
        if (r.capacity_gib) S("line", {class: "capacity", x1: m0 + r.capacity_gib * gs, x2: m0 + r.capacity_gib * gs, y1: y + 1, y2: y + rh - 1, stroke: "#b42318", "stroke-width": 2}, g);
      }
      var hit = S("rect", {x: 0, y: y, width: W, height: rh, fill: "transparent"}, g);
      hit.addEventListener("mousemove", function (ev) {
        var rows2 = [{k: "status", v: r.status === "fits" ? "fits" : r.status === "oom" ? "out of memory" : "invalid"}];
        if (r.t_step !== null) rows2.push({k: "T_step", v: fmtS(r.t_step)});
        Object.keys(r.phases).forEach(function (p) { rows2.push({k: D.phase_labels[p] || p, v: fmtS(r.phases[p]), color: D.phase_colors[p]}); });
        if (r.gpus) rows2.push({k: "GPUs", v: r.gpus});
        if (r.gpu_s_step !== null) rows2.push({k: "GPU·s per step", v: fmtN(r.gpu_s_step)});
        if (r.gpu_s_1k !== null) rows2.push({k: "GPU·s per 1k samples", v: fmtN(r.gpu_s_1k)});
        if (r.status !== "invalid") rows2.push({k: "peak / capacity", v: fmtG(r.peak_gib) + " / " + fmtG(r.capacity_gib)});
        showTip('<div class="tip-title">' + esc(r.rank + ". " + r.label) + "</div>" + tipRows(rows2) + (r.reason ? esc(r.reason) : ""), ev);
      });
      hit.addEventListener("mouseleave", hideTip);
    });
    var ya = H - 22, ax = S("g", {class: "axis axis-x"}, svg);
    S("line", {x1: x0, x2: x0 + tw - 56, y1: ya, y2: ya}, ax);
    S("line", {x1: m0, x2: m0 + mw, y1: ya, y2: ya}, ax);
    tt.forEach(function (v) { var tk = S("g", {class: "tick", transform: "translate(" + (x0 + v * ts).toFixed(1) + "," + ya + ")"}, ax); S("line", {y1: 0, y2: 4}, tk); S("text", {y: 15, "text-anchor": "middle"}, tk, stt.label(v)); });
    gt.forEach(function (v) { var tk = S("g", {class: "tick", transform: "translate(" + (m0 + v * gs).toFixed(1) + "," + ya + ")"}, ax); S("line", {y1: 0, y2: 4}, tk); S("text", {y: 15, "text-anchor": "middle"}, tk, v === 0 ? "0" : (+v.toPrecision(6)) + " GiB"); });
    items.push({key: "mem:peak", label: "peak memory", color: "#8d9bb0"}, {key: "mem:tight", label: "under 5 % headroom", color: "#c17d11"},
      {key: "mem:oom", label: "out of memory (hatched: what was missing)", color: "#e15759"}, {key: "mem:cap", label: "capacity", color: "#b42318"});
    legend(host, items);
  }

  /* A scatter over a numeric x axis (log2 for GPU counts); points {x, y, color, label, tip, ring, cross}. */
  function scatter(host, spec) {
    var W = widthOf(host), left = 80, right = 150, top = 12, h = 260, H = top + h + 40, w = W - left - right;
    var svg = S("svg", {class: "vime-chart scatter " + (spec.cls || ""), width: W, height: H, viewBox: "0 0 " + W + " " + H}, host);
    var pts = spec.points, xs = pts.map(function (p) { return p.x; }), ys = pts.filter(function (p) { return p.y !== null; }).map(function (p) { return p.y; });
    if (spec.hline) ys.push(spec.hline.y);
    var xlo = Math.min.apply(null, xs), xhi = Math.max.apply(null, xs);
    var logx = spec.logx && xlo > 0;
    if (logx) { xlo = Math.pow(2, Math.floor(Math.log2(xlo))); xhi = Math.pow(2, Math.ceil(Math.log2(xhi))); if (xhi === xlo) { xlo /= 2; xhi *= 2; } }
    else if (xhi === xlo) { xlo -= 1; xhi += 1; }
    var ymax = (Math.max.apply(null, ys.concat([1e-9]))) * 1.12, yfmt = spec.yFmt, yt;
    if (spec.ySeconds) { var sy = secTicks(ymax, 5); yt = sy.ticks; yfmt = sy.label; } else yt = linTicks(0, ymax, 5);
    ymax = Math.max(ymax, yt[yt.length - 1]);
    function X(v) { return left + (logx ? (Math.log2(v) - Math.log2(xlo)) / (Math.log2(xhi) - Math.log2(xlo)) : (v - xlo) / (xhi - xlo)) * w; }
    function Y(v) { return top + h - v / ymax * h; }
    var g = S("g", {class: "grid"}, svg), xt = spec.xTicks || (logx ? log2Ticks(xlo, xhi) : linTicks(xlo, xhi, 6));
    yt.forEach(function (v) { S("line", {x1: left, x2: left + w, y1: Y(v), y2: Y(v)}, g); });
    xt.forEach(function (v) { S("line", {x1: X(v), x2: X(v), y1: top, y2: top + h}, g); });
    var ax = S("g", {class: "axis axis-x"}, svg);
    S("line", {x1: left, x2: left + w, y1: top + h, y2: top + h}, ax);
    xt.forEach(function (v) { var tk = S("g", {class: "tick", transform: "translate(" + X(v).toFixed(1) + "," + (top + h) + ")"}, ax); S("line", {y1: 0, y2: 4}, tk); S("text", {y: 16, "text-anchor": "middle"}, tk, (+v.toPrecision(6)) + ""); });
    S("text", {class: "axis-title", x: left + w / 2, y: top + h + 34, "text-anchor": "middle"}, ax, spec.xTitle);
    var ay = S("g", {class: "axis axis-y"}, svg);
    S("line", {x1: left, x2: left, y1: top, y2: top + h}, ay);
    yt.forEach(function (v) { var tk = S("g", {class: "tick", transform: "translate(" + left + "," + Y(v).toFixed(1) + ")"}, ay); S("line", {x1: -4, x2: 0}, tk); S("text", {x: -7, y: 4, "text-anchor": "end"}, tk, yfmt(v)); });
    S("text", {class: "axis-title", x: 14, y: top + h / 2, transform: "rotate(-90 14 " + (top + h / 2) + ")", "text-anchor": "middle"}, ay, spec.yTitle);
    if (spec.hline) {
      S("line", {class: "target", x1: left, x2: left + w, y1: Y(spec.hline.y), y2: Y(spec.hline.y), stroke: "#b25e09", "stroke-dasharray": "6 4"}, svg);
      S("text", {x: left + w + 4, y: Y(spec.hline.y) + 4, fill: "#b25e09"}, svg, spec.hline.label);
    }
    (spec.lines || []).forEach(function (ln) {
      var d = ln.points.map(function (p, i) { return (i ? "L" : "M") + X(p[0]).toFixed(1) + "," + Y(p[1]).toFixed(1); }).join(" ");
      S("path", {class: ln.cls || "line", d: d, fill: "none", stroke: ln.color, "stroke-width": ln.width || 2, "stroke-dasharray": ln.dash || null}, svg);
      if (ln.label && ln.points.length) { var lp = ln.points[ln.points.length - 1]; S("text", {x: X(lp[0]) + 8, y: Y(lp[1]) + 4, fill: ln.color}, svg, ln.label); }
    });
    var byX = {};
    pts.forEach(function (p) {
      var k = p.x, n = byX[k] = (byX[k] || 0) + 1, jit = ((n % 2 ? 1 : -1) * Math.floor(n / 2)) * 5;
      var cx = X(p.x) + jit, cy = p.y === null ? top + 8 : Y(p.y), el;
      if (p.cross) {
        el = S("g", {class: "pt-oom"}, svg);
        S("path", {d: "M" + (cx - 4) + "," + (cy - 4) + "L" + (cx + 4) + "," + (cy + 4) + "M" + (cx - 4) + "," + (cy + 4) + "L" + (cx + 4) + "," + (cy - 4), stroke: "#b42318", "stroke-width": 2}, el);
        S("circle", {cx: cx, cy: cy, r: 7, fill: "transparent"}, el);
      } else {
        el = S("circle", {class: "pt" + (p.ring ? " best" : ""), cx: cx, cy: cy, r: p.ring ? 6 : 4.5, fill: p.color, stroke: p.ring ? "#1d2330" : "#fff", "stroke-width": p.ring ? 2.5 : 1}, svg);
        if (p.ring) { S("circle", {cx: cx, cy: cy, r: 11, fill: "none", stroke: "#1d2330", "stroke-width": 1.5}, svg); S("text", {x: cx + 14, y: cy - 8, "font-weight": 700}, svg, p.ringLabel || "best"); }
      }
      el.addEventListener("mousemove", function (ev) { showTip(p.tip, ev); });
      el.addEventListener("mouseleave", hideTip);
    });
    if (spec.legend) legend(host, spec.legend);
  }
  function sweepPage() {
    var rows = D.rows, host = document.getElementById("rank-chart"), cap = 60;
    rankChart(host, rows.length > cap ? rows.slice(0, cap) : rows, D.best !== null && D.best < cap ? D.best : null);
    if (rows.length > cap) E("p", {class: "note rank-cut"}, host, "The first " + cap + " of " + rows.length + " configurations; the table below has all of them.");
    var tip = function (r) {
      var t = [{k: "T_step", v: fmtS(r.t_step)}, {k: "GPUs", v: r.gpus}, {k: "GPU·s per step", v: fmtN(r.gpu_s_step)}, {k: "GPU·s per 1k samples", v: fmtN(r.gpu_s_1k)}, {k: "peak memory", v: fmtG(r.peak_gib)}];
      return '<div class="tip-title">' + esc(r.rank + ". " + r.label) + "</div>" + (r.status === "fits" ? tipRows(t) : esc(r.reason || r.status));
    };
    if (D.kind === "search") {
      var tps = {}, pal = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759"];
      rows.forEach(function (r) { var tp = r.changes.tensor_model_parallel_size; if (tp !== undefined) tps[tp] = 1; });
      var tpList = Object.keys(tps).map(Number).sort(function (a, b) { return a - b; });
      var color = function (r) { return pal[tpList.indexOf(r.changes.tensor_model_parallel_size) % pal.length] || "#4e79a7"; };
      var fit = rows.filter(function (r) { return r.status === "fits"; });
      var frontier = [], bestT = Infinity;
      fit.slice().sort(function (a, b) { return a.gpus - b.gpus || a.t_step - b.t_step; }).forEach(function (r) {
        if (r.t_step < bestT) { if (frontier.length && frontier[frontier.length - 1][0] === r.gpus) frontier.pop(); bestT = r.t_step; frontier.push([r.gpus, r.t_step]); }
      });
      var stepLine = [];
      frontier.forEach(function (p, i) { if (i) stepLine.push([p[0], frontier[i - 1][1]]); stepLine.push(p); });
      var lg = tpList.map(function (tp, i) { return {key: "tp:" + tp, label: "TP " + tp, color: pal[i % pal.length]}; });
      lg.push({key: "frontier", label: "frontier", color: "#1d2330"});
      if (rows.some(function (r) { return r.status !== "fits"; })) lg.push({key: "oom", label: "✕ no fit (out of memory)", color: "#b42318"});
      var goalLabel = {"fastest": "fastest", "fewest-gpus": "fewest GPUs", "cheapest": "cheapest"}[D.goal] || "best";
      scatter(document.getElementById("frontier-chart"), {cls: "frontier", logx: true, xTitle: "GPUs", yTitle: "T_step", yFmt: fmtS, ySeconds: true,
        hline: D.target ? {y: D.target, label: "target " + fmtS(D.target)} : null,
        lines: [{points: stepLine, color: "#1d2330", cls: "frontier-line"}],
        points: rows.filter(function (r) { return r.status !== "invalid"; }).map(function (r, i) {
          return {x: r.gpus, y: r.t_step, color: color(r), cross: r.status !== "fits", ring: rows.indexOf(r) === D.best, ringLabel: goalLabel, tip: tip(r)};
        }), legend: lg});
      var cheapest = null;
      fit.forEach(function (r) { if (!cheapest || r.gpu_s_1k < cheapest.gpu_s_1k) cheapest = r; });
      scatter(document.getElementById("cost-chart"), {cls: "cost", logx: true, xTitle: "GPUs", yTitle: "GPU·s per 1k samples", yFmt: function (v) { return fmtN(v); },
        points: fit.map(function (r) { return {x: r.gpus, y: r.gpu_s_1k, color: color(r), ring: r === cheapest, ringLabel: "cheapest", tip: tip(r)}; }),
        legend: lg.filter(function (l) { return l.key.indexOf("tp:") === 0; })});
    } else {
      sweepLines(rows, tip);
    }
    document.querySelectorAll("button.copy").forEach(function (b) {
      b.addEventListener("click", function () {
        var el = document.getElementById(b.getAttribute("data-copy")), text = el ? el.textContent : "";
        var done = function () { b.textContent = "copied"; };
        if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(text).then(done, function () { selectText(el); });
        else selectText(el);
      });
    });
  }
  function selectText(el) { var r = document.createRange(); r.selectNodeContents(el); var s = window.getSelection(); s.removeAllRanges(); s.addRange(r); }
  /* A sweep over a numeric flag: T_step along it, one line per value of the other flags. */
  function sweepLines(rows, tip) {
    var axes = D.axes, xAxisName = null;
    axes.forEach(function (a) {
      if (xAxisName) return;
      var vals = {};
      rows.forEach(function (r) { vals[r.changes[a]] = 1; });
      var ks = Object.keys(vals);
      if (ks.length >= 2 && rows.every(function (r) { return typeof r.changes[a] === "number"; })) xAxisName = a;
    });
    if (!xAxisName) return;
    var sec = document.getElementById("sweep-lines");
    sec.hidden = false;
    var others = axes.filter(function (a) { return a !== xAxisName; });
    var series = {}, order = [];
    rows.forEach(function (r) {
      var key = others.map(function (a) { return (D.axis_labels[a] || a) + " " + r.changes[a]; }).join(" · ") || "T_step";
      if (!series[key]) { series[key] = []; order.push(key); }
      series[key].push(r);
    });
    order.sort();
    var pal = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"];
    var xs = rows.map(function (r) { return r.changes[xAxisName]; }), lo = Math.min.apply(null, xs), hi = Math.max.apply(null, xs);
    var logx = lo > 0 && hi / lo >= 4 && xs.every(function (v) { return Math.abs(Math.log2(v) - Math.round(Math.log2(v))) < 1e-9; });
    var distinct = xs.filter(function (v, i) { return xs.indexOf(v) === i; }).sort(function (a, b) { return a - b; });
    var lines = [], points = [];
    order.slice(0, 10).forEach(function (key, i) {
      var rs = series[key].slice().sort(function (a, b) { return a.changes[xAxisName] - b.changes[xAxisName]; });
      var fitPts = rs.filter(function (r) { return r.status === "fits"; }).map(function (r) { return [r.changes[xAxisName], r.t_step]; });
      lines.push({points: fitPts, color: pal[i % pal.length], cls: "sweep-line"});
      rs.forEach(function (r) { if (r.status !== "invalid") points.push({x: r.changes[xAxisName], y: r.t_step, color: pal[i % pal.length], cross: r.status !== "fits", ring: rows.indexOf(r) === D.best, ringLabel: "best", tip: tip(r)}); });
    });
    var lg = order.slice(0, 10).map(function (k, i) { return {key: "series:" + k, label: k, color: pal[i % pal.length]}; });
    if (points.some(function (p) { return p.cross; })) lg.push({key: "oom", label: "✕ out of memory", color: "#b42318"});
    scatter(document.getElementById("sweep-chart"), {cls: "sweep", logx: logx, xTitle: D.axis_labels[xAxisName] || xAxisName, yTitle: "T_step", yFmt: fmtS, ySeconds: true, lines: lines, points: points, legend: lg,
      xTicks: distinct.length <= 12 ? distinct : null});  // the swept values themselves, not 1.5 for a TP
  }

  // ---------------------------------------------------------------------------------------------- page: compare
  function compareBars(host, mean) {
    var phases = Object.keys(mean).filter(function (p) { return mean[p].measured_s || mean[p].predicted_s; });
    if (!phases.length) return;
    var W = widthOf(host), w = W - LEFT - 110, bh = 11, rh = 30, top = 6, H = top + phases.length * rh + 26;
    var max = Math.max.apply(null, phases.map(function (p) { return Math.max(mean[p].measured_s || 0, mean[p].predicted_s || 0); })) || 1;
    var cst = secTicks(max, Math.max(2, Math.floor(w / 90))), ticks = cst.ticks, sc = w / Math.max(max, ticks[ticks.length - 1]);
    var svg = S("svg", {class: "vime-chart compare-bars", width: W, height: H, viewBox: "0 0 " + W + " " + H}, host);
    var g = S("g", {class: "grid"}, svg);
    ticks.forEach(function (v) { S("line", {x1: LEFT + v * sc, x2: LEFT + v * sc, y1: top, y2: H - 24}, g); });
    phases.forEach(function (p, i) {
      var y = top + i * rh, r = mean[p], c = D.phase_colors[p] || "#999";
      S("text", {x: LEFT - 8, y: y + 15, "text-anchor": "end"}, svg, D.phase_labels[p] || p);
      var a = S("rect", {class: "bar-measured", "data-phase": p, x: LEFT, y: y + 2, width: Math.max(0.5, (r.measured_s || 0) * sc), height: bh, fill: c}, svg);
      var b = S("rect", {class: "bar-simulated", "data-phase": p, x: LEFT, y: y + 3 + bh, width: Math.max(0.5, (r.predicted_s || 0) * sc), height: bh, fill: hatch(svg, c), stroke: c}, svg);
      var e = r.error_pct, cls = e === null || e === undefined ? "" : Math.abs(e) <= 10 ? "#1b7f3b" : Math.abs(e) <= 25 ? "#b25e09" : "#b42318";
      S("text", {x: LEFT + Math.max(r.measured_s || 0, r.predicted_s || 0) * sc + 6, y: y + 17, fill: cls || "#5d6675", "font-weight": 600, class: "err-label"}, svg,
        e === null || e === undefined ? "—" : (e >= 0 ? "+" : "") + e.toFixed(1) + " %");
      [a, b].forEach(function (el) {
        el.addEventListener("mousemove", function (ev) { showTip('<div class="tip-title">' + esc(D.phase_labels[p] || p) + "</div>" + tipRows([{k: "measured", v: fmtS(r.measured_s)}, {k: "simulated", v: fmtS(r.predicted_s)}, {k: "error", v: e === null || e === undefined ? "—" : e.toFixed(1) + " %"}]), ev); });
        el.addEventListener("mouseleave", hideTip);
      });
    });
    var ax = S("g", {class: "axis axis-x"}, svg), ya = H - 22;
    S("line", {x1: LEFT, x2: LEFT + w, y1: ya, y2: ya}, ax);
    ticks.forEach(function (v) { var tk = S("g", {class: "tick", transform: "translate(" + (LEFT + v * sc).toFixed(1) + "," + ya + ")"}, ax); S("line", {y1: 0, y2: 4}, tk); S("text", {y: 15, "text-anchor": "middle"}, tk, cst.label(v)); });
    legend(host, [{key: "measured", label: "measured (solid)", color: "#5d6675"}, {key: "simulated", label: "simulated (hatched)", color: "#bab0ac"}]);
  }
  function comparePage() {
    compareBars(document.getElementById("compare-chart"), D.mean);
    var sides = D.sides;
    if (!sides.length) return;
    var lo = Math.min.apply(null, sides.map(function (s) { return s.view.t_start || 0; }));
    var hi = Math.max.apply(null, sides.map(function (s) { return s.view.t_end; }));
    var allPhases = [];
    sides.forEach(function (s) { allPhases = allPhases.concat(s.view.phases || []); });
    sizeGutter(sides.map(function (s) { return s.name; }).concat((sides[0].view.tracks || []).map(function (t) { return sides[0].name + " · " + t.label; })));
    var ext = phaseExtent(allPhases, lo, hi);
    initTime(lo, hi, ext[0], ext[1]);
    var windows = (sides[0].view.windows || []);
    zoomBar(document.getElementById("zoom-bar"), windows);
    var V0 = {windows: windows, phases: sides[0].view.phases, tracks: (sides[0].view.tracks || []).map(function (t) {
      return {name: t.name, label: sides[0].name + " · " + t.label, lanes: t.lanes, spans: t.spans}; }),
      call_names: sides[0].view.call_names, call_colors: sides[0].view.call_colors, oom: null};
    drawTimeline(document.getElementById("timeline"), V0, sides.map(function (s) { return {label: s.name, phases: s.view.phases}; }));
    // memory: one chart per GPU, the measured total beside the simulated total
    var host = document.getElementById("memory-charts"), perGpu = {}, hostUsed = null;
    sides.forEach(function (s, si) {
      ((s.view.memory || {}).groups || []).forEach(function (grp) {
        // a run without GPUs measures the machine's memory in use: drawn on its own (the pinned buffers a
        // simulation counts are a different quantity, so there is nothing beside it)
        if (grp.measured_host && !hostUsed) hostUsed = {gpu: "host", title: "Host memory in use (" + s.name + ")", note: grp.note,
          sides: {}, capacity: grp.capacity_gib, peaks: {}};
        if (grp.measured_host) { hostUsed.sides[s.name] = {t: grp.t, v: totalsOf(grp)}; return; }
        if (grp.host) return;
        grp.members.forEach(function (m) {
          var data = grp.variants ? grp.variants[m.variant] : grp;
          var e = perGpu[m.gpu] = perGpu[m.gpu] || {gpu: m.gpu, sides: {}, capacity: null, peaks: {}};
          e.sides[s.name] = {t: data.t, v: totalsOf(data)};
          e.capacity = e.capacity || grp.capacity_gib;
        });
      });
      var pk = s.view.peaks_gib || {};
      Object.keys(pk).forEach(function (gpu) { var e = perGpu[gpu] = perGpu[gpu] || {gpu: +gpu, sides: {}, capacity: null, peaks: {}}; e.peaks[s.name + " peak"] = pk[gpu]; });
    });
    var colors = {measured: "#1d2330", simulated: "#4e79a7"};
    var gpus = Object.keys(perGpu).map(Number).sort(function (a, b) { return a - b; });
    function peakOf(gpu) { var e = perGpu[gpu], sd = e.sides[sides[0].name]; return sd ? Math.max.apply(null, sd.v.concat([0])) : 0; }
    var fullest = gpus.slice().sort(function (a, b) { return peakOf(b) - peakOf(a) || a - b; })[0];
    var rest = E("div", {class: "members", hidden: ""}), restBuilt = false;
    gpus.sort(function (a, b) { return (a === fullest ? -1 : 0) - (b === fullest ? -1 : 0) || a - b; });
    gpus.forEach(function (gpu, gi) {
      if (gi === 0) { drawGpu(host, gpu, gpus.length > 1); if (gpus.length > 1) host.appendChild(rest); }
    });
    if (hostUsed) drawGpu(host, "host", false);
    function drawGpu(parent, gpu, withButton) {
      var e = gpu === "host" ? hostUsed : perGpu[gpu], title = e.title || "GPU " + gpu;
      var box = E("div", {class: "gpu-group", "data-gpus": String(gpu)}, parent);
      var head = E("div", {class: "group-head"}, box);
      E("span", {class: "group-title"}, head, title);
      if (e.note) E("span", {class: "group-note"}, head, e.note);
      if (withButton) {
        var spread = gpus.map(peakOf), lo = Math.min.apply(null, spread), hi = Math.max.apply(null, spread);
        E("span", {class: "group-note"}, head, "the fullest of " + gpus.length + " GPUs by " + sides[0].name + " peak; the others peak " +
          (hi - lo < 0.05 ? "the same" : "within " + fmtG(hi - lo) + " of it"));
        var btn = E("button", {type: "button", class: "expand", "aria-expanded": "false"}, head, "show the other " + (gpus.length - 1) + " GPUs");
        btn.addEventListener("click", function () {
          var open = rest.hidden;
          if (open && !restBuilt) { restBuilt = true; gpus.slice(1).forEach(function (g) { drawGpu(rest, g, false); }); }
          rest.hidden = !open;
          btn.setAttribute("aria-expanded", open ? "true" : "false");
          btn.textContent = open ? "hide the other GPUs" : "show the other " + (gpus.length - 1) + " GPUs";
          TIME.charts.forEach(function (c) { if (c.visible()) c.render(); });
        });
      }
      var names = Object.keys(e.sides), all = [];
      if (!e.sides[sides[0].name] && sides.length > 1) {
        E("span", {class: "group-note"}, head, "no " + sides[0].name + " memory for this GPU" +
          (hostUsed ? " (a run without GPUs measures the host's memory, drawn below)" : ""));
      }
      names.forEach(function (n) { all = all.concat(e.sides[n].v); });
      Object.keys(e.peaks).forEach(function (k) { all.push(e.peaks[k]); });
      var ymax = Math.max.apply(null, all.concat([e.capacity || 0, 1e-9])) * 1.08, yt = linTicks(0, ymax, 4), top = 8, h = 140;
      ymax = Math.max(ymax, yt[yt.length - 1]);
      function y(v) { return top + h - v / ymax * h; }
      timeChart(E("div", {class: "chart"}, box), {height: top + h + 26, plotTop: top, plotH: h, cls: "memory compare-memory",
        draw: function (svg, plot, sc) {
          var g = S("g", {class: "grid"}, svg);
          yt.forEach(function (v) { S("line", {x1: sc.left, x2: sc.left + sc.w, y1: y(v), y2: y(v)}, g); });
          (sides[0].view.phases || []).forEach(function (p) {
            S("rect", {class: "phase-band", "data-phase": p.name, x: sc.x(p.t0), y: top, width: Math.max(0.5, sc.x(p.t1) - sc.x(p.t0)), height: h, fill: p.color, "fill-opacity": 0.13}, plot);
          });
          names.forEach(function (n) {
            var sd = e.sides[n], d = "";
            sd.t.forEach(function (t, j) {
              var x = sc.x(t).toFixed(1), yy = y(sd.v[j]).toFixed(1);
              d += (j ? "H" + x + "V" + yy : "M" + x + "," + yy);
            });
            S("path", {class: "mem-line", "data-side": n, d: d, fill: "none", stroke: colors[n] || "#999", "stroke-width": 1.8}, plot);
          });
          Object.keys(e.peaks).forEach(function (k) {
            S("line", {class: "sim-peak", x1: sc.left, x2: sc.left + sc.w, y1: y(e.peaks[k]), y2: y(e.peaks[k]), stroke: k.indexOf("simulated") === 0 ? colors.simulated : colors.measured, "stroke-dasharray": "2 3", "stroke-width": 1.5}, svg);
            S("text", {x: sc.left + 4, y: y(e.peaks[k]) - 4, fill: "#3a4150", class: "halo"}, svg, k + " " + fmtG(e.peaks[k]));
          });
          if (e.capacity) {
            S("line", {class: "capacity", x1: sc.left, x2: sc.left + sc.w, y1: y(e.capacity), y2: y(e.capacity), stroke: "#b42318", "stroke-dasharray": "5 4"}, svg);
            S("text", {x: sc.left + sc.w - 4, y: y(e.capacity) - 4, "text-anchor": "end", fill: "#b42318"}, svg, "capacity " + fmtG(e.capacity));
          }
          var ax = S("g", {class: "axis axis-y"}, svg);
          yt.forEach(function (v) { var tk = S("g", {class: "tick", transform: "translate(" + sc.left + "," + y(v).toFixed(1) + ")"}, ax); S("line", {x1: -4, x2: 0}, tk); S("text", {x: -7, y: 4, "text-anchor": "end"}, tk, v === 0 ? "0" : (+v.toPrecision(6)) + " GiB"); });
          xAxis(svg, sc, top + h + 2, "");
        },
        hover: function (t) {
          var rows = names.map(function (n) { var sd = e.sides[n], j = bisect(sd.t, t); return {k: n, v: j < 0 ? "—" : fmtG(sd.v[j]), color: colors[n]}; });
          return '<div class="tip-title">' + esc(title) + " · t = " + fmtS(t) + "</div>" + tipRows(rows);
        }});
      var items = names.map(function (n) { return {key: "side:" + n, label: n + " (total)", color: colors[n] || "#999"}; });
      Object.keys(e.peaks).forEach(function (k) { items.push({key: "peak:" + k, label: k, color: k.indexOf("simulated") === 0 ? colors.simulated : colors.measured, dashed: true}); });
      legend(box, items);
    }
  }

  // ---------------------------------------------------------------------------------------------- sortable tables
  function sortable() {
    document.querySelectorAll("table.sortable").forEach(function (tb) {
      var ths = tb.querySelectorAll("th");
      ths.forEach(function (th, ci) {
        th.addEventListener("click", function () {
          var asc = !th.classList.contains("sorted-asc");
          ths.forEach(function (o) { o.classList.remove("sorted-asc", "sorted-desc"); });
          th.classList.add(asc ? "sorted-asc" : "sorted-desc");
          var body = tb.tBodies[0], rows = Array.prototype.slice.call(body.rows);
          var key = function (r) { var c = r.cells[ci], v = c.hasAttribute("data-v") ? c.getAttribute("data-v") : c.textContent; var n = parseFloat(v); return v !== "" && isFinite(n) && String(n) === v.trim() ? n : v === "" ? null : v; };
          rows.sort(function (a, b) {
            var x = key(a), y = key(b);
            if (x === null) return 1; if (y === null) return -1;
            if (typeof x === "number" && typeof y === "number") return asc ? x - y : y - x;
            return asc ? String(x).localeCompare(String(y)) : String(y).localeCompare(String(x));
          });
          rows.forEach(function (r) { body.appendChild(r); });
        });
      });
    });
  }

  // ---------------------------------------------------------------------------------------------- start
  var t0 = (window.performance && performance.now) ? performance.now() : 0;
  if (D.kind === "run") runPage();
  else if (D.kind === "sweep" || D.kind === "search") sweepPage();
  else if (D.kind === "compare") comparePage();
  sortable();
  var lastW = window.innerWidth;
  window.addEventListener("resize", function () {
    if (window.innerWidth === lastW) return;
    lastW = window.innerWidth;
    window.requestAnimationFrame(function () { TIME.charts.forEach(function (c) { if (c.visible()) c.render(); }); });
  });
  body.setAttribute("data-render-ms", String(Math.round(((window.performance && performance.now) ? performance.now() : 0) - t0)));
  body.setAttribute("data-rendered", "ok");
  window.vimeReport = {setView: setView, resetView: resetView, time: TIME};
})();
