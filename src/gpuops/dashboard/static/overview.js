// gpuops dashboard: the overview (instances, runs, pipelines), updated in place: a row changes only in the cells that
// changed, so keyboard focus, a text selection and a scrolled table stay where they were. Runs can be sorted,
// filtered and chosen (two or more) to compare on one chart.
(function () {
  "use strict";
  const G = window.G, $ = G.$;
  const ENDED = ["succeeded", "failed", "stopped", "lost"];
  const RUN_COLS = [["", null], ["run", "run_id"], ["host", "address"], ["profile", "profile"], ["state", "state"],
    ["exit", "exit_code"], ["cause", "cause"], ["started", "started"], ["elapsed", "elapsed_s"], ["cost", "cost"],
    ["GPU util", "util"], ["progress", null], ["signals", null]];

  G.overviewPage = function () {
    const chosen = new Set(new URLSearchParams(location.search).getAll("compare"));
    const view = { sort: { key: "started", dir: -1 }, filter: "", state: "all", doc: null };
    document.getElementById("where").textContent = "";
    const instNote = $("p", { cls: "note", id: "instances-note" });
    const instBody = $("tbody", {});
    const instTable = $("div", { cls: "scroll" }, $("table", { "aria-label": "instances" },
      $("thead", {}, $("tr", {}, ...["name", "status", "type", "region", "uptime", "$/hour", "cost so far", "TTL left",
        "filesystems", "id"].map((h) => $("th", { scope: "col", text: h })))), instBody));
    const runsNote = $("p", { cls: "note", id: "runs-note" });
    const runBody = $("tbody", {});
    const heads = RUN_COLS.map(([label, key]) => {
      if (!key) return $("th", { scope: "col", text: label });
      const b = $("button", { type: "button", cls: "sort", text: label, onclick: () => {
        view.sort = { key, dir: view.sort.key === key ? -view.sort.dir : (key === "run_id" || key === "profile" ? 1 : -1) };
        render();
      } });
      return $("th", { scope: "col", "data-key": key }, b);
    });
    const filterIn = $("input", { type: "search", id: "run-filter", placeholder: "run, profile, script, cause…",
      "aria-label": "filter runs", oninput: () => { view.filter = filterIn.value.trim().toLowerCase(); render(); } });
    const stateIn = $("select", { id: "run-state-filter", "aria-label": "runs in state",
      onchange: () => { view.state = stateIn.value; render(); } },
      ...[["all", "all states"], ["running", "running"], ["ended", "ended"], ["failed", "failed or lost"],
        ["unknown", "unknown or unreachable"]].map(([v, t]) => $("option", { value: v, text: t })));
    const compareBtn = $("button", { type: "button", id: "compare", disabled: true, onclick: () => {
      location.href = "/compare?" + [...chosen].map((r) => "run=" + encodeURIComponent(r)).join("&");
    } });
    const runsTable = $("div", { cls: "scroll", id: "runs-scroll" }, $("table", { "aria-label": "runs" },
      $("thead", {}, $("tr", {}, ...heads)), runBody));
    const pipeBody = $("tbody", {});
    const pipeSection = $("section", { hidden: true }, $("h2", { text: "Pipelines (gpuops run)" }),
      $("div", { cls: "scroll" }, $("table", { "aria-label": "pipelines" }, $("thead", {}, $("tr", {},
        ...["pipeline", "stage", "elapsed", "cost", "preparation", "last checkpoint", "outcome"].map((h) => $("th", { scope: "col", text: h })))),
        pipeBody)));
    G.main.replaceChildren($("h2", { id: "instances-title", text: "Instances" }), instNote, instTable,
      $("h2", { text: "Runs" }), $("div", { cls: "controls" }, filterIn, " ", stateIn, " ", compareBtn), runsNote, runsTable,
      pipeSection);

    const cell = (sig, build, cls) => ({ sig: String(sig), build, cls });
    function instances(doc) {
      const now = doc.now;
      let note = "";
      if (doc.instances_error) note = "instances: " + doc.instances_error + (doc.instances_at
        ? ` (the list below is from ${G.ago(doc.instances_at, now)})` : " (no list yet)");
      else if (!doc.instances_loaded) note = "asking the API…";
      else if (!doc.instances.length) note = "no instances on the account";
      if (doc.instances.some((r) => r.since_seen))
        note += (note ? " · " : "") + "≥: launched elsewhere, so timed from when this project's dashboard first saw it";
      G.setText(instNote, note);
      instNote.className = doc.instances_error ? "error" : "note";
      const atLeast = (r, text) => (r.since_seen && text !== "-" ? "≥ " + text : text);
      G.syncRows(instBody, doc.instances, (r) => r.id || "launching-" + r.name, (r) => [
        r.name || "-",
        cell([r.status, r.unwatched, r.flags[0]].join("|"), () => $("span", {}, G.tag(r.status),
          r.unwatched ? " " : null, r.unwatched ? G.tag("billing, unwatched", "unwatched") : null,
          !r.unwatched && r.flags.length ? " " : null, !r.unwatched && r.flags.length ? G.tag(r.flags[0], "unwatched") : null), "status"),
        r.type || "-", r.region || "-",
        cell(atLeast(r, G.dur(r.uptime_s)), () => atLeast(r, G.dur(r.uptime_s)), "num"),
        cell(G.money(r.price_per_hour), () => G.money(r.price_per_hour), "num"),
        cell(atLeast(r, G.money(r.cost_so_far)), () => atLeast(r, G.money(r.cost_so_far)), "num"),
        cell(G.dur(r.ttl_left_s), () => G.dur(r.ttl_left_s), "num"),
        r.file_systems.length ? r.file_systems.join(", ") : "-",
        cell(r.id || "(launching)", () => r.id || "(launching)", "id"),
      ]);
    }
    function stateOf(r) {
      if (r.state === "unknown" && r.seen_at) return "unknown, last seen " + G.ago(r.seen_at, view.doc.now);
      if (r.state === "unreachable") return "unreachable" + (r.seen_at ? ", last seen " + G.ago(r.seen_at, view.doc.now) : "");
      return r.state;
    }
    const keep = (r) => {
      if (view.state === "running" && r.state !== "running") return false;
      if (view.state === "ended" && !ENDED.includes(r.state)) return false;
      if (view.state === "failed" && !["failed", "lost"].includes(r.state)) return false;
      if (view.state === "unknown" && !["unknown", "unreachable", "unreadable"].includes(r.state)) return false;
      if (!view.filter) return true;
      return [r.run_id, r.profile, r.script, r.state, r.cause, r.address].some((v) => v && String(v).toLowerCase().includes(view.filter));
    };
    function sorted(rows) {
      const { key, dir } = view.sort;
      const val = (r) => (key === "util" ? r.util : r[key]);
      return rows.slice().sort((a, b) => {
        const x = val(a), y = val(b);
        if (x === y) return (a.host ?? -1) - (b.host ?? -1);
        if (x === null || x === undefined) return 1;
        if (y === null || y === undefined) return -1;
        return (x < y ? -1 : 1) * dir;
      });
    }
    function runs(doc) {
      for (const th of heads) {
        const k = th.dataset.key;
        if (k) th.setAttribute("aria-sort", view.sort.key === k ? (view.sort.dir > 0 ? "ascending" : "descending") : "none");
      }
      const shown = sorted(doc.runs.filter(keep));
      G.setText(runsNote, doc.runs_error ? doc.runs_error : !doc.runs.length
        ? "no runs recorded in this project (gpuops train or gpuops run start one)"
        : shown.length === doc.runs.length ? "" : `${shown.length} of ${doc.runs.length} shown`);
      G.syncRows(runBody, shown, (r) => r.run_id + "#" + (r.host ?? ""), (r) => {
        const p = r.progress || {};
        const prog = [p.step !== undefined && p.step !== null ? "step " + G.num(p.step, 12) + (p.total ? "/" + G.num(p.total, 12) : "") : null,
          p.loss !== undefined && p.loss !== null ? "loss " + G.num(p.loss) : null].filter(Boolean).join("  ") || "-";
        const st = stateOf(r);
        return [
          cell(r.run_id + (r.host ?? ""), () => (r.host && r.host > 0 ? "" : $("input", { type: "checkbox", "aria-label": "compare " + r.run_id,
            checked: chosen.has(r.run_id), onchange: (e) => { if (e.target.checked) chosen.add(r.run_id); else chosen.delete(r.run_id); choose(); } }))),
          cell(r.run_id, () => $("a", { href: "/run/" + encodeURIComponent(r.run_id), text: r.run_id })),
          r.host === null ? (r.address || "-") : "#" + r.host + (r.address ? " " + r.address : ""),
          r.profile || "-",
          cell(st + (r.error || ""), () => $("span", { title: r.error || r.link || null }, G.tag(st, r.state))),
          cell(r.exit_code ?? "-", () => (r.exit_code === null || r.exit_code === undefined ? "-" : String(r.exit_code)), "num"),
          cell(r.cause || "-", () => r.cause || "-", "cause"),
          cell(G.when(r.started), () => G.when(r.started)),
          cell(G.dur(r.elapsed_s), () => G.dur(r.elapsed_s), "num"),
          cell(G.money(r.cost), () => G.money(r.cost), "num"),
          cell(G.fixed(r.util, " %"), () => G.fixed(r.util, " %"), "num"),
          prog, r.signals.join("; ") || "",
        ];
      });
    }
    function choose() {
      compareBtn.disabled = chosen.size < 2;
      G.setText(compareBtn, chosen.size < 2 ? "choose 2 or more runs to compare" : `compare ${chosen.size} runs`);
    }
    // `gpuops run --prep`: what the preparation did, on which type, for how much ("-" without one)
    function prepText(prep) {
      if (!prep) return "-";
      return prep.state + (prep.type ? " on " + prep.type : "") + " · " + G.money(prep.cost);
    }
    function pipelines(doc) {
      pipeSection.hidden = !doc.pipelines.length;
      G.syncRows(pipeBody, doc.pipelines, (p) => p.id, (p) => [
        cell(p.id + (p.run_id || ""), () => (p.run_id ? $("a", { href: "/run/" + encodeURIComponent(p.run_id), text: p.id }) : p.id)),
        p.stage_label || p.stage || "-",
        cell(G.dur(p.elapsed_s), () => G.dur(p.elapsed_s), "num"), cell(G.money(p.cost), () => G.money(p.cost), "num"),
        prepText(p.prep),
        p.checkpoint ? p.checkpoint + (p.checkpoint_step !== null ? " (step " + p.checkpoint_step + ")" : "") : "-",
        cell(p.outcome, () => G.tag(p.outcome)),
      ]);
    }
    function render() {
      const doc = view.doc;
      if (!doc) return;
      G.setText(document.getElementById("where"), "project " + doc.project);
      instances(doc); runs(doc); pipelines(doc);
      G.main.setAttribute("aria-busy", "false");
    }
    choose();
    G.stream("/events/overview", { message: (doc) => { view.doc = doc; render(); G.setLink("live"); } });
  };
})();
