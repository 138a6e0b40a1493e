// gpuops dashboard: two or more runs of the project on one chart, by step (their whole history, from the database),
// with smoothing, a log scale, zoom and a step range; values of every run on hover, with the time each was logged.
(function () {
  "use strict";
  const G = window.G, $ = G.$;

  G.comparePage = function (ids) {
    const st = { metric: "loss", smooth: 0.6, log: false, data: {}, chart: null, zoom: null };
    document.getElementById("where").textContent = "comparing " + ids.length + " runs";
    const legend = $("ul", { cls: "runs-legend", "aria-label": "runs compared" });
    const holder = $("div", { cls: "charts one" });
    const metricIn = $("select", { id: "metric", "aria-label": "metric" },
      $("option", { value: "loss", text: "loss" }), $("option", { value: "rate", text: "throughput" }));
    const smoothIn = $("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(st.smooth), id: "smoothing" });
    const smoothOut = $("span", { text: String(st.smooth) });
    const logIn = $("input", { type: "checkbox", id: "log-scale" });
    const fromIn = $("input", { type: "number", id: "step-from", placeholder: "first", size: "8" });
    const toIn = $("input", { type: "number", id: "step-to", placeholder: "last", size: "8" });
    const note = $("p", { cls: "note", id: "compare-note" });
    G.main.replaceChildren($("nav", { cls: "crumbs" }, $("a", { href: "/", id: "back", text: "← all runs" })),
      $("h1", { text: "Runs side by side, by step" }), legend,
      $("div", { cls: "controls" }, metricIn, " ", $("label", { for: "smoothing" }, "smoothing "), smoothIn, smoothOut,
        $("label", {}, logIn, " log scale"), $("label", { for: "step-from", text: "steps " }), fromIn,
        $("label", { for: "step-to", text: " to " }), toIn, " ",
        $("button", { type: "button", id: "step-apply", text: "show", onclick: () => range() }), " ",
        $("button", { type: "button", id: "step-all", text: "all steps", onclick: () => { fromIn.value = toIn.value = ""; range(); } })),
      note, holder);
    G.main.setAttribute("aria-busy", "false");
    legend.replaceChildren(...ids.map((id, i) => $("li", {}, $("span", { cls: "swatch", style: `background:${G.COLORS[i % G.COLORS.length]}` }),
      " ", $("a", { href: "/run/" + encodeURIComponent(id), text: id }))));

    let fig = null, zoomTimer = null;
    function build() {
      if (fig) { fig.chart.destroy(); holder.replaceChildren(); }
      const all = ids.flatMap((id) => (st.data[id] || { points: [] }).points);
      const logOk = all.length > 0 && all.every((p) => p[1] === null || p[1] > 0);
      G.setText(note, st.log && !logOk ? "log scale: some values are 0 or below, so the scale stays linear" : "");
      fig = G.figure(holder, "compare", st.metric === "loss" ? "Loss" : "Throughput", (h, width) => G.chart(h, {
        x: "step", width, height: 360, log: st.log && logOk, labels: ids,
        yLabel: st.metric === "loss" ? "loss" : (st.data[ids[0]] || {}).unit || "per second",
        strokes: ids.map((_, i) => ({ color: G.COLORS[i % G.COLORS.length], width: 2 })),
        value: (v, i, idx) => {
          if (v === null || v === undefined) return "-";
          const step = fig ? fig.chart.u.data[0][idx] : null;
          const t = timeAt(ids[i], step);
          return G.num(v) + (t ? " · " + G.clock(t) : "");
        },
        onZoom: (z) => {  // a person's drag (or double-click): that range's every point, read again
          st.zoom = z; fromIn.value = z ? Math.floor(z[0]) : ""; toIn.value = z ? Math.ceil(z[1]) : "";
          clearTimeout(zoomTimer);
          zoomTimer = setTimeout(refresh, 250);
        },
      }));
      draw();
    }
    const times = {};
    function timeAt(id, step) {
      const m = times[id];
      return m && step !== null ? m.get(step) : null;
    }
    function draw() {
      const tables = ids.map((id) => {
        const pts = (st.data[id] || { points: [] }).points;
        times[id] = new Map(pts.map((p) => [p[0], p[2]]));
        return [pts.map((p) => p[0]), G.ema(pts.map((p) => p[1]), st.smooth)];
      });
      const joined = tables.some((t) => t[0].length) ? uPlot.join(tables) : [[], ...ids.map(() => [])];
      fig.chart.setData(joined);
      G.setText(fig.latest, ids.map((id) => { const p = (st.data[id] || { points: [] }).points; return p.length ? G.num(p[p.length - 1][1]) : "-"; }).join(" | "));
    }
    function load(lo, hi) {
      const q = (lo !== null && lo !== undefined ? `&lo=${lo}` : "") + (hi !== null && hi !== undefined ? `&hi=${hi}` : "");
      return Promise.all(ids.map((id) => G.getJSON(`/api/run/${encodeURIComponent(id)}/series?metric=${st.metric}&limit=3000${q}`)
        .then(({ ok, doc }) => { st.data[id] = ok ? doc : { points: [], error: doc.error }; }, () => {})))
        .then(() => {
          const bad = ids.filter((id) => st.data[id] && st.data[id].error);
          if (bad.length) G.setText(note, "not found: " + bad.join(", "));
        });
    }
    function range() {
      const lo = fromIn.value === "" ? null : Number(fromIn.value), hi = toIn.value === "" ? null : Number(toIn.value);
      st.zoom = lo === null && hi === null ? null : [lo, hi];
      load(lo, hi).then(() => { build(); if (st.zoom) fig.chart.zoomTo(lo, hi); });
    }
    // the range shown (the whole runs, or a zoom's steps at full resolution), read again as the runs train
    const refresh = () => (st.zoom ? load(st.zoom[0] === null ? null : Math.floor(st.zoom[0]),
      st.zoom[1] === null ? null : Math.ceil(st.zoom[1])) : load()).then(draw);
    metricIn.addEventListener("change", () => { st.metric = metricIn.value; range(); });
    smoothIn.addEventListener("input", () => { st.smooth = Number(smoothIn.value); smoothOut.textContent = smoothIn.value; draw(); });
    logIn.addEventListener("change", () => { st.log = logIn.checked; build(); });
    new ResizeObserver(() => fig && G.fit([fig])).observe(G.main);
    load().then(build);
    G.setLink("refreshed every 5 s");
    setInterval(refresh, 5000);
  };
})();
