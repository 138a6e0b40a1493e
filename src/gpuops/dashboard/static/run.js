// gpuops dashboard: a run's page. What the run is, its state (the one live region), loss and throughput by step over
// its whole history (from the project's database, then live), its GPUs by time, its signals and its log's tail.
(function () {
  "use strict";
  const G = window.G, $ = G.$;
  const METRICS = [["util", "GPU utilisation", "%", true], ["mem", "GPU memory used", "%", true],
    ["power", "GPU power", "W", false], ["temp", "GPU temperature", "°C", false]];
  const MAX_POINTS = 12000, MAX_ROWS = 6000;

  G.runPage = function (runId) {
    const st = { loss: [], rate: [], unit: "", rows: [], series: [], mode: "gpu", memTotal: [], marks: [], seq: 0,
      progress: null, info: {}, state: "", exitCode: null, figs: {}, smooth: 0.6, log: false, es: null, pending: false,
      link: "", pageLag: 0, unreachable: false, seenAt: null };
    const enc = encodeURIComponent(runId);
    const stateEl = $("p", { cls: "state", role: "status", "aria-live": "polite", id: "run-state" });
    const detailEl = $("p", { cls: "detail", id: "run-detail" });
    const infoEl = $("dl", { cls: "info", id: "run-info", "aria-label": "what this run is" });
    const endingEl = $("div", { id: "run-ending" });
    const progEl = $("p", { cls: "progress", id: "run-progress" });
    const errEl = $("p", { cls: "error", id: "gpu-error" });
    const stepCharts = $("div", { cls: "charts" }), timeCharts = $("div", { cls: "charts" });
    const gridEl = $("div", { cls: "grid", role: "list", "aria-label": "GPUs of every host" });
    const marksEl = $("ul", { cls: "marks", "aria-label": "training signals" });
    const logEl = $("pre", { cls: "log", "aria-label": "log tail", tabindex: "0", id: "log" });
    const smoothIn = $("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(st.smooth), id: "smoothing" });
    const smoothOut = $("span", { text: String(st.smooth), id: "smoothing-value" });
    const logIn = $("input", { type: "checkbox", id: "log-scale" });
    const fromIn = $("input", { type: "number", id: "step-from", placeholder: "first", size: "8" });
    const toIn = $("input", { type: "number", id: "step-to", placeholder: "last", size: "8" });
    const spanIn = $("select", { id: "time-range" }, ...[["all", "whole run"], ["900", "last 15 min"], ["3600", "last hour"],
      ["21600", "last 6 hours"], ["86400", "last 24 hours"]].map(([v, t]) => $("option", { value: v, text: t })));
    const dateEl = $("span", { cls: "note", id: "time-dates" });
    document.getElementById("where").textContent = "run " + runId;
    G.main.replaceChildren(
      $("nav", { cls: "crumbs" }, $("a", { href: "/", id: "back", text: "← all runs" }), " · ",
        $("a", { href: `/run/${enc}/log`, id: "full-log", text: "full log" }), " · ",
        $("a", { href: `/?compare=${enc}`, id: "compare-link", text: "compare with other runs" })),
      $("h1", { text: runId }), stateEl, detailEl, infoEl, endingEl, progEl, errEl,
      $("h2", { text: "Training, by step" }),
      $("div", { cls: "controls" },
        $("label", { for: "smoothing" }, "smoothing "), smoothIn, smoothOut,
        $("label", {}, logIn, " log scale"),
        $("span", {}, $("label", { for: "step-from", text: "steps " }), fromIn, $("label", { for: "step-to", text: " to " }), toIn,
          " ", $("button", { type: "button", id: "step-apply", text: "show", onclick: () => stepRange(num(fromIn), num(toIn)) }),
          " ", $("button", { type: "button", id: "step-all", text: "all steps", onclick: () => stepRange(null, null) }))),
      stepCharts,
      $("h2", { text: "GPUs, by time" }),
      $("div", { cls: "controls" }, $("label", { for: "time-range", text: "range " }), spanIn, " ", dateEl),
      gridEl, timeCharts,
      $("h2", { text: "Training signals" }), marksEl, $("h2", { text: "Log (its last lines; the full log: link above)" }), logEl);
    G.main.setAttribute("aria-busy", "false");
    const num = (el) => (el.value === "" ? null : Number(el.value));

    // -- what the run is ----------------------------------------------------------------------------------------
    function showInfo(info) {
      const rows = [
        ["GPU", (info.gpus || []).join(", ") || "-"], ["instance type", info.instance_type || "-"],
        ["host", info.hosts && info.hosts.length > 1 ? info.hosts.join(", ") : info.host || "-"],
        ["script", [info.script, ...(info.args || [])].filter(Boolean).join(" ") || "-"],
        ["started", G.when(info.started)],
        ["$/hour", info.price_per_hour === null ? "-" : G.money(info.price_per_hour) + (info.hosts && info.hosts.length > 1
          ? ` per host, ${G.money(info.price_total)} for ${info.hosts.length}` : "")],
        ["exit code", String(info.exit_code ?? (st.state !== "running" ? st.exitCode ?? "-" : "-"))],
        ["cause", info.ending ? info.ending.title : "-"],
      ];
      if (info.pipeline) rows.push(["pipeline", info.pipeline]);
      if (info.preparation) rows.push(["preparation", info.preparation]);
      infoEl.replaceChildren(...rows.flatMap(([k, v]) => [$("dt", { text: k }), $("dd", { text: v, "data-k": k })]));
      const e = info.ending;
      endingEl.replaceChildren(...(e ? [$("details", { cls: "ending", open: true },
        $("summary", { text: "Why it ended: " + e.title }),
        e.evidence.length ? $("ul", { "aria-label": "evidence" }, ...e.evidence.map((x) => $("li", { text: x }))) : null,
        e.fix ? $("p", { text: "Fix: " + e.fix }) : null, e.source ? $("p", { cls: "note", text: "Source: " + e.source }) : null)] : []));
    }
    function showState() {
      const ended = ["succeeded", "failed", "stopped", "lost"].includes(st.state);
      let text = st.state || "-";
      if (st.unreachable && !ended) {  // its last known state is not what it is now: nobody knows
        G.setText(stateEl, `unreachable: its host does not answer${st.seenAt ? ", last heard from " + G.when(st.seenAt) : ""}` +
          ` (last known: ${text})`);
        stateEl.dataset.state = "unreachable";
        return;
      }
      if (st.exitCode !== null && st.exitCode !== undefined && st.state !== "running") text += ` (exit ${st.exitCode})`;
      if (ended && st.info.ending) text += ": " + st.info.ending.title;
      G.setText(stateEl, text);
      stateEl.dataset.state = st.state || "";
    }
    function showProgress(p) {
      st.progress = p;
      if (!p) { G.setText(progEl, ""); return; }
      const parts = [];
      if (p.step !== null && p.step !== undefined) parts.push("step " + G.num(p.step, 12) + (p.total ? "/" + G.num(p.total, 12) : ""));
      if (p.loss !== null && p.loss !== undefined) parts.push("loss " + G.num(p.loss));
      if (p.throughput !== null && p.throughput !== undefined) parts.push(G.num(p.throughput) + " " + (p.throughput_unit || ""));
      if (p.steps_per_min) parts.push(G.num(p.steps_per_min, 3) + " steps/min");
      if (p.seconds_left !== null && p.seconds_left !== undefined) parts.push(G.dur(p.seconds_left) + " left");
      if (p.cost_at_end !== null && p.cost_at_end !== undefined) parts.push(G.money(p.cost_at_end) + " at the end");
      G.setText(progEl, parts.join("   "));
    }

    // -- charts ---------------------------------------------------------------------------------------------------
    const utilMean = () => st.mode === "gpu" && st.series.length > 1;
    function seriesLabels(key) {
      return utilMean() && key === "util" ? [...st.series, "mean of " + st.series.length + " GPUs"] : st.series.length ? st.series : ["GPU"];
    }
    const gib = (pct, i) => {
      const tot = st.memTotal[Math.min(i, st.memTotal.length - 1)];
      return pct === null || pct === undefined || !tot ? "" : ` (${(pct / 100 * tot / 1024).toFixed(1)} GiB)`;
    };
    function buildCharts() {
      for (const f of Object.values(st.figs)) f.chart.destroy();
      st.figs = {};
      stepCharts.replaceChildren(); timeCharts.replaceChildren();
      const w = st.smooth > 0;
      for (const [key, title, pts] of [["loss", "Loss", () => st.loss], ["rate", "Throughput", () => st.rate]]) {
        st.figs[key] = G.figure(stepCharts, key, title, (holder, width) => G.chart(holder, {
          x: "step", width, log: st.log && positive(pts()), yLabel: key === "rate" ? st.unit || "per second" : "loss",
          labels: w ? [title.toLowerCase() + " (raw)", title.toLowerCase() + " (smoothed)"] : [title.toLowerCase()],
          strokes: w ? [{ width: 1, color: "rgba(46,144,250,0.35)" }, { width: 2, color: "#175cd3" }] : [{ width: 1.5 }],
          times: (i) => (pts()[i] || [])[2], unit: key === "rate" ? " " + (st.unit || "") : "",
          onZoom: (z) => stepZoomed(key, z),
        }));
      }
      for (const [key, title, unit, percent] of METRICS) {
        const labels = seriesLabels(key);
        st.figs[key] = G.figure(timeCharts, key, title, (holder, width) => G.chart(holder, {
          x: "time", width, percent, unit: " " + unit, yLabel: unit, labels, marks: () => st.marks.map((m) => m.t),
          strokes: labels.map((l, i) => (l.startsWith("mean of") ? { color: "#1d2330", width: 2, dash: [6, 4] } : {})),
          value: (v, i) => (v === null || v === undefined ? "-" : G.fixed(v, " " + unit) + (key === "mem" ? gib(v, i) : "")),
          onZoom: (z) => timeZoomed(key, z),
        }));
      }
      G.fit(Object.values(st.figs));
      if (stepZoom) for (const k of ["loss", "rate"]) st.figs[k].chart.zoomTo(stepZoom[0], stepZoom[1]);  // kept
    }
    const positive = (pts) => pts.length > 0 && pts.every((p) => p[1] === null || p[1] > 0);
    new ResizeObserver(() => G.fit(Object.values(st.figs))).observe(G.main);

    function latest(key) {
      const f = st.figs[key];
      let text = "-";
      if (key === "loss") {
        const p = st.progress && st.progress.loss;
        text = typeof p === "string" ? p : st.loss.length ? G.num(st.loss[st.loss.length - 1][1]) : "-";
        if (text === "-" && st.loss.length && st.loss[st.loss.length - 1][1] === null) text = "NaN";
      } else if (key === "rate") text = st.rate.length ? G.num(st.rate[st.rate.length - 1][1]) + " " + st.unit : "-";
      else if (st.unreachable && !["succeeded", "failed", "stopped", "lost"].includes(st.state)) {
        text = "no answer" + (st.seenAt ? " since " + G.clock(st.seenAt) : "");  // not a figure from before
      } else if (st.rows.length) {
        const labels = seriesLabels(key), vals = rowVals(st.rows[st.rows.length - 1], key);
        const unit = METRICS.find((m) => m[0] === key)[2];
        text = vals.map((v, i) => (labels.length > 1 ? labels[i] + " " : "") + G.fixed(v, " " + unit) +
          (key === "mem" && !labels[i].startsWith("mean") ? gib(v, i) : "")).join(", ") || "-";
      }
      G.setText(f.latest, text);
      f.fig.setAttribute("aria-label", `${f.title} chart, latest: ${text}`);
    }
    const gpuLatest = () => { for (const [key] of METRICS) if (st.figs[key]) latest(key); };
    function rowVals(row, key) {
      const vals = (row[1][key] || []).slice();
      if (key === "util" && utilMean()) {
        const got = vals.filter((v) => v !== null && v !== undefined);
        vals.push(got.length ? Math.round(got.reduce((a, b) => a + b, 0) / got.length * 10) / 10 : null);
      }
      return vals;
    }
    function draw() {
      st.pending = false;
      for (const [key, pts] of [["loss", st.loss], ["rate", st.rate]]) {
        const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
        st.figs[key].chart.setData(st.smooth > 0 ? [xs, ys, G.ema(ys, st.smooth)] : [xs, ys]);
        latest(key);
      }
      for (const [key] of METRICS) {
        const n = seriesLabels(key).length;
        const cols = [st.rows.map((r) => r[0])];
        for (let i = 0; i < n; i++) cols.push(st.rows.map((r) => rowVals(r, key)[i] ?? null));
        st.figs[key].chart.setData(cols);
        latest(key);
      }
      if (st.rows.length) {
        const a = st.rows[0][0], b = st.rows[st.rows.length - 1][0];
        G.setText(dateEl, `${G.day(a)} ${G.clock(a)} to ${G.day(b) === G.day(a) ? "" : G.day(b) + " "}${G.clock(b)} (local time)`);
      }
    }
    const redraw = () => { if (!st.pending) { st.pending = true; requestAnimationFrame(draw); } };

    // -- ranges: a zoom on one chart is the range of its kind; a range asks the database for its every point -------
    let stepTimer = null, stepZoom = null;  // the steps shown, while zoomed: kept through every refresh
    function stepZoomed(key, z) {
      const other = st.figs[key === "loss" ? "rate" : "loss"];
      other.chart.zoomTo(z ? z[0] : null, z ? z[1] : null);  // a double-click (all steps) too
      stepZoom = z;
      fromIn.value = z ? Math.floor(z[0]) : ""; toIn.value = z ? Math.ceil(z[1]) : "";
      clearTimeout(stepTimer);
      stepTimer = setTimeout(() => detail([z]), 250);
    }
    function stepRange(lo, hi) {
      for (const k of ["loss", "rate"]) st.figs[k].chart.zoomTo(lo, hi);
      if (lo === null && hi === null) { fromIn.value = toIn.value = ""; stepZoom = null; history(); return; }
      stepZoom = [lo === null ? st.loss.length ? st.loss[0][0] : 0 : lo, hi === null ? 1e15 : hi];
      detail([stepZoom]);
    }
    // ranges asked in one go and merged in their order: the whole history (thinned) first, then the zoomed range's
    // every point, so a refresh never leaves the range a person looks at thinned
    function detail(zs) {
      for (const key of ["loss", "rate"]) {
        Promise.all(zs.map((z) => G.getJSON(`/api/run/${enc}/series?metric=${key}` +
          (z ? `&lo=${Math.floor(z[0])}&hi=${Math.ceil(z[1])}` : "") + "&limit=3000")
          .then(({ ok, doc }) => (ok ? doc : null), () => null))).then((docs) => {
          docs.forEach((doc, i) => {
            if (!doc) return;
            const z = zs[i];
            st[key] = merge(st[key], doc.points, z ? z[0] : null, z ? z[1] : null);
            if (key === "rate" && doc.unit) st.unit = doc.unit;
          });
          redraw();
        });
      }
    }
    function history() { detail(stepZoom ? [null, stepZoom] : [null]); }
    function merge(cur, got, lo, hi) {  // points of [lo, hi] replaced by those fetched; newer live ones kept
      const inside = (x) => (lo === null || x >= lo) && (hi === null || x <= hi);
      const last = got.length ? got[got.length - 1][0] : -Infinity;
      const keep = cur.filter((p) => !inside(p[0]) || (hi === null && p[0] > last));
      const out = keep.concat(got).sort((a, b) => a[0] - b[0]);
      return out.filter((p, i) => i === out.length - 1 || out[i + 1][0] !== p[0]);
    }
    function timeZoomed(key, z, others) {
      if (!others) for (const [k] of METRICS) if (k !== key) { if (z) st.figs[k].chart.zoomTo(z[0], z[1]); else st.figs[k].chart.zoomTo(null, null); }
      if (z) G.getJSON(`/api/run/${enc}/gpu?lo=${z[0]}&hi=${z[1]}`).then(({ ok, doc }) => {
        if (!ok || JSON.stringify(doc.series) !== JSON.stringify(st.series)) return;
        const inside = (t) => t >= z[0] && t <= z[1];
        st.rows = st.rows.filter((r) => !inside(r[0])).concat(doc.rows).sort((a, b) => a[0] - b[0]);
        redraw();
      }, () => {});
    }
    spanIn.addEventListener("change", () => {
      if (spanIn.value === "all") { for (const [k] of METRICS) st.figs[k].chart.zoomTo(null, null); return; }
      const end = st.rows.length ? st.rows[st.rows.length - 1][0] : Date.now() / 1000;
      for (const [k] of METRICS) st.figs[k].chart.zoomTo(end - Number(spanIn.value), end);
      timeZoomed(null, [end - Number(spanIn.value), end], true);
    });
    smoothIn.addEventListener("input", () => {
      const was = st.smooth > 0;
      st.smooth = Number(smoothIn.value); smoothOut.textContent = smoothIn.value;
      if (was !== st.smooth > 0) buildCharts();
      redraw();
    });
    logIn.addEventListener("change", () => { st.log = logIn.checked; buildCharts(); redraw(); });

    // -- the page's data: the run's document, then its live entries ----------------------------------------------
    function addMark(m) {
      st.marks.push(m);
      marksEl.append($("li", { text: `${m.t ? G.clock(m.t) + " " : ""}${m.title}: ${m.hint}` }));
    }
    function addLogs(lines) {
      const atEnd = logEl.scrollTop + logEl.clientHeight >= logEl.scrollHeight - 4;
      const frag = document.createDocumentFragment();
      for (const [text, kind] of lines.slice(-200)) frag.append($("span", { cls: kind || null, text: text + "\n" }));
      logEl.append(frag);
      let extra = logEl.childNodes.length - 200;
      while (extra-- > 0) logEl.removeChild(logEl.firstChild);
      if (atEnd) logEl.scrollTop = logEl.scrollHeight;
    }
    function showGrid(grid) {
      if (!grid || grid.length < 2) { gridEl.replaceChildren(); return; }
      gridEl.replaceChildren(...grid.map((h) => $("div", { cls: "host", role: "listitem",
        "aria-label": `host ${h.host}: mean utilisation ${G.fixed(h.util, " %")}` },
        $("div", { text: `host ${h.host}  ${G.fixed(h.util, " %")}` }),
        $("div", { cls: "cells" }, ...h.gpus.map((g) => $("span", { cls: "cell " + g.level,
          title: `GPU ${g.gpu}: ${G.fixed(g.util, " %")}, memory ${G.fixed(g.mem, " %")}, ${G.fixed(g.temp, " °C")}, ${G.fixed(g.power, " W")}`,
          text: G.fixed(g.util) }))))));
    }
    function showLink(text) {
      st.link = text;
      if (st.pageLag > 3) G.setLink(`behind by ${Math.round(st.pageLag)} s (this page cannot draw as fast as the log comes)`, true);
      else if (text === "ended") G.setLink("run ended: shown from its record and the project's database", false);
      else G.setLink(text, !(text === "live" || text === "connecting" || text.startsWith("connected")));
    }
    function resetLive(s) {  // the feed's snapshot after this page fell behind its journal: no full reload
      if (JSON.stringify(s.series) !== JSON.stringify(st.series)) { load(); return; }
      st.seq = s.seq; st.state = s.state; st.exitCode = s.exit_code; st.unreachable = !!s.unreachable; st.seenAt = s.seen_at;
      for (const p of s.loss) upsert(st.loss, [p[1], p[2], p[0]]);
      for (const p of s.rate) upsert(st.rate, [p[1], p[2], p[0]]);
      if (s.rows.length) st.rows = st.rows.filter((r) => r[0] < s.rows[0][0]).concat(s.rows);
      logEl.replaceChildren(); addLogs(s.log);
      showState(); G.setText(detailEl, s.detail || ""); showProgress(s.progress); showGrid(s.grid); showLink(s.link);
      redraw();
    }
    function reset(s) {
      st.series = s.series; st.mode = s.mode; st.memTotal = s.mem_total || []; st.rows = s.rows;
      st.loss = s.loss; st.rate = s.rate; st.unit = s.rate_unit || ""; st.seq = s.seq; st.info = s.info || st.info;
      st.state = s.state; st.exitCode = s.exit_code ?? (s.info || {}).exit_code;
      st.unreachable = !!s.unreachable; st.seenAt = s.seen_at;
      st.marks = []; marksEl.replaceChildren(); logEl.replaceChildren();
      showInfo(st.info); showState(); G.setText(detailEl, s.detail || "");
      buildCharts();
      errEl.textContent = s.gpu_error ? "nvidia-smi: " + s.gpu_error : "";
      showProgress(s.progress);
      for (const m of s.marks) addMark(m);
      addLogs(s.log.length || s.link !== "ended" ? s.log
        : [["(the log has no lines)", "note"]]);  // a log read from the host says so itself (its notes)
      showGrid(s.grid);
      showLink(s.link);
      redraw();
    }
    function upsert(arr, p) {  // [x, value, t] by x
      const last = arr[arr.length - 1];
      if (!last || p[0] > last[0]) arr.push(p);
      else if (p[0] === last[0]) arr[arr.length - 1] = p;
      else { const i = arr.findIndex((q) => q[0] >= p[0]); if (arr[i][0] === p[0]) arr[i] = p; else arr.splice(i, 0, p); }
    }
    function apply(entries) {
      let relayout = false, ended = false, recorded = false;
      const logs = [];
      for (const e of entries) {
        if (e.seq <= st.seq) continue;  // a reconnected stream repeats from where it began
        st.seq = e.seq;
        if (e.k === "row") {
          const last = st.rows[st.rows.length - 1];
          if (last && last[0] === e.t) last[1] = e.v; else st.rows.push([e.t, e.v]);
        } else if (e.k === "grid") showGrid(e.grid);
        else if (e.k === "layout") relayout = true;
        else if (e.k === "log") logs.push([e.text, e.kind]);
        else if (e.k === "loss") upsert(st.loss, [e.p[1], e.p[2], e.p[0]]);
        else if (e.k === "rate") { upsert(st.rate, [e.p[1], e.p[2], e.p[0]]); st.unit = e.unit; }
        else if (e.k === "mark") addMark(e);
        else if (e.k === "progress") showProgress(e.progress);
        else if (e.k === "state") { st.state = e.state; st.exitCode = e.exit_code; ended = ended || e.state !== "running"; showState(); showInfo(st.info); }
        else if (e.k === "detail") G.setText(detailEl, e.text);
        else if (e.k === "link") showLink(e.text);
        else if (e.k === "reach") { st.unreachable = e.unreachable; st.seenAt = e.seen_at; showState(); gpuLatest(); }
        else if (e.k === "gpu_error") errEl.textContent = "nvidia-smi: " + e.text;
        else if (e.k === "recorded") recorded = true;
      }
      if (logs.length) addLogs(logs);
      if (relayout || recorded) { load(); return; }  // recorded: the follower wrote how it ended (exit code, cause)
      if (ended) setTimeout(load, 1500);  // the exit code early; the cause once the record is written (recorded)
      if (st.loss.length > MAX_POINTS || st.rate.length > MAX_POINTS) history();
      if (st.rows.length > MAX_ROWS) G.getJSON(`/api/run/${enc}/gpu`).then(({ ok, doc }) => { if (ok) { st.rows = doc.rows; redraw(); } }, () => {});
      redraw();
    }
    function load() {
      return G.getJSON(`/api/run/${enc}`).then(({ ok, doc }) => {
        if (!ok) { G.main.replaceChildren($("p", { cls: "error", text: doc.error || "no such run" }), $("a", { href: "/", text: "← all runs" })); return false; }
        reset(doc);
        return true;
      }, () => false);
    }
    load().then((ok) => {
      if (!ok) return;
      st.es = G.stream(`/events/run/${enc}?seq=${st.seq}`, { message: (d) => {
        const lag = d.at ? Date.now() / 1000 - d.at : 0;
        const was = st.pageLag > 3;
        st.pageLag = lag;
        apply(d.entries);
        if (was !== lag > 3) showLink(st.link || "live");
      }, events: { reset: resetLive } });
      setTimeout(history, 3000);  // the log's stretches read back meanwhile (a run followed late)
      setInterval(history, 60000);  // and what another follower (`gpuops run`) kept
    });
  };
})();
