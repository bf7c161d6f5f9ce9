// The dashboards: usage (a tenant's, or the one an admin picks), the request log and, for admins, the
// operator's view. Reads /dashboard/api/* with the session cookie. Charts span exactly the chosen
// range and draw every bucket, zeros included; times are in the browser's time zone (UTC where the
// server does not know it). Text is always inserted as text, never as HTML.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const TZ = Intl.DateTimeFormat().resolvedOptions().timeZone || "UTC";
  const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4d7c0f", "#be185d"];
  const state = { me: null, tenant: null, charts: {}, view: "usage", cursor: null, search: null, names: {}, shown: 0,
    tz: TZ };
  window.__sy = state; // for the browser tests: the charts' scales and data

  // An answer that is not the API's JSON (a proxy's HTML error page, a cut connection) is said as
  // what happened, not as the JSON parser's complaint.
  async function api(path) {
    let res;
    try {
      res = await fetch("/dashboard/api/" + path, { credentials: "same-origin" });
    } catch (e) {
      throw new Error("The gateway could not be reached; try again.");
    }
    if (res.status === 401) { location.href = "/dashboard/login"; throw new Error("signed out"); }
    let body;
    try {
      body = await res.json();
    } catch (e) {
      const status = `${res.status} ${res.statusText}`.trim();
      throw new Error(res.ok ? "The gateway's answer could not be read; try again."
        : `The gateway answered ${status}; try again in a moment.`);
    }
    if (!res.ok) throw Object.assign(new Error(body?.error ? body.error.message : res.statusText), { param: body?.error?.param });
    return body;
  }

  function rangeParams(withTenant) {
    const p = new URLSearchParams();
    if (withTenant && state.me.role === "admin" && state.tenant) p.set("tenant_id", state.tenant);
    p.set("tz", state.tz);
    if ($("range").value === "custom") {
      if ($("start").value) p.set("start", $("start").value);
      if ($("end").value) p.set("end", $("end").value);
    } else {
      p.set("range", $("range").value);
    }
    if ($("bucket").value) p.set("bucket", $("bucket").value);
    return p;
  }

  // Numbers with grouping and never an exponent; costs (USD) with two to eight decimals, and more
  // for a cost under a millionth (three significant digits at least), so that a tiny cost is
  // neither shown as 0 nor rounded far off; none carries floating noise.
  const fmt = (v) => typeof v === "number" ? v.toLocaleString("en-US", { maximumFractionDigits: 6 }) : (v ?? "—");
  const percent = (v) => typeof v === "number" ? (v * 100).toFixed(1) + "%" : "—";  // a fraction, as a percentage
  const decimals = (v) => v === 0 || !isFinite(v) ? 8 : Math.min(20, Math.max(8, 2 - Math.floor(Math.log10(Math.abs(v)))));
  const money = (v) => typeof v === "number"
    ? v.toLocaleString("en-US", { minimumFractionDigits: 2, maximumFractionDigits: decimals(v) }) : fmt(v);
  const when = (iso) => new Date(iso).toLocaleString(undefined, { dateStyle: "medium", timeStyle: "short", timeZone: state.tz });

  // A time zone the server does not know (one its zoneinfo lacks, or a legacy alias) gives way to
  // UTC, and the page says so next to the range.
  function useUtc() {
    state.tz = "UTC";
    $("tz").textContent = "UTC";
    $("tz-note").textContent = "Times in UTC: the server does not know your time zone " + TZ + ".";
    $("tz-note").hidden = false;
  }

  function table(el, columns, rows, onClick) {
    el.replaceChildren();
    const head = el.createTHead().insertRow();
    columns.forEach(([key, label], i) => {
      const th = document.createElement("th");
      th.textContent = label;
      th.dataset.key = key;
      if (el.classList.contains("sortable")) {
        th.tabIndex = 0;
        th.addEventListener("click", () => sortBy(el, i));
        onActivate(th, () => sortBy(el, i));
      }
      head.appendChild(th);
    });
    const body = el.createTBody();
    appendRows(el, columns, rows, onClick);
    return body;
  }

  function appendRows(el, columns, rows, onClick) {
    const body = el.tBodies[0];
    for (const row of rows) {
      const tr = body.insertRow();
      for (const [key, , show] of columns) {
        const td = tr.insertCell();
        td.textContent = show ? show(row[key], row) : fmt(row[key]);
        td.dataset.value = row[key] ?? "";
      }
      if (onClick) {
        tr.tabIndex = 0;
        tr.addEventListener("click", () => onClick(row));
        onActivate(tr, () => onClick(row));
      }
    }
  }

  // Enter or Space on a focused header or row does what a click does, for keyboard users.
  function onActivate(el, action) {
    el.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") { e.preventDefault(); action(); }
    });
  }

  function sortBy(el, index) {
    const th = el.tHead.rows[0].cells[index];
    const dir = th.getAttribute("aria-sort") === "ascending" ? "descending" : "ascending";
    for (const other of el.tHead.rows[0].cells) other.removeAttribute("aria-sort");
    th.setAttribute("aria-sort", dir);
    const rows = Array.from(el.tBodies[0].rows);
    const value = (r) => { const v = r.cells[index].dataset.value; const n = Number(v); return v !== "" && !isNaN(n) ? n : v; };
    rows.sort((a, b) => { const x = value(a), y = value(b); const c = x < y ? -1 : x > y ? 1 : 0; return dir === "ascending" ? c : -c; });
    el.tBodies[0].append(...rows);
  }

  // A line chart over exactly [start, end] of the range, y from zero; every bucket is a point.
  function chart(id, data, lines) {
    const el = $(id);
    if (state.charts[id]) state.charts[id].destroy();
    const xs = data.series.map((p) => Date.parse(p.t) / 1000);
    const x0 = Date.parse(data.start) / 1000, x1 = Date.parse(data.end) / 1000;
    const opts = {
      width: Math.max(260, el.clientWidth), height: 200,
      scales: { x: { time: true, range: () => [x0, x1] },
                y: { range: (u, lo, hi) => [0, hi > 0 ? hi * 1.1 : 1] } },
      series: [{}, ...lines.map(([label], i) => ({ label, stroke: COLORS[i % COLORS.length], width: 2,
        points: { show: xs.length <= 60 } }))],
      axes: [{}, { size: 60 }],
      legend: { live: false },
      tzDate: (ts) => uPlot.tzDate(new Date(ts * 1000), state.tz),
    };
    state.charts[id] = new uPlot(opts, [xs, ...lines.map(([, ys]) => ys)], el);
  }

  const USAGE_COLUMNS = [["requests", "Requests"], ["errors", "Errors"], ["rate_limited", "429s"],
    ["prompt_tokens", "Prompt tokens"], ["completion_tokens", "Completion tokens"], ["total_tokens", "Total tokens"],
    ["cost", "Cost (USD)", money]];

  function split(data, field) {
    const by = $("split").value;
    if (by === "total") return [[field, data.series.map((p) => p[field])]];
    const groups = by === "model" ? data.series_by_model : data.series_by_key;
    return Object.entries(groups).map(([name, s]) => [by === "key" ? (state.names[name] || name) : name, s[field]]);
  }

  // An answer that arrives after the user changed the view or its controls is dropped.
  const stale = (ticket) => ticket !== state.shown;

  async function loadUsage(ticket) {
    const q = rangeParams(true);
    const data = await api("summary?" + q);
    if (stale(ticket)) return;
    $("who").textContent = state.me.role === "admin" ? "admin · " + data.tenant_name : data.tenant_name;
    state.names = Object.fromEntries(data.by_key.map((k) => [k.key_id, k.key_name || k.key_id]));
    const totals = $("totals");
    totals.replaceChildren();
    for (const [key, label] of USAGE_COLUMNS) {
      const card = document.createElement("div");
      card.className = "card";
      card.id = "total-" + key;
      card.textContent = label;
      const b = document.createElement("b");
      b.textContent = (key === "cost" ? money : fmt)(data.totals[key]);
      b.dataset.value = data.totals[key];
      card.appendChild(b);
      totals.appendChild(card);
    }
    // every chart in total, or one line per model / key ("Split by")
    const by = $("split").value, per = by === "total" ? "" : " by " + by;
    $("cap-requests").textContent = "Requests" + per;
    $("cap-cost").textContent = "Cost (USD)" + per;
    chart("chart-requests", data, split(data, "requests"));
    chart("chart-cost", data, split(data, "cost"));
    if (by === "total") {
      $("cap-tokens").textContent = "Tokens (prompt / completion)";
      chart("chart-tokens", data, [["prompt", data.series.map((p) => p.prompt_tokens)],
        ["completion", data.series.map((p) => p.completion_tokens)]]);
      $("cap-errors").textContent = "Errors and 429s";
      chart("chart-errors", data, [["errors", data.series.map((p) => p.errors)], ["429s", data.series.map((p) => p.rate_limited)]]);
    } else {
      $("cap-tokens").textContent = "Tokens" + per;
      chart("chart-tokens", data, split(data, "total_tokens"));
      $("cap-errors").textContent = "Errors (429s included)" + per;
      chart("chart-errors", data, split(data, "errors"));
    }
    table($("latency"), [["kind", "Latency"], ["p50", "p50"], ["p90", "p90"], ["p99", "p99"]],
      [{ kind: "total latency", ...data.latency_ms }, { kind: "time to first token", ...data.ttft_ms }]);
    table($("by-model"), [["model", "Model"], ...USAGE_COLUMNS, ["latency_p50", "p50 ms"], ["latency_p99", "p99 ms"]], data.by_model);
    table($("by-key"), [["key_id", "Key"], ["key_name", "Name"], ...USAGE_COLUMNS], data.by_key);
    table($("errors"), [["error_type", "Error type"], ["requests", "Requests"], ["rate", "Share of requests", percent]], data.errors);
    table($("series"), [["t", "Bucket start (" + data.tz + ")", when], ...USAGE_COLUMNS], data.series);
    q.set("table", "series");
    $("csv").href = "/dashboard/api/export.csv?" + q;
    for (const link of document.querySelectorAll("a.csv")) {
      q.set("table", link.dataset.table);
      link.href = "/dashboard/api/export.csv?" + q;
    }
    await live();
  }

  async function live() {
    const p = state.me.role === "admin" ? "?tenant_id=" + encodeURIComponent(state.tenant) : "";
    const data = await api("limits" + p);
    const rows = ["requests_per_minute", "tokens_per_minute", "token_budget", "cost_budget"].map((k) => ({
      name: k.replaceAll("_", " ") + (k.endsWith("budget") ? " (" + data.limits.budget_period + ")" : ""),
      used: data.used[k], limit: data.limits[k] ?? "no limit", show: k === "cost_budget" ? money : fmt,
    }));
    const body = $("live").tBodies[0];
    body.replaceChildren();
    for (const r of rows) {
      const tr = body.insertRow();
      for (const v of [r.name, r.show(r.used), r.show(r.limit)]) tr.insertCell().textContent = v;
    }
  }

  const LOG_COLUMNS = [["started_at", "Time", when], ["key_id", "Key", (v) => state.names[v] || v], ["model", "Model"],
    ["deployment", "Deployment"], ["status", "Status"], ["total_tokens", "Tokens"], ["cost", "Cost (USD)", money],
    ["latency_ms", "Latency (ms)", (v) => v == null ? "—" : Math.round(v).toString()], ["error_type", "Error"]];

  function logParams() {
    const q = rangeParams(true);
    if ($("q").value.trim()) q.set("q", $("q").value.trim());
    if ($("status").value) q.set("status", $("status").value);
    return q;
  }

  // "Older requests" pages on with the filters of the search shown (state.search), not with a box
  // edited since: those apply from their first page when Search is pressed.
  async function loadRequests(more, ticket = state.shown) {
    const filters = more && state.search ? state.search : logParams();
    const csv = new URLSearchParams(filters);
    csv.set("table", "requests");
    $("csv-requests").href = "/dashboard/api/export.csv?" + csv;
    const q = new URLSearchParams(filters);
    if (more && state.cursor) q.set("before", state.cursor);
    const page = await api("requests?" + q);
    if (stale(ticket)) return;
    state.search = filters;
    Object.assign(state.names, page.key_names);
    if (more) appendRows($("requests"), LOG_COLUMNS, page.data, detail);
    else { table($("requests"), LOG_COLUMNS, page.data, detail); $("detail").hidden = true; }
    state.cursor = page.next_before;
    $("more").hidden = !state.cursor;
  }

  // A failed search shows its error and none of the rows of the last one.
  function searchFailed(e) {
    $("message").textContent = e.message;
    $("requests").replaceChildren();
    $("more").hidden = $("detail").hidden = true;
  }

  async function detail(row) {
    const p = state.me.role === "admin" ? "?tenant_id=" + encodeURIComponent(state.tenant) : "";
    const d = await api("requests/" + encodeURIComponent(row.request_id) + p);
    $("detail-id").textContent = d.request_id;
    $("detail-why").textContent = d.explanation;
    const dl = $("detail-fields");
    dl.replaceChildren();
    for (const [k, v] of Object.entries(d)) {
      if (k === "explanation") continue;
      const dt = document.createElement("dt"); dt.textContent = k.replaceAll("_", " ");
      const dd = document.createElement("dd"); dd.textContent = k === "started_at" ? when(v) + " (" + v + ")" : (k === "cost" ? money : fmt)(v);
      dd.dataset.field = k;
      dl.append(dt, dd);
    }
    $("detail").hidden = false;
    $("detail").scrollIntoView({ block: "nearest" });
  }

  const byBudget = (v, row) => (row.budget === "cost" ? money : fmt)(v);

  async function loadOperator(ticket) {
    const q = rangeParams(false);
    const [data, deps] = await Promise.all([api("overview?" + q), api("deployments")]);
    if (stale(ticket)) return;
    chart("chart-tenants", data, Object.entries(data.series_by_tenant).map(([id, ys]) => [data.tenant_labels[id], ys]));
    const cols = [["name", "Tenant"], ["status", "Status"], ...USAGE_COLUMNS, ["error_rate", "Error rate", percent]];
    table($("tenants"), cols, data.tenants);
    table($("top-spenders"), [["name", "Tenant"], ["cost", "Cost (USD)", money], ["total_tokens", "Tokens"], ["requests", "Requests"]], data.top_spenders);
    table($("budgets"), [["name", "Tenant"], ["budget", "Budget"], ["period", "Period"], ["used", "Used", byBudget], ["limit", "Limit", byBudget],
      ["share", "Used share", percent], ["near_limit", "Near limit", (v) => v ? "yes" : ""]], data.budgets);
    table($("deployments"), [["deployment", "Deployment"], ["model", "Model"], ["provider", "Provider"], ["state", "Circuit"],
      ["latency_ewma_ms", "Latency EWMA (ms)"], ["requests", "Requests"], ["errors", "Errors"], ["error_rate", "Error rate", percent]], deps.data);
  }

  // The view and its controls live in the address (#usage?range=30d&split=model): reload and
  // bookmarks keep them; a bare #view (the tabs) keeps the controls as they are.
  const CONTROLS = ["range", "start", "end", "bucket", "split", "tenant"];

  function readAddress() {
    const [view, query] = location.hash.slice(1).split("?");
    const p = new URLSearchParams(query || "");
    for (const id of CONTROLS) {
      if (!p.has(id)) continue;
      const el = $(id);
      if (el.tagName === "SELECT" && ![...el.options].some((o) => o.value === p.get(id))) continue;
      el.value = p.get(id);
    }
    for (const el of document.querySelectorAll(".custom")) el.hidden = $("range").value !== "custom";
    if (state.me.role === "admin" && $("tenant").value) state.tenant = $("tenant").value;
    return ["requests", "operator"].includes(view) ? view : "usage";
  }

  function writeAddress() {
    const p = new URLSearchParams();
    for (const id of CONTROLS) {
      if ($(id).value && !(id === "tenant" && state.me.role !== "admin")
          && !((id === "start" || id === "end") && $("range").value !== "custom")) p.set(id, $(id).value);
    }
    history.replaceState(null, "", "#" + state.view + "?" + p);
  }

  async function show(fromAddress) {
    state.view = fromAddress === true ? readAddress() : state.view;
    if (state.view === "operator" && state.me.role !== "admin") state.view = "usage";
    for (const v of ["usage", "requests", "operator"]) {
      $("view-" + v).hidden = v !== state.view;
      $("tab-" + v).classList.toggle("active", v === state.view);
    }
    for (const el of document.querySelectorAll(".usage-only")) el.hidden = state.view !== "usage";
    $("tenant-label").hidden = state.me.role !== "admin" || state.view === "operator";
    $("message").textContent = "";
    writeAddress();
    document.body.dataset.ready = "";
    const ticket = ++state.shown;
    try {
      if (state.view === "operator") await loadOperator(ticket);
      else if (state.tenant) await (state.view === "requests" ? loadRequests(false, ticket) : loadUsage(ticket));
      if (stale(ticket)) return;
      document.body.dataset.ready = "1";
    } catch (e) {
      if (stale(ticket)) return;
      if (e.param === "tz" && state.tz !== "UTC") { useUtc(); return show(); }
      $("message").textContent = e.message;
      $("view-" + state.view).hidden = $("csv").hidden = true; // no numbers of the previous choice under this one
      document.body.dataset.error = String(e);
    }
  }

  async function start() {
    state.me = await api("me");
    $("tz").textContent = TZ;
    const today = new Date();
    $("end").value = today.toLocaleDateString("en-CA");
    $("start").value = new Date(today.getFullYear(), today.getMonth(), today.getDate() - 6).toLocaleDateString("en-CA");
    if (state.me.role === "admin") {
      $("who").textContent = "admin";
      $("tab-operator").hidden = false;
      const tenants = (await api("tenants")).data;
      const select = $("tenant");
      for (const t of tenants) select.add(new Option(t.name, t.id));
      state.tenant = tenants.length ? tenants[0].id : null;
      select.addEventListener("change", () => { state.tenant = select.value; show(); });
    } else {
      state.tenant = state.me.tenant_id;
      $("who").textContent = state.me.tenant_name;
    }
    $("range").addEventListener("change", () => {
      for (const el of document.querySelectorAll(".custom")) el.hidden = $("range").value !== "custom";
      if ($("range").value !== "custom") show();
    });
    $("split").addEventListener("change", () => show());
    $("controls").addEventListener("submit", (e) => { e.preventDefault(); show(); });
    const search = (more) => {
      const ticket = state.shown;
      $("message").textContent = "";
      loadRequests(more, ticket).catch((e) => stale(ticket) || searchFailed(e));
    };
    $("log-search").addEventListener("submit", (e) => { e.preventDefault(); search(false); });
    $("more").addEventListener("click", () => search(true));
    window.addEventListener("hashchange", () => show(true));
    await show(true);
    // every view checks its session: one signed out elsewhere, revoked or expired leads back to sign-in
    setInterval(() => (state.view === "usage" && state.tenant ? live() : api("me")).catch(() => {}), 5000);
  }

  start().catch((e) => { document.body.dataset.error = String(e); });
})();
