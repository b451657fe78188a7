// The dashboard page: fetches /dashboard/data.json every few seconds and draws it with uPlot.
"use strict";
const REFRESH_MS = 3000;
const COLORS = ["#2b6cb0", "#c05621", "#2f855a", "#6b46c1", "#b83280", "#975a16", "#2c7a7b", "#c53030"];
const charts = {};

function fmt(value, digits) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

function pct(value) {
  return value === null || value === undefined ? "-" : (100 * value).toFixed(1) + " %";
}

function fillTable(id, rows) {
  const body = document.querySelector("#" + id + " tbody");
  body.replaceChildren(...rows.map(cells => {
    const tr = document.createElement("tr");
    for (const [field, text] of cells) {
      const td = document.createElement("td");
      td.dataset.field = field;
      td.textContent = text;
      tr.appendChild(td);
    }
    return tr;
  }));
}

// One uPlot per panel; rebuilt when its series change, otherwise given new data.
function draw(panel, times, series, opts = {}) {
  const el = document.querySelector("#" + panel + " .chart");
  const labels = series.map(s => s.label).join("|");
  const data = [times, ...series.map(s => s.values)];
  const old = charts[panel];
  if (old && old.labels === labels) {
    old.plot.setData(data);
    return;
  }
  if (old) old.plot.destroy();
  const width = Math.max(300, el.clientWidth || 580);
  const plot = new uPlot({
    width, height: 220,
    scales: { x: opts.bars ? { time: false, range: [0, 1] } : { time: true }, y: opts.yRange ? { range: opts.yRange } : {} },
    axes: [{}, { size: 60 }],
    series: [{}, ...series.map((s, i) => ({
      label: s.label, stroke: s.color || COLORS[i % COLORS.length], width: 1.5, dash: s.dash,
      fill: opts.bars ? COLORS[0] + "88" : undefined, paths: opts.bars ? uPlot.paths.bars({ size: [0.8] }) : undefined,
      spanGaps: false, points: { show: !opts.bars && s.values.includes(null), size: 4 },
    }))],
  }, data, el);
  charts[panel] = { labels, plot };
}

function latencySeries(d, which) {
  const out = [];
  d.tiers.forEach((tier, i) => {
    const color = COLORS[i % COLORS.length];
    out.push({ label: `${tier} p50`, values: d.series[tier][which + "_p50_ms"], color });
    out.push({ label: `${tier} p99`, values: d.series[tier][which + "_p99_ms"], color, dash: [2, 3] });
  });
  return out;
}

function render(d) {
  const times = d.times;
  const rps = [];
  d.tiers.forEach(tier => {
    for (const [status, values] of Object.entries(d.series[tier].rps)) rps.push({ label: `${tier} ${status}`, values });
  });
  draw("panel-requests", times, rps);
  const slos = d.slos_ms.map(slo => ({ label: `SLO ${slo} ms`, values: times.map(() => slo), color: "#c53030",
                                       dash: [8, 4] }));
  draw("panel-ttft", times, [...latencySeries(d, "ttft"), ...slos]);
  draw("panel-tpot", times, latencySeries(d, "tpot"));
  const slo = d.slos_ms.length > 0;  // without any TTFT SLO, "goodput" would only count the 200s
  draw("panel-goodput", times, [{ label: slo ? "goodput %" : "no SLO",
                                  values: d.goodput.map(g => g === null || !slo ? null : 100 * g) }],
       { yRange: [0, 100] });
  const refusals = Object.entries(d.refusals).map(([reason, values]) => ({ label: reason, values }))
    .concat(Object.entries(d.spills || {}).map(([move, values]) => ({ label: "spilled " + move, values })));
  draw("panel-admission", times, refusals.length ? refusals : [{ label: "refused", values: times.map(() => 0) }]);
  const bins = d.difficulty.map((_, i) => (i + 0.5) / d.difficulty.length);
  draw("panel-routing", bins, [{ label: "requests by difficulty", values: d.difficulty }], { bars: true });

  fillTable("tiers", d.tiers.map(t => {
    const s = d.summary[t];
    return [["tier", t], ["requests", s.requests], ["rps", fmt(s.rps, 2)], ["ok", s.ok], ["share", pct(s.share)],
            ["ttft_p50_ms", fmt(s.ttft_p50_ms, 1)], ["ttft_p99_ms", fmt(s.ttft_p99_ms, 1)],
            ["tpot_p50_ms", fmt(s.tpot_p50_ms, 1)], ["tpot_p99_ms", fmt(s.tpot_p99_ms, 1)],
            ["goodput", slo ? pct(s.goodput) : "no SLO"]];
  }));
  fillTable("replicas", (d.replicas || []).map(r => [
    ["replica", r.replica], ["tier", r.tier], ["health", r.health], ["in_flight", r.in_flight],
    ["awaiting_first_token", r.awaiting_first_token], ["backend_queue", fmt(r.backend_queue, 0)],
    ["predicted_ttft_ms", fmt(r.predicted_ttft_ms, 1)], ["predicted_sent_ttft_ms", fmt(r.predicted_sent_ttft_ms, 1)],
    ["measured_ttft_ms", fmt(r.measured_ttft_ms, 1)], ["prefill_ratio", fmt(r.prefill_ratio, 2)],
    ["sent", r.sent]]));
  fillTable("admission", Object.entries(d.admission).map(([t, a]) =>
    [["tier", t], ["limit", a.limit], ["in_flight", a.in_flight], ["queued", a.queued]]));
  // every configured tier, embedding tiers included: one without requests in the window has a share of 0
  fillTable("shares", d.configured_tiers.map(t => [["tier", t], ["share", pct(d.summary[t] ? d.summary[t].share : 0)]]));
  fillTable("cache", Object.entries(d.cache).map(([status, n]) => [["status", status], ["requests", n]]));
  fillTable("tenants", d.tenants.map(t => [["tenant", t.tenant], ["requests", t.requests],
                                          ["cost_usd", fmt(t.cost_usd, 6)], ["saved_usd", fmt(t.saved_usd, 6)]]));
  const all = d.tiers.map(t => d.summary[t]);
  const total = all.reduce((n, s) => n + s.requests, 0);
  const good = all.reduce((n, s) => n + (s.goodput || 0) * s.requests, 0);
  document.getElementById("goodput-now").textContent = !slo ? "no SLO" : total ? pct(good / total) : "-";
  document.getElementById("cache-ratio").textContent = pct(d.cache_hit_ratio);
  document.getElementById("redis").textContent = d.redis;
  document.getElementById("day").textContent = d.day || "";
  document.getElementById("updated").textContent = "updated " + new Date(d.now * 1000).toISOString();
}

async function refresh() {
  try {
    const response = await fetch("/dashboard/data.json", { credentials: "same-origin", cache: "no-store" });
    if (!response.ok) throw new Error(`data.json answered ${response.status}`);
    render(await response.json());
    document.getElementById("error").textContent = "";
  } catch (err) {
    document.getElementById("error").textContent = String(err);
  } finally {
    setTimeout(refresh, REFRESH_MS);
  }
}

refresh();
