/* The panels, in page order: each one's frame (title, metric and component pickers, PNG/SVG
 * export, data links), and when each is drawn. A panel draws when it scrolls into view and is
 * marked dirty otherwise; what it draws comes from plots.js (figures) or tables.js (tables).
 *
 * Each section carries data-state (empty, loading, drawn, error) and data-seq (the page-wide
 * draw number of its last draw), which the tests and benchmarks wait on.
 */

import { get, showStatus, url } from "./api.js";
import { el, optionList } from "./dom.js";
import { buildStabilityControls, clearPlot, drawHeatmap, drawLine, drawStability,
  drawStabilityImportance, exportPlot }
  from "./plots.js";
import * as state from "./state.js";
import { buildNeuronControls, buildPruningControls, drawNeurons, drawPruningPlan,
  drawStagesTable } from "./tables.js";

const KINDS = ["drop", "swap", "drop_attn", "drop_mlp"];
const INTERVENTION = ["intervention.kl", "intervention.top1_agreement",
  "intervention.entropy_delta", "intervention.entropy", "intervention.loss_delta",
  "intervention.loss", "intervention.accuracy"];
const LENS = ["logit_lens.kl_to_final", "logit_lens.entropy", "logit_lens.top1_agreement",
  "logit_lens.loss"];
const TUNED = LENS.map((m) => m.replace("logit_lens.", "tuned_lens."));
/* The neuron classes: the width-calibrated ones first (docs/metrics.md's default), then the
 * study's fixed cut-offs, kept selectable and labelled as such. */
const NEURON_COUNTS = [
  ...["n", "frac"].flatMap((m) => ["prediction", "suppression", "partition"].map((c) =>
    [`neurons.${m}_${c}_cal`, `neurons.${m}_${c}_cal (calibrated to width)`])),
  ...["n", "frac"].flatMap((m) => ["prediction", "suppression", "partition"].map((c) =>
    [`neurons.${m}_${c}`, `neurons.${m}_${c} (the study's fixed cut-offs)`])),
];
const PREV = [1, 2, 4, 5, 8, 16].flatMap((k) => [`attention.prev_${k}`,
  `attention.prev_${k}_mean`]);
const PER_HEAD = ["heads.ablation_kl", "heads.ablation_loss_delta", "heads.induction",
  "heads_atp.loss_delta", "attention.prev_1", "attention.bos", "attention.entropy"];
/* The head screen beside what it estimates: select one, then the other, on the same axes. */
const HEAD_SCREEN = [["heads_atp.loss_delta", "heads_atp.loss_delta (AtP screen, estimated)"],
  ["heads.ablation_loss_delta", "heads.ablation_loss_delta (exact ablation)"]];
const SIMILARITY = ["similarity.self", "similarity.index", "similarity.adjacent"];

const line = (id, title, metrics, metric, extra = {}) =>
  ({ id, title, kind: "line", metrics, metric, ...extra });

/* The panels, in page order. `lens`: points 0..L (embeddings, then each block's output);
 * `beside`: the same metric of another family drawn dotted in the same axes. */
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
  line("tuned-lens", "Tuned lens — beside the logit lens (dotted)", TUNED,
    "tuned_lens.kl_to_final", { lens: true, beside: "logit_lens" }),
  line("n-prediction", "Prediction neurons per layer", NEURON_COUNTS,
    "neurons.n_prediction_cal"),
  line("n-suppression", "Suppression neurons per layer", NEURON_COUNTS,
    "neurons.n_suppression_cal"),
  line("n-partition", "Partition neurons per layer", NEURON_COUNTS, "neurons.n_partition_cal"),
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
  { id: "heads-screen",
    title: "Head screen (AtP) — estimated ablation loss delta, beside the exact one",
    kind: "heatmap", metrics: HEAD_SCREEN, metric: "heads_atp.loss_delta" },
  { id: "stability", title: "Head stability across refits, beside its null baseline",
    kind: "stability" },
  { id: "stability-importance",
    title: "Head stability against ablation importance — correlation over each layer's heads",
    kind: "stability-importance" },
  { id: "stages", title: "Stages of inference — boundaries and their evidence", kind: "stages" },
  { id: "neurons", title: "Top prediction / suppression neurons per layer", kind: "neurons" },
  { id: "pruning", title: "Pruning plan — blocks to remove for a budget, and what each choice costs",
    kind: "pruning" },
];
const DRAW = { line: drawLine, heatmap: drawHeatmap, stability: drawStability,
  "stability-importance": drawStabilityImportance,
  stages: drawStagesTable, neurons: drawNeurons, pruning: drawPruningPlan };
const TABLES = new Set(["stages", "neurons", "pruning"]);

const panels = new Map();  // id -> panel, in page order
let drawSeq = 0;

/* ------------------------------------------------------------------- frame */

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
  if (!TABLES.has(def.kind)) {
    exports.append(
      el("button", { type: "button", "data-export": "png", text: "PNG",
        onclick: () => exportPlot(panel, "png") }),
      el("button", { type: "button", "data-export": "svg", text: "SVG",
        onclick: () => exportPlot(panel, "svg") }));
  }
  exports.append(el("details", { class: "data" }, el("summary", { text: "data" }), links));
  const note = el("p", { class: "note" });
  const body = TABLES.has(def.kind) ? el("div", { class: "table-wrap" }) : plot;
  const section = el("section", { class: `panel panel-${def.kind}`, "data-panel": def.id,
    "data-state": "empty", "data-seq": "0" },
  el("header", {}, el("h3", { text: def.title }), controls, exports), body, note);
  panel.section = section;
  panel.links = links;
  panel.note = note;
  panel.body = body;
  if (def.kind === "neurons") buildNeuronControls(panel, controls, () => redraw(panel));
  if (def.kind === "pruning") buildPruningControls(panel, controls, () => redraw(panel));
  if (def.kind === "stability" || def.kind === "stability-importance") {
    buildStabilityControls(panel, controls, () => redraw(panel));
  }
  return panel;
}

/* The panel's data links: CSV, Parquet and JSON of each request it drew from. */
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
  const key = state.apiKey();
  if (!key) return;
  event.preventDefault();
  const link = event.currentTarget;
  const response = await fetch(link.href, { headers: { "X-API-Key": key } });
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

function finish(panel, stateName, note = "") {
  panel.note.textContent = note;
  panel.seq = ++drawSeq;
  panel.section.dataset.state = stateName;
  panel.section.dataset.seq = String(panel.seq);
  panel.section.dataset.drawnAt = String(performance.now());
  if (stateName === "drawn" && window.strata.firstPlotAt === null) {
    window.strata.firstPlotAt = performance.now();
    performance.mark("strata:first-plot");
  }
}

/* -------------------------------------------------------------- scheduling */

export async function redraw(panel) {
  panel.dirty = true;
  if (!panel.visible) return;
  panel.dirty = false;
  panel.section.dataset.state = "loading";
  const ticket = (panel.ticket = (panel.ticket || 0) + 1);
  try {
    if (state.selection().length === 0 && !panel.def.kind.startsWith("stability")) {
      clearPlot(panel);
      if (TABLES.has(panel.def.kind)) panel.body.replaceChildren();
      setLinks(panel, []);
      finish(panel, "empty");
      return;
    }
    // shown before a draw (Plotly sizes a plot to its div), hidden again when there is
    // nothing to draw: an empty panel says so in its note instead of drawing empty axes
    if (!TABLES.has(panel.def.kind)) panel.plot.hidden = false;
    const outcome = await DRAW[panel.def.kind](panel);
    if (outcome === null) return;  // a newer draw of this panel took over
    if (!TABLES.has(panel.def.kind) && outcome.state === "empty") {
      clearPlot(panel);
      panel.plot.hidden = true;
    }
    setLinks(panel, outcome.links);
    finish(panel, outcome.state, outcome.note);
  } catch (error) {
    if (ticket !== panel.ticket) return;
    panel.section.dataset.state = "error";
    panel.note.textContent = `could not draw: ${error.message}`;
  }
}

export function redrawAll() {
  for (const panel of panels.values()) redraw(panel);
}

/* The selection's stage boundaries (for the shading and the stage table), or null. */
async function loadStages() {
  const ids = state.selectedModels().filter((m) => state.runFor(m, "intervention"))
    .map((m) => m.id);
  if (!ids.length) { state.setStageData(null); return; }
  const chosen = ids.map((id) => state.chosenRun(id)).filter((r) => r !== undefined);
  const target = url("/stages", { models: ids.join(","), run_ids: chosen.join(",") });
  const answer = await get(target).catch(() => null);
  if (answer === null) { state.setStageData(null); return; }
  state.setStageData({ target, byModel: new Map(answer.models.map((m) => [m.id, m])),
    rows: answer.rows });
}

/* Stages are read beside the panels' data (each panel awaits both), not before it. */
export async function selectionChanged() {
  const loading = loadStages();
  state.setStagesLoading(loading);
  redrawAll();
  await loading;
}

export function buildPanels() {
  const container = document.getElementById("panels");
  const observer = new IntersectionObserver((entries) => {
    for (const entry of entries) {
      const panel = panels.get(entry.target.dataset.panel);
      panel.visible = entry.isIntersecting;
      if (panel.visible && panel.dirty) redraw(panel);
    }
  }, { rootMargin: "300px 0px" });
  for (const def of PANELS) {
    const panel = buildPanel(def);
    panels.set(def.id, panel);
    container.append(panel.section);
    observer.observe(panel.section);
  }
}
