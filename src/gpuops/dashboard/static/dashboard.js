// gpuops dashboard: the overview (instances, runs, pipelines) and a run's live page. Data arrives as JSON from the
// dashboard itself (server-sent events); everything is put in the page as text (textContent), never as markup.
(function () {
  "use strict";
  const $ = (tag, attrs, ...kids) => {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = v; else if (k === "cls") el.className = v; else el.setAttribute(k, v);
    }
    for (const kid of kids) if (kid !== null && kid !== undefined) el.append(kid);
    return el;
  };
  const main = document.getElementById("main");
  const linkEl = document.getElementById("link");
  const setLink = (text, bad) => { linkEl.textContent = text; linkEl.className = bad ? "bad" : ""; };
  const dur = (s) => {
    if (s === null || s === undefined) return "-";
    s = Math.max(0, Math.round(s));
    const h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    return h ? `${h}h${String(m).padStart(2, "0")}m` : m ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
  };
  const money = (v) => (v === null || v === undefined ? "-" : "$" + Number(v).toFixed(2));
  const num = (v, unit, digits) => (v === null || v === undefined ? "-" : Number(v).toFixed(digits || 0) + (unit || ""));
  const tag = (text, extra) => $("span", { cls: "tag " + (extra || text), text });
  const table = (label, heads, rows) => $("div", { cls: "scroll" }, $("table", { "aria-label": label },
    $("thead", {}, $("tr", {}, ...heads.map((h) => $("th", { scope: "col", text: h })))),
    $("tbody", {}, ...rows)));
  const td = (v, cls) => (v instanceof Node ? $("td", { cls }, v) : $("td", { cls, text: v }));

  // -- overview ------------------------------------------------------------------------------------------------
  function renderOverview(doc) {
    main.setAttribute("aria-busy", "false");
    document.getElementById("where").textContent = "project " + doc.project;
    const parts = [];
    parts.push($("h2", { id: "instances-title", text: "Instances" }));
    if (doc.instances_error) parts.push($("p", { cls: "error", text: "instances: " + doc.instances_error }));
    else if (!doc.instances_loaded) parts.push($("p", { cls: "note", text: "asking the API…" }));
    if (doc.instances.length) {
      parts.push(table("instances", ["name", "status", "type", "region", "uptime", "$/hour", "cost so far",
        "TTL left", "filesystems", "id"], doc.instances.map((r) => $("tr", { "data-id": r.id || "" },
        td(r.name || "-"),
        td($("span", {}, tag(r.status), r.unwatched ? " " : null, r.unwatched ? tag("billing, unwatched", "unwatched") : null,
          !r.unwatched && r.flags.length ? " " : null, !r.unwatched && r.flags.length ? tag(r.flags[0], "unwatched") : null)),
        td(r.type || "-"), td(r.region || "-"),
        td(dur(r.uptime_s), "num"), td(money(r.price_per_hour), "num"), td(money(r.cost_so_far), "num"),
        td(dur(r.ttl_left_s), "num"), td(r.file_systems.length ? r.file_systems.join(", ") : "-"),
        td(r.id || "(launching)", "id")))));
    } else if (doc.instances_loaded && !doc.instances_error) parts.push($("p", { cls: "note", text: "no instances on the account" }));

    parts.push($("h2", { text: "Runs" }));
    if (doc.runs.length) {
      parts.push(table("runs", ["run", "host", "profile", "state", "elapsed", "cost", "GPU util", "progress", "signals"],
        doc.runs.map((r) => {
          const p = r.progress || {};
          const prog = [p.step !== undefined && p.step !== null ? "step " + p.step + (p.total ? "/" + p.total : "") : null,
            p.loss !== undefined && p.loss !== null ? "loss " + Number(p.loss).toPrecision(4) : null].filter(Boolean).join("  ");
          return $("tr", { "data-run": r.run_id },
            td($("a", { href: "/run/" + encodeURIComponent(r.run_id), text: r.run_id })),
            td(r.host === null ? "-" : "#" + r.host + (r.address ? " " + r.address : "")), td(r.profile || "-"),
            td(tag(r.state)), td(dur(r.elapsed_s), "num"), td(money(r.cost), "num"), td(num(r.util, " %"), "num"),
            td(prog || "-"), td(r.signals.join("; ") || ""));
        })));
    } else parts.push($("p", { cls: "note", text: "no runs recorded in this project (gpuops train or gpuops run start one)" }));

    if (doc.pipelines.length) {
      parts.push($("h2", { text: "Pipelines (gpuops run)" }));
      parts.push(table("pipelines", ["pipeline", "stage", "elapsed", "cost", "last checkpoint", "outcome"],
        doc.pipelines.map((p) => $("tr", {},
          td(p.run_id ? $("a", { href: "/run/" + encodeURIComponent(p.run_id), text: p.id }) : p.id),
          td(p.stage_label || p.stage || "-"), td(dur(p.elapsed_s), "num"), td(money(p.cost), "num"),
          td(p.checkpoint ? p.checkpoint + (p.checkpoint_step !== null ? " (step " + p.checkpoint_step + ")" : "") : "-"),
          td(tag(p.outcome))))));
    }
    main.replaceChildren(...parts);
  }

  function overview() {
    const es = new EventSource("/events/overview");
    es.onmessage = (e) => { renderOverview(JSON.parse(e.data)); setLink("live"); };
    es.onerror = () => setLink("dashboard unreachable, retrying…", true);
  }

  // -- a run's live page ----------------------------------------------------------------------------------------
  const COLORS = ["#2e90fa", "#12b76a", "#f79009", "#9e77ed", "#f04438", "#06aed4", "#ee46bc", "#667085"];
  const METRICS = [["util", "GPU utilisation", " %", 0], ["mem", "GPU memory used", " %", 0],
    ["power", "GPU power", " W", 0], ["temp", "GPU temperature", " °C", 0]];

  function runPage(runId) {
    const st = { series: [], rows: [], loss: [], rate: [], unit: "", marks: [], seq: 0, charts: {}, figs: {} };
    const stateEl = $("p", { cls: "state", role: "status", "aria-live": "polite", id: "run-state" });
    const progEl = $("p", { cls: "progress", id: "run-progress" });
    const errEl = $("p", { cls: "error", id: "gpu-error" });
    const charts = $("div", { cls: "charts" });
    const gridEl = $("div", { cls: "grid", role: "list", "aria-label": "GPUs of every host" });
    const marksEl = $("ul", { cls: "marks", "aria-label": "training signals" });
    const logEl = $("pre", { cls: "log", "aria-label": "log tail", tabindex: "0", id: "log" });
    document.getElementById("where").textContent = "run " + runId;
    main.replaceChildren($("h1", { text: runId, style: "font-size:18px;margin:4px 0" }), stateEl, progEl, errEl,
      gridEl, charts, $("h2", { text: "Training signals" }), marksEl, $("h2", { text: "Log" }), logEl);
    main.setAttribute("aria-busy", "false");

    const xrange = () => {
      const ts = [];
      if (st.rows.length) ts.push(st.rows[0][0], st.rows[st.rows.length - 1][0]);
      if (st.loss.length) ts.push(st.loss[0][0], st.loss[st.loss.length - 1][0]);
      if (st.rate.length) ts.push(st.rate[0][0], st.rate[st.rate.length - 1][0]);
      return ts.length ? [Math.min(...ts), Math.max(Math.max(...ts), Math.min(...ts) + 10)] : [0, 10];
    };
    const drawMarks = (u) => {
      const ctx = u.ctx;
      ctx.save();
      ctx.strokeStyle = "#f04438"; ctx.lineWidth = 2 * devicePixelRatio; ctx.setLineDash([4, 4]);
      for (const m of st.marks) {
        const x = u.valToPos(m.t, "x", true);
        if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
        ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
      }
      ctx.restore();
    };
    function chart(key, title, labels, unit) {
      const fig = $("figure", { cls: "chart", role: "img", id: "chart-" + key, "aria-label": title });
      const latest = $("output", { cls: "latest", id: "latest-" + key, text: "-" });
      fig.append($("figcaption", {}, $("span", { text: title }), latest));
      const holder = $("div", {});
      fig.append(holder);
      const width = Math.max(300, (charts.clientWidth || 900) > 940 ? (charts.clientWidth - 12) / 2 - 14 : charts.clientWidth - 14);
      const u = new uPlot({
        width, height: 170, legend: { show: labels.length > 1 },
        scales: { x: { time: true, range: xrange } },
        series: [{}, ...labels.map((l, i) => ({ label: l, stroke: COLORS[i % COLORS.length], width: 1.5, spanGaps: true,
          points: { show: false } }))],
        axes: [{}, { size: 50 }],
        hooks: { draw: [drawMarks] },
      }, [[], ...labels.map(() => [])], holder);
      st.charts[key] = u; st.figs[key] = { fig, latest, title, unit, labels };
      return fig;
    }
    function buildCharts() {
      for (const u of Object.values(st.charts)) u.destroy();
      st.charts = {}; st.figs = {};
      const figs = METRICS.map(([k, t, unit]) => chart(k, t, st.series.length ? st.series : ["GPU"], unit));
      figs.push(chart("loss", "Loss", ["loss"], ""));
      figs.push(chart("rate", "Throughput", ["throughput"], ""));
      charts.replaceChildren(...figs);
    }
    function latestText(key) {
      const f = st.figs[key];
      let text = "-";
      if (key === "loss" && st.loss.length) text = Number(st.loss[st.loss.length - 1][2]).toPrecision(4);
      else if (key === "rate" && st.rate.length) text = Number(st.rate[st.rate.length - 1][1]).toPrecision(4) + " " + st.unit;
      else if (st.rows.length) {
        const vals = st.rows[st.rows.length - 1][1][key] || [];
        text = vals.map((v, i) => (f.labels.length > 1 ? f.labels[i] + " " : "") + num(v, f.unit)).join(", ") || "-";
      }
      f.latest.textContent = text;
      f.fig.setAttribute("aria-label", `${f.title} chart, latest: ${text}`);
    }
    function redraw() {
      for (const [k] of METRICS) {
        const cols = [st.rows.map((r) => r[0])];
        st.series.forEach((_, i) => cols.push(st.rows.map((r) => (r[1][k] || [])[i] ?? null)));
        if (!st.series.length) cols.push([]);
        st.charts[k].setData(cols);
        latestText(k);
      }
      st.charts.loss.setData([st.loss.map((p) => p[0]), st.loss.map((p) => p[2])]);
      st.charts.rate.setData([st.rate.map((p) => p[0]), st.rate.map((p) => p[1])]);
      latestText("loss"); latestText("rate");
    }
    function showProgress(p) {
      if (!p) { progEl.textContent = ""; return; }
      const parts = [];
      if (p.step !== null && p.step !== undefined) parts.push("step " + p.step + (p.total ? "/" + p.total : ""));
      if (p.loss !== null && p.loss !== undefined) parts.push("loss " + Number(p.loss).toPrecision(4));
      if (p.throughput !== null && p.throughput !== undefined) parts.push(Number(p.throughput).toPrecision(4) + " " + (p.throughput_unit || ""));
      if (p.steps_per_min) parts.push(Number(p.steps_per_min).toPrecision(3) + " steps/min");
      if (p.seconds_left !== null && p.seconds_left !== undefined) parts.push(dur(p.seconds_left) + " left");
      if (p.cost_at_end !== null && p.cost_at_end !== undefined) parts.push(money(p.cost_at_end) + " at the end");
      progEl.textContent = parts.join("   ");
    }
    function addMark(m) {
      st.marks.push(m);
      marksEl.append($("li", { text: `${new Date(m.t * 1000).toLocaleTimeString()} ${m.title}: ${m.hint}` }));
    }
    function addLog(text, kind) {
      const atEnd = logEl.scrollTop + logEl.clientHeight >= logEl.scrollHeight - 4;
      logEl.append($("span", { cls: kind || null, text: text + "\n" }));
      while (logEl.childNodes.length > 200) logEl.removeChild(logEl.firstChild);
      if (atEnd) logEl.scrollTop = logEl.scrollHeight;
    }
    function showGrid(grid) {
      if (!grid || grid.length < 2) { gridEl.replaceChildren(); return; }
      gridEl.replaceChildren(...grid.map((h) => $("div", { cls: "host", role: "listitem",
        "aria-label": `host ${h.host}: mean utilisation ${num(h.util, " %")}` },
        $("div", { text: `host ${h.host}  ${num(h.util, " %")}` }),
        $("div", { cls: "cells" }, ...h.gpus.map((g) => $("span", { cls: "cell " + g.level, title: `GPU ${g.gpu}: ${num(g.util, " %")}, memory ${num(g.mem, " %")}, ${num(g.temp, " °C")}, ${num(g.power, " W")}`, text: num(g.util) }))))));
    }
    function reset(s) {
      st.series = s.series; st.rows = s.rows; st.loss = s.loss; st.rate = s.rate; st.unit = s.rate_unit || "";
      st.marks = []; st.seq = s.seq;
      marksEl.replaceChildren(); logEl.replaceChildren();
      buildCharts();
      stateEl.textContent = s.state_text || s.state;
      errEl.textContent = s.gpu_error ? "nvidia-smi: " + s.gpu_error : "";
      showProgress(s.progress);
      for (const m of s.marks) addMark(m);
      for (const [text, kind] of s.log) addLog(text, kind);
      showGrid(s.grid);
      setLink(s.link, s.link !== "live");
      redraw();
    }
    function apply(entries) {
      let layoutChanged = false;
      for (const e of entries) {
        if (e.seq <= st.seq) continue;  // a reconnected stream repeats from where it began
        st.seq = e.seq;
        if (e.k === "row") {
          const last = st.rows[st.rows.length - 1];
          if (last && last[0] === e.t) last[1] = e.v; else st.rows.push([e.t, e.v]);
          if (st.rows.length > 1801) st.rows.shift();
        } else if (e.k === "grid") showGrid(e.grid);
        else if (e.k === "layout") { st.series = e.series; st.rows = []; layoutChanged = true; }
        else if (e.k === "log") addLog(e.text, e.kind);
        else if (e.k === "loss") { st.loss.push(e.p); if (st.loss.length > 3000) st.loss.shift(); }
        else if (e.k === "rate") { st.rate.push(e.p); st.unit = e.unit; if (st.rate.length > 3000) st.rate.shift(); }
        else if (e.k === "mark") addMark(e);
        else if (e.k === "progress") showProgress(e.progress);
        else if (e.k === "state") stateEl.textContent = e.text;
        else if (e.k === "link") setLink(e.text, e.text !== "live");
        else if (e.k === "gpu_error") errEl.textContent = "nvidia-smi: " + e.text;
      }
      if (layoutChanged) buildCharts();
      redraw();
    }
    fetch("/api/run/" + encodeURIComponent(runId)).then((r) => r.json().then((doc) => ({ ok: r.ok, doc }))).then(({ ok, doc }) => {
      if (!ok) { main.replaceChildren($("p", { cls: "error", text: doc.error || "no such run" })); return; }
      reset(doc);
      const es = new EventSource(`/events/run/${encodeURIComponent(runId)}?seq=${st.seq}`);
      es.onmessage = (e) => apply(JSON.parse(e.data).entries);
      es.addEventListener("reset", (e) => reset(JSON.parse(e.data)));
      es.onerror = () => setLink("dashboard unreachable, retrying…", true);
    });
  }

  const m = location.pathname.match(/^\/run\/([^/]+)$/);
  if (m) runPage(decodeURIComponent(m[1])); else overview();
})();
