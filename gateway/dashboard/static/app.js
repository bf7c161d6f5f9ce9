// The usage dashboard: reads /dashboard/api/* with the session cookie, draws uPlot charts and
// sortable tables, and keeps the "Now" table live. Text is always inserted as text, never as HTML.
"use strict";
(function () {
  const $ = (id) => document.getElementById(id);
  const state = { me: null, tenant: null, charts: {} };

  async function api(path) {
    const res = await fetch("/dashboard/api/" + path, { credentials: "same-origin" });
    if (res.status === 401) { location.href = "/dashboard/login"; throw new Error("signed out"); }
    const body = await res.json();
    if (!res.ok) throw new Error(body.error ? body.error.message : res.statusText);
    return body;
  }

  function query() {
    const p = new URLSearchParams();
    if (state.me.role === "admin") p.set("tenant_id", state.tenant);
    p.set("start", $("start").value);
    p.set("end", $("end").value);
    p.set("bucket", $("bucket").value);
    return p;
  }

  const fmt = (v) => typeof v === "number" ? (Number.isInteger(v) ? v.toLocaleString("en-US") : v.toFixed(6)) : (v ?? "—");

  function table(el, columns, rows) {
    el.replaceChildren();
    const head = el.createTHead().insertRow();
    columns.forEach(([key, label], i) => {
      const th = document.createElement("th");
      th.textContent = label;
      th.dataset.key = key;
      if (el.classList.contains("sortable")) th.addEventListener("click", () => sortBy(el, i));
      head.appendChild(th);
    });
    const body = el.createTBody();
    for (const row of rows) {
      const tr = body.insertRow();
      for (const [key] of columns) {
        const td = tr.insertCell();
        td.textContent = fmt(row[key]);
        td.dataset.value = row[key] ?? "";
      }
    }
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

  function chart(id, series, xs, ys) {
    const el = $(id);
    if (state.charts[id]) state.charts[id].destroy();
    const opts = {
      width: Math.max(260, el.clientWidth), height: 200,
      series: [{}, ...series.map((label, i) => ({ label, stroke: ["#2563eb", "#dc2626", "#16a34a"][i], width: 2 }))],
      axes: [{}, { size: 60 }],
    };
    state.charts[id] = new uPlot(opts, [xs, ...ys], el);
  }

  const USAGE_COLUMNS = [["requests", "Requests"], ["errors", "Errors"], ["prompt_tokens", "Prompt tokens"],
    ["completion_tokens", "Completion tokens"], ["total_tokens", "Total tokens"], ["cost", "Cost (USD)"]];

  async function load() {
    const q = query();
    const data = await api("summary?" + q);
    const totals = $("totals");
    totals.replaceChildren();
    for (const [key, label] of USAGE_COLUMNS) {
      const card = document.createElement("div");
      card.className = "card";
      card.id = "total-" + key;
      card.textContent = label;
      const b = document.createElement("b");
      b.textContent = fmt(data.totals[key]);
      b.dataset.value = data.totals[key];
      card.appendChild(b);
      totals.appendChild(card);
    }
    const xs = data.series.map((p) => Date.parse(p.t) / 1000);
    chart("chart-requests", ["requests", "errors"], xs, [data.series.map((p) => p.requests), data.series.map((p) => p.errors)]);
    chart("chart-tokens", ["prompt", "completion"], xs, [data.series.map((p) => p.prompt_tokens), data.series.map((p) => p.completion_tokens)]);
    chart("chart-cost", ["cost"], xs, [data.series.map((p) => p.cost)]);
    table($("by-model"), [["model", "Model"], ...USAGE_COLUMNS], data.by_model);
    table($("by-key"), [["key_id", "Key"], ...USAGE_COLUMNS], data.by_key);
    table($("errors"), [["error_type", "Error type"], ["requests", "Requests"], ["rate", "Share of requests"]], data.errors);
    table($("latency"), [["kind", ""], ["p50", "p50"], ["p90", "p90"], ["p99", "p99"]],
      [{ kind: "latency", ...data.latency_ms }, { kind: "time to first token", ...data.ttft_ms }]);
    table($("series"), [["t", "Bucket start (UTC)"], ...USAGE_COLUMNS], data.series);
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
      used: data.used[k], limit: data.limits[k] ?? "no limit",
    }));
    const body = $("live").tBodies[0];
    body.replaceChildren();
    for (const r of rows) {
      const tr = body.insertRow();
      for (const v of [r.name, fmt(r.used), fmt(r.limit)]) tr.insertCell().textContent = v;
    }
  }

  async function deployments() {
    const data = await api("deployments");
    table($("deployments"), [["deployment", "Deployment"], ["model", "Model"], ["provider", "Provider"], ["state", "State"],
      ["latency_ewma_ms", "Latency EWMA (ms)"], ["requests", "Requests"], ["errors", "Errors"], ["error_rate", "Error rate"]], data.data);
  }

  async function start() {
    state.me = await api("me");
    const today = new Date();
    const weekAgo = new Date(today.getTime() - 6 * 86400000);
    $("end").value = today.toISOString().slice(0, 10);
    $("start").value = weekAgo.toISOString().slice(0, 10);
    if (state.me.role === "admin") {
      $("who").textContent = "admin";
      const tenants = (await api("tenants")).data;
      const select = $("tenant");
      for (const t of tenants) select.add(new Option(t.name + " (" + t.id + ")", t.id));
      state.tenant = tenants.length ? tenants[0].id : null;
      $("tenant-label").hidden = false;
      select.addEventListener("change", () => { state.tenant = select.value; load(); });
      $("deployments-section").hidden = false;
      await deployments();
      if (!state.tenant) return;
    } else {
      $("who").textContent = "tenant " + state.me.tenant_id;
    }
    $("controls").addEventListener("submit", (e) => { e.preventDefault(); load(); });
    await load();
    document.body.dataset.ready = "1";
    setInterval(() => live().catch(() => {}), 5000);
  }

  start().catch((e) => { document.body.dataset.error = String(e); });
})();
