/* Strata dashboard: every figure is drawn from the public API (/api/v1), nothing else.
 *
 * Data flow: the model list (/models) and the succeeded runs (/runs) are read once (and again
 * when a job finishes or new runs appear); for each selected model and metric family the page
 * pins the run the API would choose (latest succeeded run under the newest metric version that
 * computed the family) and reads its rows (/models/{id}/metrics, /heads, /neurons, /stages,
 * /families/{f}/stability). Answers pinned by run id never change, so they are cached here.
 * Panels draw when they scroll into view; switching the x axis redraws from the cache.
 */
"use strict";

const V1 = "/api/v1";
const FAMILIES = ["intervention", "logit_lens", "neurons", "similarity", "attention", "norms",
  "heads"];
const KINDS = ["drop", "swap", "drop_attn", "drop_mlp"];
const INTERVENTION = ["intervention.kl", "intervention.top1_agreement",
  "intervention.entropy_delta", "intervention.entropy", "intervention.loss_delta",
  "intervention.loss", "intervention.accuracy"];
const LENS = ["logit_lens.kl_to_final", "logit_lens.entropy", "logit_lens.top1_agreement",
  "logit_lens.loss"];
const NEURON_COUNTS = ["neurons.n_prediction", "neurons.n_suppression", "neurons.n_partition",
  "neurons.frac_prediction", "neurons.frac_suppression", "neurons.frac_partition"];
const PREV = [1, 2, 4, 5, 8, 16].flatMap((k) => [`attention.prev_${k}`,
  `attention.prev_${k}_mean`]);
const PER_HEAD = ["heads.ablation_kl", "heads.ablation_loss_delta", "heads.induction",
  "attention.prev_1", "attention.bos", "attention.entropy"];
const SIMILARITY = ["similarity.self", "similarity.index", "similarity.adjacent"];

const line = (id, title, metrics, metric, extra = {}) =>
  ({ id, title, kind: "line", metrics, metric, ...extra });

/* The panels, in page order. `lens`: points 0..L (embeddings, then each block's output). */
const PANELS = [
  line("drop", "Dropped layer — KL to the original", INTERVENTION, "intervention.kl",
    { components: KINDS, component: "drop" }),
  line("swap", "Swapped layers (l, l+1) — KL to the original", INTERVENTION, "intervention.kl",
    { components: KINDS, component: "swap" }),
  line("top1", "Top-1 agreement with the original (dropped layer)", INTERVENTION,
    "intervention.top1_agreement", { components: KINDS, component: "drop" }),
  line("entropy-delta", "Entropy change (dropped layer)", INTERVENTION,
    "intervention.entropy_delta", { components: KINDS, component: "drop" }),
  line("drop-attn", "Attention-only ablation — KL", INTERVENTION, "intervention.kl",
    { components: KINDS, component: "drop_attn" }),
  line("drop-mlp", "MLP-only ablation — KL", INTERVENTION, "intervention.kl",
    { components: KINDS, component: "drop_mlp" }),
  line("lens-kl", "Logit lens — KL to the final prediction", LENS, "logit_lens.kl_to_final",
    { lens: true }),
  line("lens-entropy", "Logit lens — entropy", LENS, "logit_lens.entropy", { lens: true }),
  line("n-prediction", "Prediction neurons per layer", NEURON_COUNTS, "neurons.n_prediction"),
  line("n-suppression", "Suppression neurons per layer", NEURON_COUNTS,
    "neurons.n_suppression"),
  line("n-partition", "Partition neurons per layer", NEURON_COUNTS, "neurons.n_partition"),
  line("prev-k", "Attention to the previous k tokens", PREV, "attention.prev_5"),
  line("sink", "Attention sink — weight on BOS", ["attention.bos", "attention.entropy"],
    "attention.bos"),
  line("norm-ratio", "Attention / MLP output norm ratio",
    ["norms.attn_mlp_ratio", "norms.attn_out", "norms.mlp_out", "norms.resid"],
    "norms.attn_mlp_ratio"),
  line("sim-self", "Swap similarity — self (cosine)", SIMILARITY, "similarity.self",
    { components: ["attn", "mlp"], component: "attn" }),
  line("sim-index", "Swap similarity — index (cosine)", SIMILARITY, "similarity.index",
    { components: ["attn", "mlp"], component: "attn" }),
  line("sim-adjacent", "Swap similarity — adjacent layers (cosine)", SIMILARITY,
    "similarity.adjacent", { components: ["attn", "mlp"], component: "attn" }),
  { id: "heads-ablation", title: "Per-head ablation KL", kind: "heatmap", metrics: PER_HEAD,
    metric: "heads.ablation_kl" },
  { id: "heads-induction", title: "Per-head induction score", kind: "heatmap",
    metrics: PER_HEAD, metric: "heads.induction" },
  { id: "stability", title: "Head stability across refits, beside its null baseline",
    kind: "stability" },
  { id: "stages", title: "Stages of inference — boundaries and their evidence", kind: "stages" },
  { id: "neurons", title: "Top prediction / suppression neurons per layer", kind: "neurons" },
];
const MAX_HEATMAPS = 4;
const MANY = 12;  // more curves than this in one panel: drawn lighter
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f"];

const state = {
  key: localStorage.getItem("strata.key") || "",
  models: [], byId: new Map(), runs: [], runIndex: new Map(), runsSignature: "",
  selected: [], xmode: "layer", stagesReady: Promise.resolve(), showErr: true, stageModel: null, stages: null,
  families: [], jobsAvailable: false, jobs: new Map(), ownJobs: new Set(), panels: new Map(), drawSeq: 0,
};
window.strata = { state, firstPlotAt: null };

/* ------------------------------------------------------------------ HTTP */

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.detail ? `${body.error}: ${body.detail}` : `HTTP ${status}`);
    this.status = status;
    this.body = body;
  }
}

const cache = new Map();
let active = 0;
const waiting = [];
const MAX_PARALLEL = 6;

async function slot(fn) {
  if (active >= MAX_PARALLEL) await new Promise((resolve) => waiting.push(resolve));
  active += 1;
  showStatus();
  try {
    return await fn();
  } finally {
    active -= 1;
    showStatus();
    const next = waiting.shift();
    if (next) next();
  }
}

function url(path, params = {}) {
  const query = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) {
    if (v !== null && v !== undefined && v !== "") query.set(k, v);
  }
  const q = query.toString();
  return q ? `${V1}${path}?${q}` : `${V1}${path}`;
}

async function request(method, target, body) {
  const headers = { Accept: "application/json" };
  if (state.key) headers["X-API-Key"] = state.key;
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const response = await fetch(target, {
    method, headers, body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await response.text();
  let parsed = null;
  try { parsed = text ? JSON.parse(text) : null; } catch (e) { parsed = { detail: text }; }
  if (!response.ok) throw new ApiError(response.status, parsed);
  return parsed;
}

/* A GET through the parallelism limit; `keep` caches it (answers pinned to a run). */
function get(target, keep = false) {
  if (keep && cache.has(target)) return cache.get(target);
  const promise = slot(() => request("GET", target));
  if (keep) {
    cache.set(target, promise);
    promise.catch(() => cache.delete(target));
  }
  return promise;
}

async function pages(path, params = {}) {
  const items = [];
  let offset = 0;
  for (;;) {
    const page = await get(url(path, { ...params, limit: 500, offset }));
    items.push(...page.items);
    if (page.next_offset === null || page.next_offset === undefined) return items;
    offset = page.next_offset;
  }
}

function showStatus(text) {
  const el = document.getElementById("status");
  if (text !== undefined) el.dataset.message = text;
  const message = el.dataset.message || "";
  el.textContent = active ? `loading (${active + waiting.length})… ${message}` : message;
}

/* ------------------------------------------------------------ models, runs */

function versionKey(v) {
  return /^\d+$/.test(v) ? v.padStart(12, "0") : v;
}

/* For each model and family, the run the API reads by default: its latest succeeded run under
 * the current metric version (the newest version among stored runs) computing the family. */
function indexRuns(runs) {
  const versions = runs.map((r) => r.metric_version);
  const current = versions.reduce((a, b) => (versionKey(b) > versionKey(a) ? b : a), "");
  const index = new Map();
  const order = [...runs].filter((r) => r.metric_version === current).sort((a, b) => {
    const fa = a.timings.finished_at || "", fb = b.timings.finished_at || "";
    return fa === fb ? a.id - b.id : (fa < fb ? -1 : 1);
  });
  for (const run of order) {  // later runs overwrite earlier ones
    if (!index.has(run.model_id)) index.set(run.model_id, {});
    for (const family of run.families) index.get(run.model_id)[family] = run.id;
  }
  return index;
}

function runFor(model, family) {
  const runs = state.runIndex.get(model.id);
  return runs ? runs[family] : undefined;
}

async function loadCatalog() {
  const [models, runs] = await Promise.all([pages("/models"), pages("/runs",
    { status: "succeeded" })]);
  state.models = models;
  state.byId = new Map(models.map((m) => [m.id, m]));
  state.runs = runs;
  state.runIndex = indexRuns(runs);
  state.runsSignature = `${runs.length}:${runs.length ? Math.max(...runs.map((r) => r.id)) : 0}`;
  state.selected = state.selected.filter((id) => state.byId.has(id));
  document.getElementById("model-count").textContent = `(${models.length})`;
  const names = document.getElementById("model-names");
  names.replaceChildren(...models.map((m) => el("option", { value: m.name })));
  renderModelList();
  renderSelection();
}

function modelColor(id) {
  const i = state.selected.indexOf(id);
  if (i < 0) return "#888";
  return i < PALETTE.length ? PALETTE[i] : `hsl(${(i * 137.5) % 360}, 60%, 45%)`;
}

/* ---------------------------------------------------------------- helpers */

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "—";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(2)
    : v.toPrecision(digits);
}

function evidenceText(evidence, depth = 0) {
  const lines = [];
  for (const [k, v] of Object.entries(evidence || {})) {
    if (v && typeof v === "object" && !Array.isArray(v)) {
      if (depth < 2) {  // nested evidence (signals: {drop_kl: {...}}) on one line each
        const inner = evidenceText(v, depth + 1).split("<br>");
        lines.push(depth === 0 ? `${k}: ${inner.join("; ")}` : `${k} (${inner.join(", ")})`);
      }
    } else if (Array.isArray(v)) {
      lines.push(`${k}: [${v.slice(0, 8).map((x) => fmt(x, 3)).join(", ")}${v.length > 8 ? ", …" : ""}]`);
    } else {
      lines.push(`${k}: ${fmt(v, 3)}`);
    }
  }
  return lines.join("<br>");
}

/* -------------------------------------------------------------- model list */

function renderModelList() {
  const terms = document.getElementById("model-search").value.toLowerCase().split(/\s+/)
    .filter(Boolean);
  const matches = state.models.filter((m) => {
    const text = `${m.name} ${m.source} ${m.architecture || ""} ${m.n_layers || ""}L ${m.id}`
      .toLowerCase();
    return terms.every((t) => text.includes(t));
  });
  const shown = matches.slice(0, 200);
  const list = document.getElementById("model-list");
  list.replaceChildren(...shown.map((m) => {
    const hasRuns = state.runIndex.has(m.id);
    const box = el("input", { type: "checkbox", checked: state.selected.includes(m.id) });
    box.addEventListener("change", () => toggleModel(m.id, box.checked));
    return el("li", { "data-model-id": m.id, "data-model-name": m.name, class: hasRuns ? "" : "no-runs" },
      el("label", {}, box, el("span", { class: "name", text: m.name }),
        el("span", { class: "meta", text: `${m.n_layers ?? "?"}L · ${m.source}${hasRuns ? "" : " · no results"}` })));
  }));
  document.getElementById("model-list-more").textContent = matches.length > shown.length
    ? `${matches.length - shown.length} more: refine the search` : "";
}

function toggleModel(id, on) {
  const i = state.selected.indexOf(id);
  if (on && i < 0) state.selected.push(id);
  if (!on && i >= 0) state.selected.splice(i, 1);
  renderSelection();
  renderModelList();
  selectionChanged();
}

function renderSelection() {
  const chips = state.selected.map((id) => {
    const m = state.byId.get(id);
    return el("span", { class: "chip", "data-model-id": id },
      el("i", { style: `background:${modelColor(id)}` }), m ? m.name : String(id),
      el("button", { type: "button", title: "remove", text: "×",
        onclick: () => toggleModel(id, false) }));
  });
  document.getElementById("selected-chips").replaceChildren(...chips);
  document.getElementById("selected-count").textContent = `${state.selected.length} selected`;
  document.getElementById("empty-hint").hidden = state.selected.length > 0;
  const stageSelect = document.getElementById("stage-model");
  const keep = state.stageModel;
  stageSelect.replaceChildren(el("option", { value: "", text: "(none)" }),
    ...state.selected.map((id) => el("option", { value: id, text: state.byId.get(id)?.name ?? id })));
  if (keep !== null && state.selected.includes(keep)) stageSelect.value = String(keep);
  else {
    state.stageModel = state.selected.length ? state.selected[0] : null;
    stageSelect.value = state.stageModel === null ? "" : String(state.stageModel);
  }
  writeHash();
}

function writeHash() {
  if (!state.hashRead) return;  // the hash still says what to select on load
  const names = state.selected.map((id) => state.byId.get(id)?.name ?? id);
  const hash = `#models=${names.map(encodeURIComponent).join(",")}&x=${state.xmode}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

function readHash() {
  state.hashRead = true;
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("x") === "depth") state.xmode = "depth";
  const wanted = (params.get("models") || "").split(",").filter(Boolean).map(decodeURIComponent);
  const byName = new Map(state.models.map((m) => [m.name, m.id]));
  state.selected = wanted.map((w) => byName.get(w) ?? (state.byId.has(Number(w)) ? Number(w) : null))
    .filter((id) => id !== null);
}

/* ------------------------------------------------------------------ stages */

/* One panel's Plotly call at a time, with a frame between them: the first panel to have its
 * data is painted at once instead of after every panel in view has been drawn. */
let renderChain = Promise.resolve();
function render(fn) {
  const done = renderChain.then(fn);
  renderChain = done.catch(() => {}).then(() => new Promise((resolve) => {
    requestAnimationFrame(() => setTimeout(resolve, 0));
  }));
  return done;
}

/* plotly.js loads after this script (see index.html); drawing waits for it. */
const plotlyReady = new Promise((resolve) => {
  if (window.Plotly) resolve();
  else document.getElementById("plotly-script").addEventListener("load", () => resolve());
});

async function loadStages() {
  const ids = state.selected.filter((id) => runFor(state.byId.get(id), "intervention"));
  if (!ids.length) { state.stages = null; return; }
  const target = url("/stages", { models: ids.join(",") });
  const answer = await get(target).catch(() => null);
  if (answer === null) { state.stages = null; return; }
  state.stages = { target, byModel: new Map(answer.models.map((m) => [m.id, m])), rows: answer.rows };
}

/* x of the edge before block b: blocks sit at integers (layer) or l/(L-1) (depth);
 * logit-lens points i = output of block i-1, at i or i/L. */
function edgeX(b, L, lens) {
  const x = lens ? b + 0.5 : b - 0.5;
  if (state.xmode === "layer") return x;
  const denom = lens ? L : Math.max(L - 1, 1);
  return x / denom;
}

function stageOverlay(lens, yref) {
  const shapes = [], traces = [], annotations = [];
  if (!state.stages) return { shapes, traces, annotations };
  const fills = ["rgba(31,119,180,0.07)", "rgba(44,160,44,0.07)", "rgba(255,127,14,0.07)",
    "rgba(148,103,189,0.07)"];
  const ref = state.stageModel;
  for (const row of state.stages.rows) {
    if (row.model_id !== ref || !row.clear || row.layer_start === null) continue;
    const L = state.byId.get(ref)?.n_layers || 1;
    const lo = row.layer_start === 0 ? edgeX(lens ? -1 : 0, L, lens) : edgeX(row.layer_start, L, lens);
    const hi = edgeX(row.layer_end + 1, L, lens);
    shapes.push({ type: "rect", xref: "x", yref: "paper", x0: lo, x1: hi, y0: 0, y1: 1,
      fillcolor: fills[(row.stage - 1) % 4], line: { width: 0 }, layer: "below", name: "stage" });
    annotations.push({ x: (lo + hi) / 2, xref: "x", y: 1, yref: "paper", yanchor: "bottom",
      text: `stage ${row.stage}`, hovertext: `${row.stage_name}: blocks ${row.layer_start}` +
        `–${row.layer_end} of ${state.byId.get(ref)?.name}`, showarrow: false,
      font: { size: 9, color: "#777" } });
  }
  // boundary lines of every selected model, unless there are too many to tell apart
  for (const id of state.selected.length > MANY ? [] : state.selected) {
    const stages = state.stages.byModel.get(id);
    if (!stages) continue;
    const L = state.byId.get(id)?.n_layers || 1;
    for (const b of stages.boundaries) {
      if (!b.found || b.layer === null) continue;
      const x = edgeX(b.layer, L, lens);
      // the boundary as a range: its bootstrap interval over sequences, else its signals' range
      const span = b.interval || b.range;
      if (span) {
        shapes.push({ type: "rect", xref: "x", yref: "paper", x0: edgeX(span[0] - 0.15, L, lens),
          x1: edgeX(span[1] + 0.15, L, lens), y0: 0, y1: 1, fillcolor: modelColor(id),
          opacity: 0.13, line: { width: 0 }, layer: "below", name: `boundary-${b.boundary}` });
      }
      const ys = Array.from({ length: 21 }, (_, i) => i / 20);
      const where = b.interval ? `${Math.round((b.interval_level || 0.9) * 100)}% interval over ` +
        `sequences: blocks ${b.interval[0]}–${b.interval[1]}` : "no interval (no per-sequence means)";
      const text = `<b>${stages.name}: boundary ${b.boundary}</b> (end of ${b.ends_stage})` +
        `<br>first block of the next stage: ${b.layer} (depth ${fmt(b.relative_depth, 3)})` +
        `<br>${where}; sharpness ${fmt(b.sharpness, 3)}` +
        `<br>rule: ${b.rule}<br>${evidenceText(b.evidence)}`;
      traces.push({ x: ys.map(() => x), y: ys, yaxis: yref, mode: "lines", showlegend: false,
        line: { color: modelColor(id), dash: "dot", width: 1 }, hoverinfo: "text",
        text: ys.map(() => text), hoverlabel: { align: "left" }, meta: "boundary",
        name: `${stages.name} boundary ${b.boundary}` });
    }
  }
  return { shapes, traces, annotations };
}

/* ------------------------------------------------------------------ panels */

function optionList(values, current) {
  return values.map((v) => el("option", { value: v, text: v, selected: v === current }));
}

function buildPanel(def) {
  const plot = el("div", { class: "plot" });
  const controls = el("span", { class: "panel-controls" });
  const panel = { def, metric: def.metric, component: def.component ?? null, plot,
    visible: false, dirty: true, section: null, seq: 0, extra: {} };
  if (def.metrics) {
    const select = el("select", { class: "metric", "aria-label": "metric" }, ...optionList(def.metrics, def.metric));
    select.addEventListener("change", () => { panel.metric = select.value; redraw(panel); });
    controls.append(select);
  }
  if (def.components) {
    const select = el("select", { class: "component", "aria-label": "component" },
      ...optionList(def.components, def.component));
    select.addEventListener("change", () => { panel.component = select.value; redraw(panel); });
    controls.append(select);
  }
  const links = el("div", { class: "links" });
  const exports = el("span", { class: "exports" });
  if (def.kind !== "stages" && def.kind !== "neurons") {
    exports.append(
      el("button", { type: "button", "data-export": "png", text: "PNG",
        onclick: () => exportPlot(panel, "png") }),
      el("button", { type: "button", "data-export": "svg", text: "SVG",
        onclick: () => exportPlot(panel, "svg") }));
  }
  exports.append(el("details", { class: "data" }, el("summary", { text: "data" }), links));
  const note = el("p", { class: "note" });
  const body = def.kind === "stages" || def.kind === "neurons" ? el("div", { class: "table-wrap" }) : plot;
  const section = el("section", { class: `panel panel-${def.kind}`, "data-panel": def.id,
    "data-state": "empty", "data-seq": "0" },
  el("header", {}, el("h3", { text: def.title }), controls, exports), body, note);
  panel.section = section;
  panel.links = links;
  panel.note = note;
  panel.body = body;
  if (def.kind === "neurons") buildNeuronControls(panel, controls);
  if (def.kind === "stability") buildStabilityControls(panel, controls);
  return panel;
}

function setLinks(panel, entries) {
  panel.links.replaceChildren(...entries.map(([label, target]) => el("div", {},
    el("span", { text: `${label}: ` }),
    ...["csv", "parquet", "json"].map((f) => {
      const sep = target.includes("?") ? "&" : "?";
      return el("a", { href: `${target}${sep}format=${f}`, download: "", "data-format": f,
        text: f.toUpperCase(), onclick: keyedDownload });
    }))));
}

/* With a key saved, downloads go through fetch so they carry it (reads may be private); without
 * one the link is followed as it is. */
async function keyedDownload(event) {
  if (!state.key) return;
  event.preventDefault();
  const link = event.currentTarget;
  const response = await fetch(link.href, { headers: { "X-API-Key": state.key } });
  if (!response.ok) {
    showStatus(`download failed: HTTP ${response.status}`);
    return;
  }
  const blob = URL.createObjectURL(await response.blob());
  const format = link.dataset.format;
  const a = el("a", { href: blob, download: `strata.${format === "json" ? "json" : format}` });
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(blob), 1000);
}

function exportPlot(panel, format) {
  if (!panel.plot.data) return;
  const name = `strata-${panel.def.id}-${panel.metric || "plot"}`.replace(/[^A-Za-z0-9._-]/g, "_");
  Plotly.downloadImage(panel.plot, { format, filename: name, width: 1000, height: 500 });
}

function baseLayout(ytitle, extra = {}) {
  const depth = state.xmode === "depth";
  return {
    margin: { l: 60, r: 30, t: 20, b: 40 }, height: 300, hovermode: "closest",
    modebar: { orientation: "v" },
    xaxis: { title: { text: depth ? "relative depth" : "layer" }, zeroline: false,
      ...(depth ? { range: [-0.04, 1.04] } : { dtick: layerStep() }) },
    yaxis: { title: { text: ytitle }, zeroline: false },
    yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
    legend: { orientation: "h", x: 0, y: -0.22, yanchor: "top" }, showlegend: true,
    ...extra,
  };
}

/* Integer layer ticks, about a dozen of them at most. */
function layerStep() {
  const deepest = Math.max(1, ...state.selected.map((id) => state.byId.get(id)?.n_layers || 1));
  return Math.max(1, Math.ceil(deepest / 12));
}

const PLOT_CONFIG = { displaylogo: false, responsive: true,
  modeBarButtonsToRemove: ["select2d", "lasso2d"] };

function finish(panel, stateName, note = "") {
  panel.note.textContent = note;
  panel.seq = ++state.drawSeq;
  panel.section.dataset.state = stateName;
  panel.section.dataset.seq = String(panel.seq);
  panel.section.dataset.drawnAt = String(performance.now());
  if (stateName === "drawn" && window.strata.firstPlotAt === null) {
    window.strata.firstPlotAt = performance.now();
    performance.mark("strata:first-plot");
  }
}

function familyOf(metric) { return metric.split(".")[0]; }

async function drawLine(panel) {
  const ticket = panel.ticket;
  const began = performance.now();
  const family = familyOf(panel.metric);
  const models = state.selected.map((id) => state.byId.get(id)).filter(Boolean);
  const have = models.filter((m) => runFor(m, family) !== undefined);
  const missing = models.filter((m) => runFor(m, family) === undefined).map((m) => m.name);
  const targets = have.map((m) => url(`/models/${m.id}/metrics`, { metric: panel.metric,
    component: panel.def.components ? panel.component : null, run_id: runFor(m, family) }));
  const [answers] = await Promise.all([Promise.all(targets.map((t) => get(t, true))),
    state.stagesReady, plotlyReady]);
  if (ticket !== panel.ticket) return;
  const fetched = performance.now();
  const many = have.length > MANY;  // many curves: thin lines, no markers, bars on request
  const traces = [];
  let unit = "";
  answers.forEach((answer, i) => {
    const m = have[i];
    // what the error bars count: sequences (metric version 2 on) or tokens (version 1)
    const per = answer.run && answer.run.stderr_basis === "token" ? "tokens" : "sequences";
    const groups = new Map();
    for (const r of answer.rows) {
      if (r.layer === null) continue;  // the unintervened baseline row
      const key = r.component || "";
      if (!groups.has(key)) groups.set(key, []);
      groups.get(key).push(r);
      unit = r.unit;
    }
    for (const [component, rows] of groups) {
      rows.sort((a, b) => a.layer - b.layer);
      const hasErr = rows.some((r) => r.stderr !== null);
      traces.push({
        type: "scatter", mode: many ? "lines" : "lines+markers", name: component && !panel.def.components
          ? `${m.name} · ${component}` : m.name,
        x: rows.map((r) => (state.xmode === "depth" ? r.relative_depth : r.layer)),
        y: rows.map((r) => r.value),
        customdata: rows.map((r) => [r.layer, r.relative_depth, r.stderr, r.n]),
        hovertemplate: `<b>${m.name}</b><br>layer %{customdata[0]} · depth %{customdata[1]:.3f}` +
          `<br>%{y:.4g} ± %{customdata[2]:.2g} ${r0unit(rows)}<br>n = %{customdata[3]} ${per}` +
          "<extra></extra>",
        error_y: { type: "data", array: rows.map((r) => r.stderr ?? 0),
          visible: state.showErr && hasErr && !many, thickness: 1, width: 2 },
        line: { color: modelColor(m.id), width: many ? 1 : 1.5,
          dash: component === "mlp" ? "dash" : "solid" },
        marker: { size: 4, color: modelColor(m.id) }, meta: m.name,
      });
    }
  });
  const overlay = stageOverlay(Boolean(panel.def.lens), "y2");
  await render(() => Plotly.react(panel.plot, [...traces, ...overlay.traces],
    baseLayout(`${panel.metric}${unit ? ` (${unit})` : ""}`, { shapes: overlay.shapes,
      annotations: overlay.annotations, showlegend: !many }), PLOT_CONFIG));
  setLinks(panel, have.map((m, i) => [m.name, targets[i]]));
  window.strata.lastDraw = { panel: panel.def.id, models: have.length,
    fetch_ms: fetched - began, render_ms: performance.now() - fetched };
  const notes = [];
  if (missing.length) notes.push(`no ${family} results for: ${missing.join(", ")}`);
  if (many) {
    notes.push(`${have.length} models: colours as in the selection, names on hover; no error ` +
      `bars or boundary lines above ${MANY} models`);
  }
  finish(panel, traces.length ? "drawn" : "empty", notes.join("; "));
}

function r0unit(rows) { return rows.length ? rows[0].unit : ""; }

async function drawHeatmap(panel) {
  const ticket = panel.ticket;
  const family = familyOf(panel.metric);
  const models = state.selected.map((id) => state.byId.get(id))
    .filter((m) => m && runFor(m, family) !== undefined);
  const shown = models.slice(0, MAX_HEATMAPS);
  const targets = shown.map((m) => url(`/models/${m.id}/heads`, { metric: panel.metric,
    run_id: runFor(m, family) }));
  const [answers] = await Promise.all([Promise.all(targets.map((t) => get(t, true))),
    plotlyReady]);
  if (ticket !== panel.ticket) return;
  let lo = Infinity, hi = -Infinity, unit = "";
  for (const a of answers) for (const r of a.rows) { lo = Math.min(lo, r.value); hi = Math.max(hi, r.value); unit = r.unit; }
  const traces = answers.map((answer, i) => {
    const m = shown[i];
    const layers = [...new Set(answer.rows.map((r) => r.layer))].sort((a, b) => a - b);
    const heads = [...new Set(answer.rows.map((r) => r.head))].sort((a, b) => a - b);
    const z = layers.map(() => heads.map(() => null));
    const depth = new Map();
    for (const r of answer.rows) {
      z[layers.indexOf(r.layer)][heads.indexOf(r.head)] = r.value;
      depth.set(r.layer, r.relative_depth);
    }
    const axis = i === 0 ? "" : String(i + 1);
    return { type: "heatmap", z, x: heads,
      y: state.xmode === "depth" ? layers.map((l) => depth.get(l)) : layers,
      xaxis: `x${axis}`, yaxis: `y${axis}`, zmin: lo, zmax: hi, colorscale: "Viridis",
      showscale: i === shown.length - 1, name: m.name, meta: m.name,
      colorbar: { title: { text: unit } },
      hovertemplate: `<b>${m.name}</b><br>layer %{y} head %{x}<br>%{z:.4g} ${unit}<extra></extra>` };
  });
  const layout = { margin: { l: 60, r: 20, t: 30, b: 40 }, height: 320,
    grid: { rows: 1, columns: Math.max(traces.length, 1), pattern: "independent" },
    annotations: shown.map((m, i) => ({ text: m.name, showarrow: false, xref: `x${i ? i + 1 : ""} domain`,
      yref: `y${i ? i + 1 : ""} domain`, x: 0.5, y: 1.08, font: { size: 11 } })) };
  shown.forEach((m, i) => {
    const s = i ? String(i + 1) : "";
    layout[`xaxis${s}`] = { title: { text: "head" }, dtick: 1 };
    layout[`yaxis${s}`] = { title: { text: i === 0 ? (state.xmode === "depth" ? "relative depth" : "layer") : "" },
      ...(state.xmode === "layer" ? { dtick: 1 } : {}) };
  });
  await render(() => Plotly.react(panel.plot, traces, layout, PLOT_CONFIG));
  setLinks(panel, shown.map((m, i) => [m.name, targets[i]]));
  const notes = [];
  if (models.length > shown.length) notes.push(`showing the first ${MAX_HEATMAPS} of ${models.length} models`);
  const missing = state.selected.filter((id) => !models.some((m) => m.id === id))
    .map((id) => state.byId.get(id)?.name ?? id);
  if (missing.length) notes.push(`no ${family} results for: ${missing.join(", ")}`);
  finish(panel, traces.length ? "drawn" : "empty", notes.join("; "));
}

/* ---------------------------------------------------------------- stability */

function buildStabilityControls(panel, controls) {
  const select = el("select", { class: "family", "aria-label": "refit family" });
  select.addEventListener("change", () => { panel.extra.family = select.value; redraw(panel); });
  panel.extra.select = select;
  controls.append(select);
}

function fillFamilies(panel) {
  const select = panel.extra.select;
  const names = state.families.map((f) => f.name);
  if (!names.includes(panel.extra.family)) {
    const picked = state.families.find((f) => f.members.some((m) => state.selected.includes(m.id))
      || state.selected.includes(f.anchor.id));
    panel.extra.family = picked ? picked.name : names[0];
  }
  select.replaceChildren(...optionList(names, panel.extra.family));
}

async function drawStability(panel) {
  const ticket = panel.ticket;
  await plotlyReady;
  fillFamilies(panel);
  const family = panel.extra.family;
  if (!family) {
    await render(() => Plotly.react(panel.plot, [], baseLayout("cosine"), PLOT_CONFIG));
    setLinks(panel, []);
    finish(panel, "empty", "no refit families stored (strata stability --store)");
    return;
  }
  const target = url(`/families/${encodeURIComponent(family)}/stability`);
  const answer = await get(target, true);
  if (ticket !== panel.ticket) return;
  const by = (metric) => answer.rows.filter((r) => r.metric === metric && r.head === null)
    .sort((a, b) => a.layer - b.layer);
  const x = (rows) => rows.map((r) => (state.xmode === "depth" ? r.relative_depth : r.layer));
  const series = [["heads.stability", "heads.stability_std", "trained refits", "#1f77b4", "solid"],
    ["heads.stability_null", "heads.stability_null_std", "null baseline (random init)", "#7f7f7f", "dash"],
    ["heads.residual_cka.linear", null, "residual CKA (linear)", "#2ca02c", "dot"],
    ["heads.residual_cka.rbf", null, "residual CKA (RBF)", "#ff7f0e", "dot"]];
  const traces = [];
  for (const [metric, spread, name, color, dash] of series) {
    const rows = by(metric);
    if (!rows.length) continue;
    const std = spread ? new Map(by(spread).map((r) => [r.layer, r.value])) : new Map();
    traces.push({ type: "scatter", mode: "lines+markers", name, x: x(rows), y: rows.map((r) => r.value),
      error_y: { type: "data", array: rows.map((r) => std.get(r.layer) ?? 0),
        visible: state.showErr && std.size > 0, thickness: 1, width: 2 },
      customdata: rows.map((r) => [r.layer, std.get(r.layer) ?? null]),
      hovertemplate: `<b>${name}</b><br>layer %{customdata[0]}<br>%{y:.4f} (± %{customdata[1]:.3f} std over heads)<extra></extra>`,
      line: { color, dash }, marker: { color, size: 5 }, meta: metric });
  }
  await render(() => Plotly.react(panel.plot, traces, baseLayout("cosine / CKA"), PLOT_CONFIG));
  setLinks(panel, [[family, target]]);
  finish(panel, traces.length ? "drawn" : "empty",
    `family ${family}: anchor ${answer.family.anchor.name}, ${answer.family.members.length} members; ` +
    "error bars: std over heads");
}

/* ------------------------------------------------------------------ stages */

async function drawStagesTable(panel) {
  const ticket = panel.ticket;
  await state.stagesReady;
  if (ticket !== panel.ticket) return;
  if (!state.stages) {
    panel.body.replaceChildren();
    setLinks(panel, []);
    finish(panel, "empty", state.selected.length ? "no stage boundaries for the selected models" : "");
    return;
  }
  const head = el("tr", {}, ...["model", "boundary", "ends stage", "found", "first block after",
    "relative depth", "rule", "evidence", "interval", "sharpness"].map((h) => el("th", { text: h })));
  const rows = [];
  for (const id of state.selected) {
    const m = state.stages.byModel.get(id);
    if (!m) continue;
    for (const b of m.boundaries) {
      const evidence = el("td", { class: "evidence" });
      evidence.innerHTML = evidenceText(b.evidence);
      rows.push(el("tr", {}, el("td", {}, el("i", { class: "swatch", style: `background:${modelColor(id)}` }), m.name),
        el("td", { text: b.boundary }), el("td", { text: b.ends_stage }),
        el("td", { text: b.found ? "yes" : "no" }), el("td", { text: fmt(b.layer) }),
        el("td", { text: fmt(b.relative_depth, 3) }), el("td", { text: b.rule }), evidence,
        el("td", { text: b.interval ? `${b.interval[0]}–${b.interval[1]}` : "—" }),
        el("td", { text: fmt(b.sharpness, 3) })));
    }
  }
  panel.body.replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
  setLinks(panel, [["stages", state.stages.target]]);
  finish(panel, rows.length ? "drawn" : "empty");
}

/* ----------------------------------------------------------------- neurons */

function buildNeuronControls(panel, controls) {
  const model = el("select", { class: "neuron-model", "aria-label": "model" });
  const cls = el("select", { class: "neuron-class", "aria-label": "class" },
    el("option", { value: "prediction,suppression", text: "prediction + suppression",
      selected: true }),
    ...optionList(["prediction", "suppression", "partition"], null));
  const layer = el("select", { class: "neuron-layer", "aria-label": "layer" });
  const top = el("select", { class: "neuron-top", "aria-label": "top" }, ...optionList(["5", "10", "20"], "10"));
  for (const s of [model, cls, layer, top]) {
    s.addEventListener("change", () => {
      if (s === model) panel.extra.layer = null;
      redraw(panel);
    });
  }
  Object.assign(panel.extra, { model, cls, layer, top });
  controls.append(model, cls, layer, top);
}

async function drawNeurons(panel) {
  const ticket = panel.ticket;
  const { model, cls, layer, top } = panel.extra;
  const candidates = state.selected.map((id) => state.byId.get(id))
    .filter((m) => m && runFor(m, "neurons") !== undefined);
  const current = Number(model.value);
  model.replaceChildren(...candidates.map((m) => el("option", { value: m.id, text: m.name })));
  const m = candidates.find((c) => c.id === current) || candidates[0];
  if (!m) {
    panel.body.replaceChildren();
    setLinks(panel, []);
    finish(panel, "empty", state.selected.length ? "no neuron results for the selected models" : "");
    return;
  }
  model.value = String(m.id);
  const L = m.n_layers || 1;
  const currentLayer = layer.value === "" ? Math.max(L - 1, 0) : Math.min(Number(layer.value), L - 1);
  layer.replaceChildren(...Array.from({ length: L }, (_, i) => el("option", { value: i, text: `layer ${i}` })));
  layer.value = String(currentLayer);
  const classes = cls.value.split(",");
  const targets = classes.map((c) => url(`/models/${m.id}/neurons`, { class: c,
    layer: currentLayer, top: top.value, run_id: runFor(m, "neurons") }));
  const answers = await Promise.all(targets.map((t) => get(t, true)));
  if (ticket !== panel.ticket) return;
  const head = el("tr", {}, ...["class", "layer", "neuron", "kurtosis", "skew", "variance",
    "promoted tokens", "suppressed tokens"].map((h) => el("th", { text: h })));
  // each token boxed, spaces shown as ␣ and control characters escaped, so " The" ≠ "The"
  const tokens = (list) => el("span", {}, ...(list || []).map((t) => el("span",
    { class: "tok", text: JSON.stringify(t).slice(1, -1).replace(/ /g, "␣") })));
  const rows = answers.flatMap((answer, i) => answer.rows.map((r) => el("tr",
    { "data-class": classes[i] }, el("td", { text: classes[i] }), el("td", { text: r.layer }),
    el("td", { text: r.neuron }), el("td", { text: fmt(r.vocab_kurt) }),
    el("td", { text: fmt(r.vocab_skew) }), el("td", { text: fmt(r.vocab_var) }),
    el("td", { class: "tokens" }, tokens(r.promoted)),
    el("td", { class: "tokens" }, tokens(r.suppressed)))));
  panel.body.replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
  setLinks(panel, classes.map((c, i) => [`${m.name} layer ${currentLayer} ${c}`, targets[i]]));
  const empty = classes.filter((c, i) => answers[i].rows.length === 0);
  finish(panel, "drawn", empty.length
    ? `no ${empty.join(" or ")} neurons in layer ${currentLayer} of ${m.name}` : "");
}

/* ------------------------------------------------------------- scheduling */

const DRAW = { line: drawLine, heatmap: drawHeatmap, stability: drawStability,
  stages: drawStagesTable, neurons: drawNeurons };

async function redraw(panel) {
  panel.dirty = true;
  if (!panel.visible) return;
  panel.dirty = false;
  panel.section.dataset.state = "loading";
  const ticket = (panel.ticket = (panel.ticket || 0) + 1);
  try {
    if (state.selected.length === 0 && panel.def.kind !== "stability") {
      if (panel.plot.data) window.Plotly.purge(panel.plot);
      if (panel.def.kind === "stages" || panel.def.kind === "neurons") panel.body.replaceChildren();
      setLinks(panel, []);
      finish(panel, "empty");
      return;
    }
    await DRAW[panel.def.kind](panel);
  } catch (error) {
    if (ticket !== panel.ticket) return;
    panel.section.dataset.state = "error";
    panel.note.textContent = `could not draw: ${error.message}`;
  }
}

function redrawAll() {
  for (const panel of state.panels.values()) redraw(panel);
}

/* Stages are read beside the panels' data (each panel awaits both), not before it. */
async function selectionChanged() {
  state.stagesReady = loadStages();
  redrawAll();
  await state.stagesReady;
}

function buildPanels() {
  const container = document.getElementById("panels");
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const panel = state.panels.get(entry.target.dataset.panel);
      panel.visible = entry.isIntersecting;
      if (panel.visible && panel.dirty) redraw(panel);
    }
  }, { rootMargin: "300px 0px" });
  for (const def of PANELS) {
    const panel = buildPanel(def);
    state.panels.set(def.id, panel);
    container.append(panel.section);
    observer.observe(panel.section);
  }
}

/* -------------------------------------------------------------- writes, jobs */

function wireKey() {
  const input = document.getElementById("api-key");
  input.value = state.key;
  const show = () => {
    document.getElementById("key-state").textContent = state.key ? "a key is saved in this browser" : "no key saved";
  };
  document.getElementById("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.key = input.value.trim();
    if (state.key) localStorage.setItem("strata.key", state.key);
    else localStorage.removeItem("strata.key");
    show();
  });
  show();
}

function wireRegister() {
  document.getElementById("register-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = document.getElementById("register-result");
    const body = { name: document.getElementById("register-name").value.trim(),
      source: document.getElementById("register-source").value.trim() };
    out.textContent = "registering…";
    try {
      const model = await request("POST", url("/models"), body);
      out.textContent = `registered ${model.name} (id ${model.id}, ${model.n_layers ?? "?"} layers)`;
      out.dataset.state = "ok";
      await loadCatalog();
    } catch (error) {
      out.textContent = error.message;
      out.dataset.state = "error";
    }
  });
}

function wireJobs() {
  document.getElementById("job-families").replaceChildren(...FAMILIES.map((f) =>
    el("label", {}, el("input", { type: "checkbox", value: f, checked: true }), f)));
  document.getElementById("job-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const out = document.getElementById("job-result");
    const metrics = [...document.querySelectorAll("#job-families input:checked")].map((i) => i.value);
    const body = { model: document.getElementById("job-model").value.trim(),
      metrics, n_sequences: Number(document.getElementById("job-nseq").value),
      seq_len: Number(document.getElementById("job-seqlen").value),
      force: document.getElementById("job-force").checked };
    out.textContent = "submitting…";
    try {
      const job = await request("POST", url("/jobs"), body);
      out.textContent = `job ${job.id} ${job.state}`;
      out.dataset.state = "ok";
      state.ownJobs.add(job.id);
      trackJob(job);
    } catch (error) {
      out.textContent = error.message;
      out.dataset.state = "error";
    }
  });
}

const ACTIVE = new Set(["queued", "running"]);
const JOB_POLL_MS = 500;

function renderJob(job) {
  let item = document.getElementById(`job-${job.id}`);
  if (!item) {
    item = el("li", { id: `job-${job.id}`, class: "job" });
    document.getElementById("jobs").prepend(item);
  }
  const p = job.progress;
  const bar = el("progress", { max: 1, value: p ? p.fraction : (job.state === "succeeded" ? 1 : 0) });
  const detail = p ? `${p.done}/${p.total} · ${Math.round(100 * p.fraction)}%` +
    `${p.tokens_per_s ? ` · ${fmt(p.tokens_per_s, 3)} tok/s` : ""}` +
    `${p.eta_s !== null && p.eta_s !== undefined && ACTIVE.has(job.state) ? ` · ETA ${Math.round(p.eta_s)} s` : ""}` : "";
  if (state.ownJobs.has(job.id)) {
    document.getElementById("job-result").textContent = `job ${job.id} ${job.state}`;
  }
  item.dataset.jobId = job.id;
  if (state.ownJobs.has(job.id)) item.dataset.own = "true";
  item.dataset.state = job.state;
  item.dataset.runId = job.run_id ?? "";
  const cancel = ACTIVE.has(job.state) ? el("button", { type: "button", class: "cancel",
    text: "cancel", title: "cancel this job (API key)", onclick: () => cancelJob(job.id) }) : null;
  item.replaceChildren(el("div", {}, el("b", { text: `#${job.id} ${job.model}` }), " ",
    el("span", { class: `job-state ${job.state}`, text: job.state }), " ", cancel), bar,
  el("div", { class: "muted", text: job.error ? job.error : (job.state === "succeeded"
    ? `run ${job.run_id}${job.wall_s ? ` · ${fmt(job.wall_s, 3)} s` : ""}` : detail) }));
}

async function cancelJob(id) {
  const out = document.getElementById("job-result");
  try {
    const job = await request("DELETE", url(`/jobs/${id}`));
    state.jobs.set(id, job);
    renderJob(job);
    out.textContent = `job ${id} ${job.state}`;
    out.dataset.state = "ok";
  } catch (error) {
    out.textContent = error.message;
    out.dataset.state = "error";
  }
}

function trackJob(job) {
  state.jobs.set(job.id, job);
  renderJob(job);
  if (ACTIVE.has(job.state)) pollJob(job.id);
}

async function pollJob(id) {
  for (;;) {
    await new Promise((resolve) => setTimeout(resolve, JOB_POLL_MS));
    let job;
    try {
      job = await request("GET", url(`/jobs/${id}`));
    } catch (error) {
      continue;  // the service restarting: keep polling
    }
    const before = state.jobs.get(id);
    state.jobs.set(id, job);
    renderJob(job);
    if (!ACTIVE.has(job.state)) {
      if (job.state === "succeeded" && before?.state !== "succeeded") await resultsArrived(job);
      return;
    }
  }
}

/* New results: reread models and runs; the model of a job submitted here joins the selection;
 * panels redraw from the new run ids (cached answers of older runs stay valid). */
async function resultsArrived(job) {
  await loadCatalog();
  if (job && state.ownJobs.has(job.id) && state.byId.has(job.model_id)
      && !state.selected.includes(job.model_id)) {
    state.selected.push(job.model_id);
    renderSelection();
    renderModelList();
  }
  await selectionChanged();
}

async function detectJobs() {
  try {
    const schema = await request("GET", "/schema/openapi.json");
    state.jobsAvailable = Boolean(schema.paths && schema.paths[`${V1}/jobs`]);
  } catch (error) {
    state.jobsAvailable = false;
  }
  document.getElementById("jobs-box").dataset.available = String(state.jobsAvailable);
  document.getElementById("job-submit").disabled = !state.jobsAvailable;
  if (!state.jobsAvailable) {
    document.getElementById("job-result").textContent = "this service has no jobs endpoint";
    return;
  }
  const page = await request("GET", url("/jobs", { limit: 10 })).catch(() => null);
  if (page) for (const job of [...page.items].reverse()) trackJob(job);
}

/* Results delivered by others (CLI ingest, other users' jobs): checked every 10 s. */
function watchRuns() {
  setInterval(async () => {
    try {
      const page = await request("GET", url("/runs", { status: "succeeded", limit: 1 }));
      const latest = page.items.length ? page.items[0].id : 0;
      const known = state.runs.length ? Math.max(...state.runs.map((r) => r.id)) : 0;
      if (page.total !== state.runs.length || latest !== known) await resultsArrived(null);
    } catch (error) { /* next time */ }
  }, 10000);
}

/* -------------------------------------------------------------------- start */

async function start() {
  performance.mark("strata:start");
  wireKey();
  wireRegister();
  wireJobs();
  buildPanels();
  document.getElementById("model-search").addEventListener("input", renderModelList);
  document.getElementById("clear-selection").addEventListener("click", () => {
    state.selected = [];
    renderSelection();
    renderModelList();
    selectionChanged();
  });
  for (const radio of document.querySelectorAll("input[name=xmode]")) {
    radio.addEventListener("change", () => {
      state.xmode = radio.value;
      writeHash();
      redrawAll();
    });
  }
  document.getElementById("show-err").addEventListener("change", (event) => {
    state.showErr = event.target.checked;
    redrawAll();
  });
  document.getElementById("stage-model").addEventListener("change", (event) => {
    state.stageModel = event.target.value === "" ? null : Number(event.target.value);
    redrawAll();
  });
  try {
    await loadCatalog();
  } catch (error) {
    showStatus(`could not read the models: ${error.message}`);
    return;
  }
  performance.mark("strata:catalog");
  readHash();
  document.getElementById(state.xmode === "depth" ? "x-depth" : "x-layer").checked = true;
  renderSelection();
  renderModelList();
  get(url("/families")).then((families) => {
    state.families = families;
    redraw(state.panels.get("stability"));
  }).catch(() => {});
  await selectionChanged();
  detectJobs();
  watchRuns();
  document.body.dataset.ready = "true";
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
