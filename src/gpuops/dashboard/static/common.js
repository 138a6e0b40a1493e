// gpuops dashboard: what every page shares. Data arrives as JSON from the dashboard itself; everything is put in the
// page as text (textContent), never as markup.
(function () {
  "use strict";
  const G = (window.G = {});
  G.$ = (tag, attrs, ...kids) => {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "text") el.textContent = v;
      else if (k === "cls") el.className = v;
      else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? "" : v);
    }
    for (const kid of kids) if (kid !== null && kid !== undefined && kid !== false) el.append(kid);
    return el;
  };
  G.main = document.getElementById("main");
  const linkEl = document.getElementById("link");
  G.setLink = (text, bad) => {  // the one status line: changed only when the connection's state does
    if (linkEl.textContent !== text) linkEl.textContent = text;
    linkEl.className = bad ? "bad" : "";
  };

  // -- numbers as a person reads them: no exponent, no trailing zeros, thousands grouped -----------------------
  G.num = (v, digits) => {
    if (v === null || v === undefined || v === "") return "-";
    if (typeof v === "string") return v;  // NaN, Infinity: as the run printed them
    const a = Math.abs(v);
    if (!isFinite(v)) return String(v);
    if (a >= 1000) return v.toLocaleString("en-US", { maximumFractionDigits: 0 });
    if (a !== 0 && a < 1e-4) return v.toExponential(1);
    const d = digits === undefined ? 4 : digits;
    return String(Number(v.toPrecision(Math.max(1, d))));
  };
  G.fixed = (v, unit, digits) => (v === null || v === undefined ? "-" : Number(v).toFixed(digits || 0) + (unit || ""));
  G.dur = (s) => {
    if (s === null || s === undefined) return "-";
    s = Math.max(0, Math.round(s));
    const d = Math.floor(s / 86400), h = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60), sec = s % 60;
    return d ? `${d}d${String(h).padStart(2, "0")}h` : h ? `${h}h${String(m).padStart(2, "0")}m`
      : m ? `${m}m${String(sec).padStart(2, "0")}s` : `${sec}s`;
  };
  G.money = (v) => (v === null || v === undefined ? "-" : "$" + Number(v).toFixed(2));
  const pad = (n) => String(n).padStart(2, "0");
  G.clock = (t) => { const d = new Date(t * 1000); return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`; };
  G.day = (t) => { const d = new Date(t * 1000); return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`; };
  G.when = (t) => (t ? `${G.day(t)} ${G.clock(t)}` : "-");
  G.ago = (t, now) => (t ? G.dur((now || Date.now() / 1000) - t) + " ago" : "-");
  G.tag = (text, extra) => G.$("span", { cls: "tag " + (extra || text), text });

  // -- a live stream, and what a page says when the dashboard stops knowing it ------------------------------------
  // After a restart the old session is gone: the answer is 401 and retrying cannot help, so the page says what to do.
  G.stream = (url, handlers) => {
    const es = new EventSource(url);
    es.onmessage = (e) => handlers.message(JSON.parse(e.data));
    for (const [name, fn] of Object.entries(handlers.events || {})) es.addEventListener(name, (e) => fn(JSON.parse(e.data)));
    es.onopen = () => handlers.open && handlers.open();
    es.onerror = () => {
      fetch("/api/overview", { cache: "no-store" }).then((r) => {
        if (r.status === 401) {
          es.close();
          G.setLink("signed out: this dashboard was restarted (or is another one); open the URL `gpuops dashboard` printed", true);
          document.body.dataset.auth = "401";
        } else G.setLink("dashboard unreachable, retrying…", true);
      }, () => G.setLink("dashboard unreachable, retrying…", true));
    };
    return es;
  };
  G.getJSON = (url) => fetch(url, { cache: "no-store" }).then((r) => r.json().then((doc) => {
    if (r.status === 401) { G.setLink("signed out: open the URL `gpuops dashboard` printed", true); throw new Error("401"); }
    return { ok: r.ok, doc };
  }));

  // -- keyed rows updated in place: focus, a selection and a scroll position survive an update ----------------------
  // cells: [{sig, build() -> Node|string, cls}] (a cell is rebuilt only when its sig changes) or plain strings.
  G.syncRows = (tbody, rows, key, cells) => {
    const old = new Map([...tbody.children].map((tr) => [tr.dataset.key, tr]));
    let prev = null;
    for (const r of rows) {
      const k = key(r);
      let tr = old.get(k);
      if (tr) old.delete(k); else { tr = document.createElement("tr"); tr.dataset.key = k; }
      const spec = cells(r);
      while (tr.children.length < spec.length) tr.append(document.createElement("td"));
      while (tr.children.length > spec.length) tr.lastChild.remove();
      spec.forEach((c, i) => {
        const td = tr.children[i];
        const s = typeof c === "object" && c !== null ? c : { sig: String(c), build: () => String(c) };
        const cls = s.cls || "";
        if (td.className !== cls) td.className = cls;
        if (td.dataset.sig !== s.sig) {
          const made = s.build();
          if (typeof made === "string") { if (td.textContent !== made || td.children.length) td.textContent = made; }
          else td.replaceChildren(made);
          td.dataset.sig = s.sig;
        }
      });
      if ((prev ? prev.nextSibling : tbody.firstChild) !== tr) tbody.insertBefore(tr, prev ? prev.nextSibling : tbody.firstChild);
      prev = tr;
    }
    for (const tr of old.values()) tr.remove();
  };
  G.setText = (el, text) => { if (el.textContent !== text) el.textContent = text; };
})();
