// slurmkit report: the interactive panels of the HTML report, drawn as SVG from the JSON the page
// carries (no network, no library). Drag across a step panel to zoom every step panel to that range,
// double-click to zoom out; hover for a step's values. When every panel is drawn, <body> gets
// data-rendered="N" (the panels drawn), which tests/unit/test_report_browser.py reads in a real browser.
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("report-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var W = 960, H = 250, M = {l: 64, r: 64, t: 34, b: 38};
  var zoom = null;  // [first step, last step] shown by every step panel; null: all
  var panels = [];

  function el(tag, attrs, parent, text) {
    var e = document.createElementNS(NS, tag);
    Object.keys(attrs).forEach(function (k) { e.setAttribute(k, attrs[k]); });
    if (text !== undefined) e.textContent = text;
    if (parent) parent.appendChild(e);
    return e;
  }
  function nice(x) {
    var p = Math.pow(10, Math.floor(Math.log10(x || 1))), f = x / p;
    return (f < 1.5 ? 1 : f < 3 ? 2 : f < 7 ? 5 : 10) * p;
  }
  function ticks(lo, hi, log) {
    var out = [], v;  // on a log scale 1, 2, 5 x 10^k, or a linear step where the range is too narrow for them
    if (log) {
      for (var e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
        [1, 2, 5].forEach(function (m) { v = m * Math.pow(10, e); if (v >= lo && v <= hi) out.push(v); });
      }
      if (out.length >= 3) return out;
    }
    out = [];
    var step = nice((hi - lo) / 5 || 1);
    for (v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(v);
    return out;
  }
  function fmt(v) {
    if (!Number.isFinite(v)) return "";
    var a = Math.abs(v);
    return a >= 1e4 ? v.toFixed(0) : a >= 1 ? String(+v.toPrecision(4)) : String(+v.toPrecision(3));
  }
  function wall(s) {
    return s < 120 ? fmt(s) + " s" : s < 7200 ? fmt(s / 60) + " min" : fmt(s / 3600) + " h";
  }
  function range(values, log) {
    var ok = values.filter(function (v) { return Number.isFinite(v) && (!log || v > 0); });
    if (!ok.length) return [0, 1];
    var lo = Math.min.apply(null, ok), hi = Math.max.apply(null, ok);
    if (lo === hi) { lo = log ? lo / 2 : lo - 1; hi = log ? hi * 2 : hi + 1; }
    return [lo, hi];
  }

  // spec: {id, title, x, xlabel, points, series: [{key, label, color, right}], band: [lo, hi] | null,
  //        log, restarts, wallTop}
  function draw(spec) {
    var root = document.getElementById(spec.id);
    root.textContent = "";
    var svg = el("svg", {viewBox: "0 0 " + W + " " + H, width: W, height: H, "class": "plot"}, root);
    el("text", {x: M.l, y: 14, "class": "title"}, svg, spec.title);
    var pts = spec.points.filter(function (p) {
      return !spec.zoomable || !zoom || (p[spec.x] >= zoom[0] && p[spec.x] <= zoom[1]);
    });
    if (!pts.length) pts = spec.points;
    var xr = range(pts.map(function (p) { return p[spec.x]; }), false);
    var sx = function (v) { return M.l + (v - xr[0]) / (xr[1] - xr[0]) * (W - M.l - M.r); };
    var scales = {};
    [false, true].forEach(function (right) {
      var keys = spec.series.filter(function (s) { return !!s.right === right; }).map(function (s) { return s.key; });
      if (!right && spec.band) keys = keys.concat(spec.band);
      if (!keys.length) return;
      var log = spec.log && !right;
      var vals = [];
      pts.forEach(function (p) { keys.forEach(function (k) { vals.push(p[k]); }); });
      var yr = range(vals, log);
      var f = log ? Math.log10 : function (v) { return v; };
      var lo = f(yr[0]), hi = f(yr[1]);
      scales[right] = {r: yr, log: log, s: function (v) { return H - M.b - (f(v) - lo) / (hi - lo) * (H - M.t - M.b); }};
    });
    // axes, grid and tick labels
    ticks(xr[0], xr[1], false).forEach(function (v) {
      el("line", {x1: sx(v), x2: sx(v), y1: M.t, y2: H - M.b, "class": "grid"}, svg);
      el("text", {x: sx(v), y: H - M.b + 14, "class": "tick", "text-anchor": "middle"}, svg, fmt(v));
    });
    el("text", {x: (W + M.l - M.r) / 2, y: H - 4, "class": "label", "text-anchor": "middle"}, svg, spec.xlabel);
    [false, true].forEach(function (right) {
      var sc = scales[right];
      if (!sc) return;
      ticks(sc.r[0], sc.r[1], sc.log).forEach(function (v) {
        if (!right) el("line", {x1: M.l, x2: W - M.r, y1: sc.s(v), y2: sc.s(v), "class": "grid"}, svg);
        el("text", {x: right ? W - M.r + 6 : M.l - 6, y: sc.s(v) + 4, "class": "tick",
                    "text-anchor": right ? "start" : "end"}, svg, fmt(v));
      });
    });
    if (spec.wallTop && pts.length > 1) {  // wall time since the first record, on the top axis
      var t0 = spec.points[0].time;
      ticks(xr[0], xr[1], false).forEach(function (v) {
        var near = pts.reduce(function (a, p) { return Math.abs(p[spec.x] - v) < Math.abs(a[spec.x] - v) ? p : a; });
        el("text", {x: sx(v), y: M.t - 4, "class": "tick", "text-anchor": "middle"}, svg, wall(near.time - t0));
      });
    }
    if (spec.band && scales[false]) {  // the interval's min to max, as a band under the line
      var sc0 = scales[false];
      var up = pts.map(function (p) { return sx(p[spec.x]) + "," + sc0.s(p[spec.band[1]]); });
      var down = pts.slice().reverse().map(function (p) { return sx(p[spec.x]) + "," + sc0.s(p[spec.band[0]]); });
      el("polygon", {points: up.concat(down).join(" "), "class": "band"}, svg);
    }
    spec.series.forEach(function (s) {
      var sc = scales[!!s.right];
      var d = pts.filter(function (p) { return Number.isFinite(p[s.key]) && (!sc.log || p[s.key] > 0); })
        .map(function (p, i) { return (i ? "L" : "M") + sx(p[spec.x]).toFixed(1) + "," + sc.s(p[s.key]).toFixed(1); });
      el("path", {d: d.join(""), "class": "line", stroke: s.color, "data-series": s.key}, svg);
    });
    (spec.restarts || []).forEach(function (r) {  // every restart at the step training went on from
      if (r.step < xr[0] || r.step > xr[1]) return;
      el("line", {x1: sx(r.step), x2: sx(r.step), y1: M.t, y2: H - M.b, "class": "restart"}, svg);
      el("text", {x: sx(r.step) + 3, y: M.t + 10, "class": "restart-label"}, svg, r.cause);
    });
    var legend = spec.series.map(function (s) { return s.label; }).join("  ·  ");
    el("text", {x: W - M.r, y: 14, "class": "legend", "text-anchor": "end"}, svg, legend);
    // hover: the nearest point's values; drag: zoom every step panel
    var cursor = el("line", {y1: M.t, y2: H - M.b, "class": "cursor", visibility: "hidden"}, svg);
    var tip = el("text", {"class": "tip", visibility: "hidden"}, svg);
    var area = el("rect", {x: M.l, y: M.t, width: W - M.l - M.r, height: H - M.t - M.b, "class": "area"}, svg);
    var sel = el("rect", {y: M.t, height: H - M.t - M.b, "class": "selection", visibility: "hidden"}, svg);
    var start = null;
    function local(ev) {
      var box = svg.getBoundingClientRect();
      return (ev.clientX - box.left) * W / box.width;
    }
    function value(px) { return xr[0] + (px - M.l) / (W - M.l - M.r) * (xr[1] - xr[0]); }
    area.addEventListener("mousemove", function (ev) {
      var px = local(ev), v = value(px);
      var p = pts.reduce(function (a, q) { return Math.abs(q[spec.x] - v) < Math.abs(a[spec.x] - v) ? q : a; });
      cursor.setAttribute("x1", sx(p[spec.x]));
      cursor.setAttribute("x2", sx(p[spec.x]));
      cursor.setAttribute("visibility", "visible");
      tip.textContent = spec.x + " " + fmt(p[spec.x]) + ": " + spec.series.map(function (s) {
        return s.label + " " + fmt(p[s.key]);
      }).join(", ");
      tip.setAttribute("x", Math.min(sx(p[spec.x]) + 6, W - 360));
      tip.setAttribute("y", M.t + 24);
      tip.setAttribute("visibility", "visible");
      if (start !== null) {
        sel.setAttribute("x", Math.min(start, px));
        sel.setAttribute("width", Math.abs(px - start));
        sel.setAttribute("visibility", "visible");
      }
    });
    area.addEventListener("mouseleave", function () {
      cursor.setAttribute("visibility", "hidden");
      tip.setAttribute("visibility", "hidden");
    });
    if (spec.zoomable) {
      area.addEventListener("mousedown", function (ev) { start = local(ev); });
      area.addEventListener("mouseup", function (ev) {
        var end = local(ev);
        if (start !== null && Math.abs(end - start) > 4) {
          zoom = [value(Math.min(start, end)), value(Math.max(start, end))];
          panels.forEach(draw);
        }
        start = null;
        sel.setAttribute("visibility", "hidden");
      });
      area.addEventListener("dblclick", function () { zoom = null; panels.forEach(draw); });
    }
  }

  function timeline() {  // one bar per incarnation: queued (grey), running (colour by how it ended)
    var segs = data.segments;
    if (!segs.length) return 0;
    var root = document.getElementById("timeline");
    var h = 40 + 28 * segs.length;
    var svg = el("svg", {viewBox: "0 0 " + W + " " + h, width: W, height: h, "class": "plot"}, root);
    el("text", {x: M.l, y: 14, "class": "title"}, svg, "timeline: queued (grey), running (colour by how it ended)");
    var t0 = Math.min.apply(null, segs.map(function (s) { return s.queued || s.start || 0; }));
    var t1 = Math.max.apply(null, segs.map(function (s) { return s.end || s.start || t0 + 1; }));
    var sx = function (t) { return M.l + (t - t0) / ((t1 - t0) || 1) * (W - M.l - M.r); };
    segs.forEach(function (s, i) {
      var y = 26 + 28 * i;
      if (s.queued !== null && s.start !== null && s.start > s.queued) {
        el("rect", {x: sx(s.queued), y: y, width: sx(s.start) - sx(s.queued), height: 16, fill: "#bdbdbd"}, svg);
      }
      if (s.start !== null) {
        var end = s.end || t1;
        el("rect", {x: sx(s.start), y: y, width: Math.max(1, sx(end) - sx(s.start)), height: 16,
                    fill: data.colors[s.state] || "#1565c0", "class": "segment"}, svg);
        el("text", {x: sx(s.start) + 4, y: y + 12, "class": "tick"}, svg,
           "job " + s.job_id + " #" + s.n + " on " + s.nodes + ": " + s.state + (s.cause ? " (" + s.cause + ")" : ""));
      }
    });
    return 1;
  }

  var restarts = data.restarts.map(function (r) { return {step: r[0], cause: r[1]}; });
  if (data.steps.length) {
    panels.push({id: "loss", title: "loss (interval mean, min to max as a band)", x: "step", xlabel: "step",
                 points: data.steps, series: [{key: "loss", label: "loss", color: "#1565c0"}],
                 band: ["loss_min", "loss_max"], log: data.steps.every(function (p) { return p.loss_min > 0; }),
                 restarts: restarts, wallTop: true, zoomable: true});
    panels.push({id: "throughput", title: "throughput and MFU", x: "step", xlabel: "step", points: data.steps,
                 series: [{key: "samples_per_s", label: "samples/s", color: "#2e7d32"},
                          {key: "mfu_pct", label: "MFU % (right)", color: "#ef6c00", right: true}],
                 restarts: restarts, zoomable: true});
  }
  if (data.gpu.length) {
    panels.push({id: "gpu", title: "GPU utilisation, mean of each node's GPUs", x: "t",
                 xlabel: "seconds since the first sample", points: data.gpu, series: data.gpu_series});
  }
  panels.forEach(draw);
  document.body.setAttribute("data-rendered", String(panels.length + timeline()));
})();
