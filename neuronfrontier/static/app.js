// NeuronFrontier dashboard: a single page over the JSON API of neuronfrontier.dashboard (no build step, no CDN).
"use strict";

const $ = (sel, el = document) => el.querySelector(sel);
const esc = (s) => String(s ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" }[c]));
const fmt = (v, d = 4) => (v === null || v === undefined || Number.isNaN(v) ? "–" : typeof v === "number" ? (Number.isInteger(v) ? v.toLocaleString("en") : v.toFixed(d)) : esc(v));
const fmtInt = (v) => (v === null || v === undefined ? "–" : Math.round(v).toLocaleString("en"));
const kib = (b) => (b / 1024).toFixed(1);
const when = (t) => (t ? new Date(t * 1000).toLocaleString() : "–");
// Markdown-ish prose from the project's files: escaped, `code`, **bold**, and inline TeX made readable as plain text.
const TEX = [[/\\tfrac\{([^}]*)\}\{([^}]*)\}/g, "$1/$2"], [/\\text\{([^}]*)\}/g, "$1"], [/\\cdot/g, "·"], [/\\approx/g, "≈"],
  [/\\times/g, "×"], [/\\to(?![a-z])/g, "→"], [/\^?\\top/g, "ᵀ"], [/\\le(?![a-z])/g, "≤"], [/\\ge(?![a-z])/g, "≥"], [/\\sqrt/g, "√"], [/\\,/g, " "], [/\^2/g, "²"], [/\$/g, ""]];
const prose = (s) => TEX.reduce((t, [re, r]) => t.replace(re, r), esc(s)).replace(/`([^`]+)`/g, "<code>$1</code>").replace(/\*\*([^*]+)\*\*/g, "<b>$1</b>");
const labelCls = (l) => (/simulator/.test(l) ? "sim" : /estimate/.test(l) ? "est" : /CPU|machine/.test(l) ? "cpu" : "");
const label = (l) => `<span class="label ${labelCls(l)}">${esc(l)}</span>`;

let charts = [], streams = [], timers = [], info = null;
function cleanup() {
  charts.forEach((c) => c.destroy()); streams.forEach((s) => s.close()); timers.forEach((t) => clearInterval(t));
  charts = []; streams = []; timers = [];
}

function token() {
  const meta = $('meta[name="nf-token"]');
  if (meta) return meta.content;
  let t = sessionStorage.getItem("nf-token");
  if (!t) { t = prompt("Token of this dashboard (printed when it started):") || ""; sessionStorage.setItem("nf-token", t); }
  return t;
}
(function tokenFromUrl() {  // ?token=… once, then removed from the address bar
  const u = new URL(location.href), t = u.searchParams.get("token");
  if (t) { sessionStorage.setItem("nf-token", t); u.searchParams.delete("token"); history.replaceState(null, "", u.toString()); }
})();

async function api(path, opts = {}) {
  const r = await fetch(path, opts);
  let body = null;
  try { body = await r.json(); } catch (e) { body = null; }
  if (!r.ok) {
    if (r.status === 403) sessionStorage.removeItem("nf-token");
    throw new Error((body && body.detail) || `${r.status} ${r.statusText}`);
  }
  return body;
}
const post = (path, body) => api(path, { method: "POST", headers: { "Content-Type": "application/json", "X-NF-Token": token() }, body: JSON.stringify(body || {}) });
const enc = (name) => name.split("/").map(encodeURIComponent).join("/");

function chart(canvas, cfg) {
  const base = { animation: false, responsive: true, maintainAspectRatio: false, interaction: { mode: "nearest", intersect: false } };
  const c = new Chart(canvas, { ...cfg, options: { ...base, ...(cfg.options || {}) } });
  charts.push(c); return c;
}
const line = (label, data, extra = {}) => ({ label, data, showLine: true, pointRadius: 0, borderWidth: 1.6, ...extra });

// ---------------------------------------------------------------- runs
const NEWEST = 3;   // runs the overlay shows before the reader picks
async function viewRuns(el) {
  el.innerHTML = `<h1>Runs</h1>
  <section class="card"><h2>Start a run</h2>
    <form class="start" id="start-form" onsubmit="return false">
      <label>config<select id="f-config"></select></label><label>recipe<select id="f-recipe"></select></label>
      <label>budget (s)<select id="f-budget"></select></label><label>processes<select id="f-nproc"></select></label>
      <button id="start-run">Start run</button><span id="start-msg" class="muted"></span>
    </form>
    <p class="muted">The server runs <code>neuronfrontier train</code> with these choices on its data directory${info.sets.length
      ? `, with the overrides the dashboard was started with: <code>${info.sets.map((kv) => `--set ${esc(kv)}`).join(" ")}</code>` : ""}; one run from this page at a time.</p>
  </section>
  <section class="card"><h2>All runs <span class="muted" id="runs-dir"></span></h2><div id="runs-table">Loading…</div></section>
  <section class="card"><h2>Overlay
    <span class="muted">(by default the ${NEWEST} newest runs with a loss curve; tick runs above to choose)</span></h2>
    <label><input type="radio" name="xaxis" value="time_s" checked> charged time (s)</label>
    <label><input type="radio" name="xaxis" value="tokens"> tokens</label>
    <div class="chartbox"><canvas id="overlay-chart" data-runs=""></canvas>
      <div id="overlay-empty" class="chart-msg">Loading…</div></div></section>`;
  const opt = (sel, vals, fmtv = (v) => v) => { $(sel).innerHTML = vals.map((v) => `<option value="${esc(v)}">${esc(fmtv(v))}</option>`).join(""); };
  opt("#f-config", info.choices.config); opt("#f-recipe", info.choices.recipe, (v) => v || "(none)");
  opt("#f-budget", info.choices.budget); opt("#f-nproc", info.choices.nproc);
  $("#f-config").value = info.choices.config.includes("cpu-tiny") ? "cpu-tiny" : info.choices.config[0];
  $("#f-budget").value = "60"; $("#runs-dir").textContent = info.runs;
  $("#start-run").onclick = async () => {
    $("#start-run").disabled = true; $("#start-msg").textContent = "starting…";
    try {
      const r = await post("/api/launch", { config: $("#f-config").value, recipe: $("#f-recipe").value, budget: +$("#f-budget").value, nproc: +$("#f-nproc").value });
      location.hash = `#/run/${r.name}`;
    } catch (e) { $("#start-msg").innerHTML = `<span class="error">${esc(e.message)}</span>`; $("#start-run").disabled = false; }
  };
  // The overlay shows the NEWEST runs that logged metrics until the reader ticks or unticks a run; then theirs.
  const selected = new Set();
  let picked = false, anyLogged = false, drawnKey = null;   // drawnKey: the selection last drawn
  const selectionKey = () => [...selected].join("\n");
  const overlay = chart($("#overlay-chart"), { type: "scatter", data: { datasets: [] },
    options: { scales: { x: { title: { display: true, text: "charged time (s)" } }, y: { title: { display: true, text: "train loss (nats/token)" } } } } });
  const cache = {};   // run name -> { records, offset }: a running run's metrics are read on from the offset
  async function metrics(n, more) {
    const c = cache[n];
    if (c && !more) return c.records;
    const r = await api(`/api/runs/${enc(n)}/metrics?offset=${c ? c.offset : 0}`);
    cache[n] = { records: c && !r.reset ? c.records.concat(r.records) : r.records, offset: r.offset };
    return cache[n].records;
  }
  let drawing = 0;   // the newest redraw wins: an older one still fetching draws nothing
  async function redraw(running = new Set()) {
    const x = $('input[name="xaxis"]:checked').value, datasets = [], mine = ++drawing;
    for (const n of selected) {
      const recs = await metrics(n, running.has(n));
      const points = recs.filter((r) => r.loss !== null && r.loss !== undefined && r[x] !== undefined);
      datasets.push(line(n, points.map((r) => ({ x: r[x], y: r.loss }))));
    }
    if (mine !== drawing || !$("#overlay-chart")) return;   // a newer redraw, or the reader went to another page
    overlay.data.datasets = datasets;
    overlay.options.scales.x.title.text = x === "tokens" ? "tokens" : "charged time (s)";
    overlay.update();
    const drawn = datasets.filter((d) => d.data.length).map((d) => d.label);
    $("#overlay-chart").dataset.runs = drawn.join(",");
    const msg = $("#overlay-empty");
    msg.hidden = drawn.length > 0;
    msg.textContent = selected.size ? "The ticked runs have logged no loss yet."
      : anyLogged ? "Tick runs above to overlay their loss curves." : "No run has logged a loss yet: start one above.";
  }
  document.querySelectorAll('input[name="xaxis"]').forEach((r) => (r.onchange = () => redraw()));
  async function table() {
    const runs = await api("/api/runs");
    anyLogged = runs.some((r) => r.logged);
    if (!picked) {
      selected.clear();
      runs.filter((r) => r.logged).slice(0, NEWEST).forEach((r) => selected.add(r.name));
    }
    const running = new Set(runs.filter((r) => r.status === "running" && selected.has(r.name)).map((r) => r.name));
    if (selectionKey() !== drawnKey || running.size) { drawnKey = selectionKey(); redraw(running).catch(() => {}); }
    if (!runs.length) { $("#runs-table").innerHTML = `<p class="muted">No runs yet in ${esc(info.runs)}.</p>`; return; }
    $("#runs-table").innerHTML = `<table id="runs"><tr><th></th><th>run</th><th>config</th><th>recipe</th><th>status</th><th class="num">steps</th>
      <th class="num">tokens</th><th class="num">tok/s</th><th class="num">MFU</th><th class="num">val_bpb</th><th>when</th></tr>` +
      runs.map((r) => `<tr data-run="${esc(r.name)}"><td><input type="checkbox" class="pick" value="${esc(r.name)}" ${selected.has(r.name) ? "checked" : ""}></td>
      <td><a href="#/run/${esc(r.name)}">${esc(r.name)}</a></td><td>${esc(r.config)}${r.nproc > 1 ? ` ×${esc(r.nproc)}` : ""}</td><td>${esc(r.recipe || "–")}</td>
      <td><span class="status status-${esc(r.status)}">${esc(r.status)}</span></td><td class="num">${fmtInt(r.steps)}</td><td class="num">${fmtInt(r.tokens)}</td>
      <td class="num">${fmtInt(r.tok_s)}</td><td class="num">${r.mfu === null || r.mfu === undefined ? "n/a" : (100 * r.mfu).toFixed(1) + "%"}</td>
      <td class="num">${fmt(r.val_bpb)}</td><td>${when(r.when)}</td></tr>`).join("") + "</table>" +
      `<p class="muted">tok/s and MFU: measured by each run on its own device; MFU is n/a on CPU (no peak FLOP/s is known for it). val_bpb: measured, on the run's validation tokens.</p>`;
    document.querySelectorAll("input.pick").forEach((c) => (c.onchange = () => {
      picked = true;
      c.checked ? selected.add(c.value) : selected.delete(c.value);
      drawnKey = selectionKey();
      redraw();
    }));
  }
  await table();
  timers.push(setInterval(() => table().catch(() => {}), 3000));
}

// ---------------------------------------------------------------- one run, live
async function viewRun(el, name) {
  el.innerHTML = `<h1>${esc(name)} <span id="run-status" class="status">…</span> <button id="stop-run" class="danger" hidden>Stop</button></h1>
  <div class="cards">
    <div class="stat"><div class="k">step</div><div class="v" id="s-step">–</div></div>
    <div class="stat"><div class="k">train loss</div><div class="v" id="s-loss">–</div></div>
    <div class="stat"><div class="k">lr multiplier</div><div class="v" id="s-lr">–</div></div>
    <div class="stat"><div class="k">tokens/s <span class="label cpu">measured</span></div><div class="v" id="s-toks">–</div></div>
    <div class="stat"><div class="k">MFU <span class="label cpu">measured</span></div><div class="v" id="s-mfu">–</div></div>
    <div class="stat"><div class="k">budget used</div><div class="v" id="s-budget">–</div><div class="bar"><div id="s-budget-bar" style="width:0%"></div></div></div>
    <div class="stat"><div class="k">val_bpb <span class="label cpu">measured</span></div><div class="v" id="val-bpb">–</div></div>
  </div>
  <div class="charts" style="margin-top:14px">
    <div><canvas id="loss-chart" data-points="0"></canvas></div><div><canvas id="speed-chart"></canvas></div>
  </div>
  <section class="card" style="margin-top:14px"><h2>Details</h2><div id="run-details" class="muted">…</div><pre class="out" id="run-log" hidden></pre></section>`;
  const lossC = chart($("#loss-chart"), { type: "scatter", data: { datasets: [line("train loss", []), line("lr multiplier", [], { yAxisID: "lr", borderDash: [4, 3] })] },
    options: { scales: { x: { title: { display: true, text: "charged time (s)" } }, y: { title: { display: true, text: "loss (nats/token)" } },
      lr: { position: "right", min: 0, grid: { drawOnChartArea: false }, title: { display: true, text: "lr ×" } } } } });
  const speedC = chart($("#speed-chart"), { type: "scatter", data: { datasets: [line("tokens/s (measured)", []), line("MFU % (measured)", [], { yAxisID: "mfu" })] },
    options: { scales: { x: { title: { display: true, text: "charged time (s)" } }, y: { min: 0, title: { display: true, text: "tokens/s" } },
      mfu: { position: "right", min: 0, grid: { drawOnChartArea: false }, title: { display: true, text: "MFU %" } } } } });
  let run = await api(`/api/runs/${enc(name)}`);
  let budget = run.budget_s, last = null;
  const setStatus = (s) => { const b = $("#run-status"); b.textContent = s; b.className = `status status-${s}`;
    $("#stop-run").hidden = !(s === "running" && info.launched === name); };
  const details = (r) => {
    const l = r.launch ? `started from this page: <code>${esc(r.launch.command.join(" "))}</code>` : "started outside the dashboard";
    $("#run-details").innerHTML = `${l}<br>config ${esc(r.config || "?")}, recipe ${esc(r.recipe || "–")}, processes ${esc(r.nproc)}` +
      (r.global_batch ? `, global batch ${fmtInt(r.global_batch)} rows` : "") + (r.budget_mode ? `, budget mode ${esc(r.budget_mode)}` : "") +
      (r.result ? `<br>device ${esc(r.result.device)}; ${fmtInt(r.result.steps)} steps, ${fmtInt(r.result.tokens)} tokens, train ${fmt(r.result.train_s, 2)} s, warm-up ${fmt(r.result.warmup_s, 2)} s, eval ${fmt(r.result.eval_s, 2)} s, overrun ${fmt(r.result.overrun_s, 3)} s; unigram baseline ${fmt(r.result.unigram_bpb)} bpb` : "");
  };
  const showResult = (res) => {
    setStatus(res.status); budget = res.budget_s ?? budget;
    $("#val-bpb").textContent = res.val_bpb === null || res.val_bpb === undefined ? "–" : res.val_bpb.toFixed(4);
  };
  const add = (recs) => {
    for (const r of recs) {
      if (r.loss === null || r.loss === undefined) continue;
      const x = r.time_s ?? r.step;
      lossC.data.datasets[0].data.push({ x, y: r.loss }); lossC.data.datasets[1].data.push({ x, y: r.lr_mult });
      speedC.data.datasets[0].data.push({ x, y: r.tok_s });
      if (r.mfu !== null && r.mfu !== undefined) speedC.data.datasets[1].data.push({ x, y: 100 * r.mfu });
      last = r;
    }
    if (!last) return;
    lossC.update(); speedC.update(); $("#loss-chart").dataset.points = lossC.data.datasets[0].data.length;
    $("#s-step").textContent = fmtInt(last.step); $("#s-loss").textContent = fmt(last.loss);
    $("#s-lr").textContent = fmt(last.lr_mult, 3); $("#s-toks").textContent = fmtInt(last.tok_s);
    $("#s-mfu").textContent = last.mfu === null || last.mfu === undefined ? "n/a (CPU)" : (100 * last.mfu).toFixed(1) + "%";
    if (budget) {
      const f = Math.min(1, (last.time_s || 0) / budget);
      $("#s-budget").textContent = `${fmt(last.time_s, 1)} / ${budget} s`; $("#s-budget-bar").style.width = `${100 * f}%`;
    } else $("#s-budget").textContent = `${fmt(last.time_s, 1)} s`;
  };
  setStatus(run.status); details(run);
  if (run.result) showResult(run.result);
  $("#stop-run").onclick = async () => {
    $("#stop-run").disabled = true;
    try { await post(`/api/runs/${enc(name)}/stop`); $("#run-status").textContent = "stopping…"; }
    catch (e) { alert(e.message); $("#stop-run").disabled = false; }
  };
  const es = new EventSource(`/api/runs/${enc(name)}/stream`);
  streams.push(es);
  es.addEventListener("metrics", (e) => add(JSON.parse(e.data)));
  es.addEventListener("reset", () => { lossC.data.datasets.forEach((d) => (d.data = [])); speedC.data.datasets.forEach((d) => (d.data = [])); });
  es.addEventListener("status", (e) => setStatus(JSON.parse(e.data).status));
  es.addEventListener("log", (e) => { $("#run-log").hidden = false; $("#run-log").textContent = JSON.parse(e.data).tail; });
  es.addEventListener("result", async (e) => { showResult(JSON.parse(e.data)); await refreshInfo(); setStatus(JSON.parse(e.data).status); details(await api(`/api/runs/${enc(name)}`)); });
  es.addEventListener("end", () => es.close());
}

// ---------------------------------------------------------------- kernels
async function viewKernels(el) {
  const k = await api("/api/kernels");
  if (!k.available) { el.innerHTML = `<h1>Kernels</h1><p>${prose(k.hint)}</p>`; return; }
  el.innerHTML = `<h1>Kernels — the SBUF/PSUM visualiser</h1>
  <p class="muted">From the kernels report (${esc(k.config)}, ${esc(k.dtype)}, ${fmtInt(k.tokens)} tokens; created ${esc(k.created)}, commit ${esc(k.commit || "?")}):
  each kernel simulated once. Capacities per partition: SBUF ${kib(k.hw.sbuf_budget_pp)} KiB (the simulator's budget; ${(k.hw.sbuf_budget_bytes / 2 ** 20).toFixed(0)} MiB over ${k.hw.partitions} partitions),
  PSUM ${kib(k.hw.psum_pp)} KiB (${(k.hw.psum_bytes / 2 ** 20).toFixed(0)} MiB).</p>
  <section class="card"><table id="kernels-table"><tr><th>kernel</th><th>shapes</th><th class="num">HBM bytes ${label("measured in the simulator")}</th><th class="num">÷ compulsory</th>
  <th class="num">peak SBUF KiB/partition</th><th class="num">peak PSUM KiB/partition</th><th class="num">ISA instructions</th><th class="num">time ${label("roofline estimate")}</th></tr>` +
  k.kernels.map((e) => { const m = e.measured, comp = m.compulsory_read_bytes + m.compulsory_write_bytes;
    return `<tr><td><a href="#/kernel/${esc(e.name)}">${esc(e.title)}</a></td><td>${esc(e.shapes)}</td><td class="num">${fmtInt(m.hbm_bytes)}</td>
    <td class="num">${comp ? (m.hbm_bytes / comp).toFixed(3) : "–"}</td><td class="num">${kib(m.peak_sbuf_bytes_pp)}</td><td class="num">${kib(m.peak_psum_bytes_pp)}</td>
    <td class="num">${fmtInt(m.n_instructions)}</td><td class="num">${(e.roofline.total_s * 1e6).toFixed(1)} µs (${esc(e.roofline.bound)})</td></tr>`; }).join("") + "</table></section>";
}

async function viewKernel(el, name) {
  const k = await api(`/api/kernels/${encodeURIComponent(name)}`), m = k.measured, tl = k.timeline, hw = k.hw, rf = k.roofline;
  el.innerHTML = `<h1>${esc(k.title)} <span class="muted">${esc(k.kernel)}</span></h1><p>${esc(k.shapes)}; report for ${esc(k.config)}.</p>
  <section class="card"><h2>SBUF bytes per partition over the kernel's instruction sequence ${label(tl.label)}</h2>
    <p class="muted">peak ${fmtInt(m.peak_sbuf_bytes_pp)} B of the ${fmtInt(hw.sbuf_budget_pp)} B budget (${(100 * m.peak_sbuf_bytes_pp / hw.sbuf_budget_pp).toFixed(1)}%; ${(hw.sbuf_budget_bytes / 2 ** 20).toFixed(0)} MiB over all ${hw.partitions} partitions)${tl.bucket > 1 ? `; each point is the maximum of ${tl.bucket} calls` : ""}.</p>
    <div class="chartbox"><canvas id="sbuf-chart"></canvas></div></section>
  <section class="card"><h2>PSUM bytes per partition ${label(tl.label)}</h2>
    <p class="muted">peak ${fmtInt(m.peak_psum_bytes_pp)} B of ${fmtInt(hw.psum_pp)} B (${hw.psum_pp / hw.psum_bank_bytes} banks of ${fmtInt(hw.psum_bank_bytes)} B; ${(hw.psum_bytes / 2 ** 20).toFixed(0)} MiB in all).</p>
    <div class="chartbox" style="height:200px"><canvas id="psum-chart"></canvas></div></section>
  <div class="charts">
    <div><canvas id="hbm-chart"></canvas></div><div><canvas id="engine-chart"></canvas></div>
  </div>
  <section class="card" style="margin-top:14px"><h2>Roofline ${label(rf.label)}</h2>
    <p>${(rf.total_s * 1e6).toFixed(2)} µs on ${esc(rf.hw)}, ${esc(rf.bound)}-bound.</p>
    <table id="roofline-table"><tr><th>engine / memory</th><th class="num">µs</th></tr>${Object.entries(rf.seconds).map(([e, s]) => `<tr><td>${esc(e)}</td><td class="num">${(s * 1e6).toFixed(2)}</td></tr>`).join("")}</table></section>
  <section class="card"><h2>NKI calls by name ${label(m.label)}</h2><p>${fmtInt(m.n_instructions)} ISA instructions, ${fmtInt(m.dma_count)} DMAs, ${fmtInt(m.tensor_flops)} TensorEngine FLOPs.</p>
    <table>${Object.entries(m.instructions).map(([op, n]) => `<tr><td><code>${esc(op)}</code></td><td class="num">${fmtInt(n)}</td></tr>`).join("")}</table></section>`;
  const xs = tl.index, cap = (v) => xs.map((x) => ({ x, y: v }));
  const tip = { callbacks: { afterLabel: (c) => (c.datasetIndex === 0 && tl.op[c.dataIndex] ? `at ${tl.op[c.dataIndex]}` : "") } };
  chart($("#sbuf-chart"), { type: "scatter", data: { datasets: [
      line("live SBUF KiB/partition (measured in the simulator)", xs.map((x, i) => ({ x, y: tl.sbuf[i] / 1024 })), { stepped: true, fill: true, borderColor: "#2563eb", backgroundColor: "rgba(37,99,235,.15)" }),
      line(`SBUF budget ${kib(hw.sbuf_budget_pp)} KiB`, cap(hw.sbuf_budget_pp / 1024), { borderDash: [6, 4], borderColor: "#b91c1c" })] },
    options: { plugins: { tooltip: tip }, scales: { x: { title: { display: true, text: "NKI call (in program order)" } }, y: { min: 0, title: { display: true, text: "KiB per partition" } } } } });
  chart($("#psum-chart"), { type: "scatter", data: { datasets: [
      line("live PSUM KiB/partition (measured in the simulator)", xs.map((x, i) => ({ x, y: tl.psum[i] / 1024 })), { stepped: true, fill: true, borderColor: "#7c3aed", backgroundColor: "rgba(124,58,237,.15)" }),
      line(`PSUM ${kib(hw.psum_pp)} KiB`, cap(hw.psum_pp / 1024), { borderDash: [6, 4], borderColor: "#b91c1c" })] },
    options: { scales: { x: { title: { display: true, text: "NKI call (in program order)" } }, y: { min: 0, title: { display: true, text: "KiB per partition" } } } } });
  chart($("#hbm-chart"), { type: "bar", data: { labels: ["read", "written"], datasets: [
      { label: "HBM bytes (measured in the simulator)", data: [m.hbm_read_bytes, m.hbm_write_bytes] },
      { label: "compulsory bytes (each argument read once, each result written once)", data: [m.compulsory_read_bytes, m.compulsory_write_bytes] }] },
    options: { scales: { y: { title: { display: true, text: "bytes" } } } } });
  chart($("#engine-chart"), { type: "bar", data: { labels: Object.keys(m.engines), datasets: [{ label: "ISA instructions per engine (measured in the simulator)", data: Object.values(m.engines) }] } });
}

// ---------------------------------------------------------------- sweeps
async function viewSweeps(el) {
  const s = await api("/api/sweeps");
  el.innerHTML = `<h1>Sweeps</h1>` + (s.length ? `<ul>${s.map((n) => `<li><a href="#/sweep/${esc(n)}">${esc(n)}</a></li>`).join("")}</ul>`
    : `<p class="muted">No sweep directories in ${esc(info.runs)}: <code>neuronfrontier sweep --out ${esc(info.runs)}/NAME</code> writes one.</p>`);
}

async function viewSweep(el, name) {
  const s = await api(`/api/sweeps/${encodeURIComponent(name)}`);
  const cell = (c, v) => (c === "run" && typeof v === "string" ? `<a href="#/run/${esc(name)}/${esc(v)}">${esc(v)}</a>` : Array.isArray(v) ? esc(v.join(" ")) : fmt(v));
  el.innerHTML = `<h1>Sweep ${esc(name)}</h1><p class="muted">table from ${esc(s.source)}; val_bpb and tokens/s as measured by each run.</p>
  <section class="card"><div class="chartbox"><canvas id="pareto-chart"></canvas></div></section>
  <section class="card"><h2>Table</h2><table id="sweep-table"><tr>${s.columns.map((c) => `<th>${esc(c)}</th>`).join("")}</tr>` +
    s.rows.map((r, i) => `<tr${s.pareto.includes(i) ? ' class="pareto"' : ""}>${s.columns.map((c) => `<td>${cell(c, r[c])}</td>`).join("")}</tr>`).join("") +
    `</table><p class="muted">${s.pareto.length} row(s) on the Pareto front (no other row has both a lower val_bpb and a higher tokens/s).</p></section>
  <section class="card"><h2>The runs it launched</h2><table id="sweep-runs"><tr><th>run</th><th>status</th><th class="num">steps</th><th class="num">tok/s</th><th class="num">val_bpb</th></tr>` +
    s.runs.map((r) => `<tr><td><a href="#/run/${esc(r.name)}">${esc(r.name)}</a></td><td><span class="status status-${esc(r.status)}">${esc(r.status)}</span></td>
      <td class="num">${fmtInt(r.steps)}</td><td class="num">${fmtInt(r.tok_s)}</td><td class="num">${fmt(r.val_bpb)}</td></tr>`).join("") + "</table></section>";
  const pts = s.rows.map((r, i) => ({ x: r[s.toks], y: r[s.bpb], i })).filter((p) => typeof p.x === "number" && typeof p.y === "number");
  const front = pts.filter((p) => s.pareto.includes(p.i)).sort((a, b) => a.x - b.x);
  chart($("#pareto-chart"), { type: "scatter", data: { datasets: [
      { label: "sweep points (measured)", data: pts, pointRadius: 5, backgroundColor: "#2563eb", borderColor: "#2563eb" },
      line("Pareto front", front, { borderColor: "#b91c1c", pointRadius: 5 })] },
    options: { scales: { x: { title: { display: true, text: `${s.toks} (tokens/s)` } }, y: { grace: "10%", title: { display: true, text: `${s.bpb} (val_bpb)` } } } } });
}

// ---------------------------------------------------------------- judge tour
async function viewTour(el, i) {
  const steps = await api("/api/tour"), n = Math.max(0, Math.min(steps.length - 1, +i || 0)), s = steps[n];
  const block = (b) => `<div class="measured"><div class="src">${esc(b.source)} ${label(b.label)}</div>` + (b.kind === "table"
      ? `<table><tr>${b.header.map((h) => `<th>${prose(h)}</th>`).join("")}</tr>${b.rows.map((r) => `<tr>${r.map((c) => `<td>${prose(c)}</td>`).join("")}</tr>`).join("")}</table>`
      : `<p>${prose(b.text)}</p>`) + "</div>";
  el.innerHTML = `<h1>Judge tour</h1><div class="steps" id="tour-steps">${steps.map((t, j) => `<a href="#/tour/${j}" class="${j === n ? "active" : ""}">${j + 1}. ${esc(t.title)}</a>`).join("")}</div>
  <section class="card" id="tour-step" data-step="${esc(s.id)}"><h2>${n + 1}. ${esc(s.title)}</h2>
    <div class="claim"><div class="by">${esc(s.claim_by)} — a claim, not a measurement</div><p>${esc(s.claim)}</p></div>
    <h2>What this project measured</h2>${s.measured.map(block).join("")}
    <h2>Check it live</h2><button id="run-check">Run: ${esc(info.checks[s.check])}</button> <span id="check-status" class="muted"></span>
    <pre class="out" id="check-output" hidden></pre>
    <p>${n > 0 ? `<a href="#/tour/${n - 1}">← previous</a>` : ""} ${n < steps.length - 1 ? `<a href="#/tour/${n + 1}" id="tour-next">next →</a>` : ""}</p></section>`;
  $("#run-check").onclick = async () => {
    $("#run-check").disabled = true; $("#check-status").textContent = "running…"; $("#check-output").textContent = ""; $("#check-output").hidden = true;
    try {
      const r = await post(`/api/checks/${s.check}`);
      $("#check-status").innerHTML = r.ok === null ? `<span class="muted">not available</span>` : r.ok ? `<span class="ok">passed</span> in ${r.seconds} s` : `<span class="bad">FAILED</span> in ${r.seconds} s`;
      $("#check-output").textContent = r.output; $("#check-output").hidden = false;
    } catch (e) { $("#check-status").innerHTML = `<span class="error">${esc(e.message)}</span>`; }
    $("#run-check").disabled = false;
  };
}

// ---------------------------------------------------------------- router
async function refreshInfo() {   // the server's state, and the header's link to the run started from this page (if one runs)
  info = await api("/api/info");
  $("#launched").innerHTML = info.launched ? `running from this page: <a href="#/run/${esc(info.launched)}">${esc(info.launched)}</a>` : "";
}

async function route() {
  cleanup();
  const el = $("#view"), [, page, ...rest] = (location.hash || "#/runs").split("/"), arg = rest.map(decodeURIComponent).join("/");
  document.querySelectorAll("header nav a").forEach((a) => a.classList.toggle("active", a.id === `nav-${page === "run" ? "runs" : page === "kernel" ? "kernels" : page === "sweep" ? "sweeps" : page}`));
  try {
    await refreshInfo();
    const views = { runs: viewRuns, run: viewRun, kernels: viewKernels, kernel: viewKernel, sweeps: viewSweeps, sweep: viewSweep, tour: viewTour };
    await (views[page] || viewRuns)(el, arg);
  } catch (e) { el.innerHTML = `<p class="error">${esc(e.message)}</p>`; }
}
window.addEventListener("hashchange", route);
route();
