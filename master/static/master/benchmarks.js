/* The admin's Benchmarks chart: one entry's wall time per iteration over time, a line per board
   label, regressions marked where they start, and a click on a point opening its run's job.
   Its data comes from the page (Django's json_script), so names are never parsed as HTML here. */
(function () {
  "use strict";

  var COLORS = ["#1565c0", "#c62828", "#2e7d32", "#ef6c00", "#6a1b9a", "#00838f", "#ad1457", "#5d4037"];
  var CLICK_PX = 12;

  function seconds(v) {
    if (v == null) return "–";
    var a = Math.abs(v);
    if (a >= 1 || a === 0) return v.toPrecision(4) + " s";
    if (a >= 1e-3) return (v * 1e3).toPrecision(4) + " ms";
    if (a >= 1e-6) return (v * 1e6).toPrecision(4) + " µs";
    return (v * 1e9).toPrecision(4) + " ns";
  }

  function utc(ts) {
    return new Date(ts * 1e3).toISOString().replace("T", " ").slice(0, 19) + " UTC";
  }

  // uPlot wants one x array and one y array per series, aligned: a board's missing times are null.
  function aligned(series) {
    var seen = new Set();
    series.forEach(function (s) { s.points.forEach(function (p) { seen.add(p[0]); }); });
    var xs = Array.from(seen).sort(function (a, b) { return a - b; });
    var at = new Map(xs.map(function (x, i) { return [x, i]; }));
    var ys = [], links = [], hosts = [];
    series.forEach(function (s) {
      var y = new Array(xs.length).fill(null), link = new Array(xs.length).fill(null);
      var host = new Array(xs.length).fill(null);
      s.points.forEach(function (p) {
        var i = at.get(p[0]);
        y[i] = p[1]; link[i] = p[2]; host[i] = p[3];
      });
      ys.push(y); links.push(link); hosts.push(host);
    });
    return { xs: xs, ys: ys, links: links, hosts: hosts };
  }

  // The nearest index holding a value, so the legend shows each board's own nearest point.
  function nearestValue(ys, closest) {
    if (ys[closest] != null) return closest;
    for (var d = 1; d < ys.length; d++) {
      if (closest - d >= 0 && ys[closest - d] != null) return closest - d;
      if (closest + d < ys.length && ys[closest + d] != null) return closest + d;
    }
    return closest;
  }

  function markRegressions(regressions, colorOf) {
    return {
      hooks: {
        draw: [function (u) {
          var ctx = u.ctx, top = u.bbox.top, bottom = u.bbox.top + u.bbox.height;
          var dpr = uPlot.pxRatio;
          u.fsMarkers = [];
          regressions.forEach(function (r) {
            var x = u.valToPos(r.start, "x", true);
            if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) return;
            var color = colorOf(r.label);
            ctx.save();
            ctx.strokeStyle = color;
            ctx.lineWidth = 1.5 * dpr;
            ctx.setLineDash([6 * dpr, 4 * dpr]);
            ctx.beginPath();
            ctx.moveTo(x, top);
            ctx.lineTo(x, bottom);
            ctx.stroke();
            ctx.setLineDash([]);
            ctx.fillStyle = color;
            ctx.font = "bold " + Math.round(11 * dpr) + "px sans-serif";
            ctx.textAlign = "left";
            ctx.textBaseline = "alphabetic";
            var sign = r.change_pct >= 0 ? "+" : "";
            ctx.fillText(sign + r.change_pct.toFixed(1) + "% " + r.status, x + 4 * dpr, top + 12 * dpr);
            ctx.restore();
            u.fsMarkers.push(r);
          });
        }],
      },
    };
  }

  function draw() {
    var holder = document.getElementById("fs-chart");
    var data = JSON.parse(document.getElementById("fs-chart-data").textContent);
    var table = aligned(data.series);
    var colors = {};
    data.series.forEach(function (s, k) { colors[s.label] = COLORS[k % COLORS.length]; });
    var colorOf = function (label) { return colors[label] || "#c62828"; };

    var series = [{ label: "start", value: function (u, v) { return v == null ? "–" : utc(v); } }];
    data.series.forEach(function (s) {
      series.push({
        label: s.label || "(no board label)",
        stroke: colorOf(s.label),
        width: 2,
        spanGaps: true,
        points: { show: true, size: 7, fill: colorOf(s.label) },
        value: function (u, v) { return seconds(v); },
      });
    });

    var hover = document.getElementById("fs-chart-hover");
    var opts = {
      width: Math.max(480, holder.clientWidth),
      height: 420,
      series: series,
      tzDate: function (ts) { return uPlot.tzDate(new Date(ts * 1e3), "Etc/UTC"); },
      scales: { x: { time: true } },
      axes: [{}, { size: 80, values: function (u, vals) { return vals.map(seconds); } }],
      cursor: {
        dataIdx: function (u, seriesIdx, closest) {
          return seriesIdx === 0 ? closest : nearestValue(table.ys[seriesIdx - 1], closest);
        },
      },
      legend: { live: true },
      plugins: [markRegressions(data.regressions, colorOf)],
      hooks: {
        setCursor: [function (u) {
          var hit = nearestPoint(u);
          u.over.style.cursor = hit && hit.link ? "pointer" : "";
          hover.textContent = hit
            ? (series[hit.k + 1].label + " · " + utc(table.xs[hit.i]) + " · " + seconds(table.ys[hit.k][hit.i]) +
               (hit.host ? " · " + hit.host : "") + (hit.link ? " · click to open the job" : " · uploaded, no job"))
            : "Point at a dot to see its run; click it to open the run's job.";
        }],
      },
    };

    // The point nearest the mouse on screen among the shown boards, if within CLICK_PX.
    function nearestPoint(u) {
      var left = u.cursor.left, top = u.cursor.top, best = null;
      if (left == null || left < 0) return null;
      table.ys.forEach(function (ys, k) {
        if (!u.series[k + 1].show) return;
        ys.forEach(function (v, i) {
          if (v == null) return;
          var dx = u.valToPos(table.xs[i], "x") - left, dy = u.valToPos(v, "y") - top;
          var d = Math.sqrt(dx * dx + dy * dy);
          if (d <= CLICK_PX && (best === null || d < best.d)) {
            best = { d: d, k: k, i: i, link: table.links[k][i], host: table.hosts[k][i] };
          }
        });
      });
      return best;
    }

    var u = new uPlot(opts, [table.xs].concat(table.ys), holder);
    u.over.addEventListener("click", function () {
      var hit = nearestPoint(u);
      if (hit && hit.link) window.location.assign(hit.link);
    });
    window.addEventListener("resize", function () {
      u.setSize({ width: Math.max(480, holder.clientWidth), height: 420 });
    });
    window.fsChart = u;
    window.fsChartTable = table;
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", draw);
  else draw();
})();
