// gpuops dashboard: charts (uPlot, vendored). A chart by step (loss, throughput: time on hover) or by time (GPUs), with
// units on its axes, percent charts fixed to 0-100, values on hover, drag-to-zoom that zooms (double-click: all),
// a log scale and smoothing (raw points stay visible under the smoothed line).
(function () {
  "use strict";
  const G = window.G;
  G.COLORS = ["#2e90fa", "#12b76a", "#f79009", "#9e77ed", "#f04438", "#06aed4", "#ee46bc", "#667085"];

  // TensorBoard's smoothing: an exponential moving average, debiased so the first points are not pulled to 0
  G.ema = (ys, w) => {
    if (!w) return ys.slice();
    let last = 0, n = 0;
    return ys.map((y) => {
      if (y === null || y === undefined || !isFinite(y)) return null;
      last = last * w + (1 - w) * y;
      n += 1;
      return last / (1 - Math.pow(w, n));
    });
  };

  const axisFont = "11px system-ui, sans-serif";
  // ticks a person reads: whole steps; seconds, minutes and hours (never the same second twice on an axis)
  const STEP_INCRS = [1, 2, 5, 10, 20, 25, 50, 100, 200, 250, 500, 1e3, 2e3, 2.5e3, 5e3, 1e4, 2e4, 2.5e4, 5e4, 1e5, 2e5,
    2.5e5, 5e5, 1e6, 2e6, 5e6, 1e7, 1e8, 1e9];
  const TIME_INCRS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400,
    172800, 604800];
  const tickTime = (span) => (v) => {
    const d = new Date(v * 1000), p = (n) => String(n).padStart(2, "0");
    const hm = `${p(d.getHours())}:${p(d.getMinutes())}`;
    return span > 2 * 86400 ? `${p(d.getMonth() + 1)}-${p(d.getDate())} ${hm}` : span < 600 ? `${hm}:${p(d.getSeconds())}` : hm;
  };

  // A value with no neighbour (a run's only step, a point between two NaN gaps) is no line at all: draw it as a
  // point. Points are otherwise hidden, so a long raw line stays readable.
  // A chart that spans gaps (GPUs, by time) joins values across them: there only a series' one value is lonely.
  const lonely = (spans) => (u, si) => {
    const ys = u.data[si], out = [], got = (i) => ys[i] !== null && ys[i] !== undefined;
    for (let i = 0; i < ys.length; i++) {
      if (got(i) && (spans || ((i === 0 || !got(i - 1)) && (i === ys.length - 1 || !got(i + 1))))) out.push(i);
      if (spans && out.length > 1) return null;
    }
    return out.length ? out : null;
  };

  // o: {title, x: "step"|"time", labels, unit, yLabel, percent, log, width, height, times(idx) -> t (step charts),
  //     value(v, si, idx) -> text, strokes: [{color, width, dash, alpha}], onZoom([lo, hi] | null), marks() -> [t|step]}
  G.chart = function (holder, o) {
    // uPlot applies a scale, and calls its setScale hook, in a microtask after it is asked: a flag set around our own
    // calls cannot tell them from a person's. `want` is what this code last asked of the x scale (a range, or "auto":
    // the data's), and a hook that finds the scale there is ours; anything else is a person's drag or double-click.
    let zoom = null, want;
    const series = [{
      label: o.x === "step" ? "step" : "time",
      value: (u, v, si, idx) => {
        if (v === null || v === undefined) return "-";
        if (o.x === "time") return G.when(v);
        const t = o.times && idx !== null && idx !== undefined ? o.times(idx) : null;
        return "step " + G.num(v, 12) + (t ? " · " + G.when(t) : "");
      },
    }];
    (o.labels || []).forEach((label, i) => {
      const s = (o.strokes || [])[i] || {};
      series.push({
        label, stroke: s.color || G.COLORS[i % G.COLORS.length], width: s.width || 1.5, dash: s.dash, spanGaps: o.x === "time",
        alpha: s.alpha, points: { show: false, filter: lonely(o.x === "time") },
        value: (u, v, si, idx) => (o.value ? o.value(v, si - 1, idx) : v === null || v === undefined ? "-" : G.num(v) + (o.unit || "")),
      });
    });
    const y = o.percent ? { range: [0, 100] } : o.log ? { distr: 3 } : {};
    const self = { zoomed: () => zoom };
    const u = new uPlot({
      width: o.width, height: o.height || 190, padding: [8, 36, 0, 0],  // room for the last tick's label
      legend: { show: true, live: true },
      cursor: { drag: { x: true, y: false, setScale: true } },
      scales: { x: { time: false }, y },
      series,
      axes: [
        { font: axisFont, label: o.x === "step" ? "step" : "local time", labelSize: 16, labelFont: axisFont, size: 30,
          incrs: o.x === "step" ? STEP_INCRS : TIME_INCRS, space: o.x === "step" ? 50 : 70,
          values: o.x === "time" ? (u, splits) => { const sp = u.scales.x.max - u.scales.x.min; return splits.map(tickTime(sp)); }
            : (u, splits) => splits.map((v) => G.num(v, 6)) },
        { font: axisFont, label: o.yLabel || o.unit || "", labelSize: 16, labelFont: axisFont, size: 52,
          values: (u, splits) => splits.map((v) => G.num(v, 3)) },
      ],
      hooks: {
        setScale: [(u, key) => {
          if (key !== "x") return;
          const xs = u.data[0], lo = u.scales.x.min, hi = u.scales.x.max, w = want;
          const full = !xs.length || (lo <= xs[0] && hi >= xs[xs.length - 1]);
          want = undefined;
          const near = (a, b) => Math.abs(a - b) <= 1e-9 * Math.max(1, Math.abs(a), Math.abs(b));
          if (w === "auto" ? full : w && near(lo, w[0]) && near(hi, w[1])) return;  // where this code put it
          zoom = full ? null : [lo, hi];
          if (o.onZoom) o.onZoom(zoom);
        }],
        draw: [(u) => {
          if (!o.marks) return;
          const ctx = u.ctx;
          ctx.save();
          ctx.strokeStyle = "#f04438"; ctx.lineWidth = 2 * devicePixelRatio; ctx.setLineDash([4, 4]);
          for (const m of o.marks()) {
            if (m === null || m === undefined) continue;
            const px = u.valToPos(m, "x", true);
            if (px < u.bbox.left || px > u.bbox.left + u.bbox.width) continue;
            ctx.beginPath(); ctx.moveTo(px, u.bbox.top); ctx.lineTo(px, u.bbox.top + u.bbox.height); ctx.stroke();
          }
          ctx.restore();
        }],
      },
    }, [[], ...(o.labels || []).map(() => [])], holder);
    self.u = u;
    self.setData = (cols) => {
      if (zoom) { want = zoom; u.setData(cols, false); u.setScale("x", { min: zoom[0], max: zoom[1] }); }
      else { want = "auto"; u.setData(cols, true); }
    };
    self.zoomTo = (lo, hi) => {  // a range set from outside (another chart's zoom, a range typed in); null, null: all
      if (lo === null && hi === null) { zoom = null; want = "auto"; u.setData(u.data, true); return; }
      const xs = u.data[0];
      const a = lo === null ? (xs[0] ?? 0) : lo, b = hi === null ? (xs[xs.length - 1] ?? a + 1) : hi;
      zoom = want = [a, Math.max(b, a + 1e-9)];
      u.setScale("x", { min: zoom[0], max: zoom[1] });
    };
    self.destroy = () => u.destroy();
    return self;
  };

  // A chart inside a captioned figure: {fig, latest, chart, ...}; its width follows its box.
  G.figure = function (parent, key, title, make) {
    const latest = G.$("span", { cls: "latest", id: "latest-" + key, text: "-" });
    const holder = G.$("div", {});
    const fig = G.$("figure", { cls: "chart", role: "img", id: "chart-" + key, "aria-label": title },
      G.$("figcaption", {}, G.$("span", { text: title }), latest), holder);
    parent.append(fig);
    const width = Math.max(280, Math.floor(fig.clientWidth - 12) || 440);
    const chart = make(holder, width);
    (G.charts = G.charts || {})[key] = chart.u;  // what each chart draws, for a reader of the page's state (tests)
    return { fig, latest, chart, title, key };
  };
  G.fit = (figs) => {
    for (const f of figs) {
      const w = Math.floor(f.fig.clientWidth - 12);
      if (w > 0 && Math.abs(f.chart.u.width - w) > 1) f.chart.u.setSize({ width: w, height: f.chart.u.height });
    }
  };
})();
