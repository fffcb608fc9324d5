/* The plotted panels, drawn with plotly.js: per-layer lines (with the stage overlay), per-head
 * heat maps and the head stability of a refit family.
 *
 * Each draw function fetches what its panel shows, draws it into `panel.plot` and returns what
 * the panel should say about it, {state: "drawn" | "empty", note, links: [[label, target]]}, or
 * null when a newer draw of the same panel started meanwhile (its ticket moved on).
 */

import { get, url } from "./api.js";
import { el, evidenceText, fmt, optionList } from "./dom.js";
import { colorbar, heatmapFrame, lineFrame, PLOT_CONFIG, STABILITY_BARS } from "./figure.js";
import * as state from "./state.js";

const MAX_HEATMAPS = 4;
const MANY = 12;  // more curves than this in one panel: drawn lighter
/* Families a run computes only when asked: how to get them. */
const OPT_IN = {
  heads_atp: "an opt-in family: compute it with the jobs box (families: heads_atp)",
  tuned_lens: "an opt-in family: compute it with the jobs box (families: tuned_lens)",
};

/* What an empty panel says instead of drawing empty axes: no results of `family` for any of
 * the selected models `names`. */
function noResults(family, names) {
  const whom = names.length === 1 ? "this model" : "these models";
  const hint = OPT_IN[family] ? `; ${OPT_IN[family]}` : "";
  return `no ${family} results for ${whom} (${names.join(", ")})${hint}`;
}

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

export function clearPlot(panel) {
  if (panel.plot.data) window.Plotly.purge(panel.plot);
}

export function exportPlot(panel, format) {
  if (!panel.plot.data) return;
  const name = `strata-${panel.def.id}-${panel.metric || "plot"}`.replace(/[^A-Za-z0-9._-]/g, "_");
  window.Plotly.downloadImage(panel.plot, { format, filename: name, width: 1000, height: 500 });
}

/* ------------------------------------------------------------ stage overlay */

/* x of the edge before block b: blocks sit at integers (layer) or l/(L-1) (depth);
 * logit-lens points i = output of block i-1, at i or i/L. */
function edgeX(b, L, lens) {
  const x = lens ? b + 0.5 : b - 0.5;
  if (state.xMode() === "layer") return x;
  const denom = lens ? L : Math.max(L - 1, 1);
  return x / denom;
}

function stageOverlay(lens, yref) {
  const shapes = [], traces = [], annotations = [];
  const stages = state.stageData();
  if (!stages) return { shapes, traces, annotations };
  const fills = ["rgba(31,119,180,0.07)", "rgba(44,160,44,0.07)", "rgba(255,127,14,0.07)",
    "rgba(148,103,189,0.07)"];
  const ref = state.stageModel();
  for (const row of stages.rows) {
    if (row.model_id !== ref || !row.clear || row.layer_start === null) continue;
    const L = state.model(ref)?.n_layers || 1;
    const lo = row.layer_start === 0 ? edgeX(lens ? -1 : 0, L, lens) : edgeX(row.layer_start, L, lens);
    const hi = edgeX(row.layer_end + 1, L, lens);
    shapes.push({ type: "rect", xref: "x", yref: "paper", x0: lo, x1: hi, y0: 0, y1: 1,
      fillcolor: fills[(row.stage - 1) % 4], line: { width: 0 }, layer: "below", name: "stage" });
    annotations.push({ x: (lo + hi) / 2, xref: "x", y: 1, yref: "paper", yanchor: "bottom",
      text: `stage ${row.stage}`, hovertext: `${row.stage_name}: blocks ${row.layer_start}` +
        `–${row.layer_end} of ${state.model(ref)?.name}`, showarrow: false,
      font: { size: 9, color: "#777" } });
  }
  // boundary lines of every selected model, unless there are too many to tell apart
  const selected = state.selection();
  for (const id of selected.length > MANY ? [] : selected) {
    const ofModel = stages.byModel.get(id);
    if (!ofModel) continue;
    const L = state.model(id)?.n_layers || 1;
    for (const b of ofModel.boundaries) {
      if (!b.found || b.layer === null) continue;
      const x = edgeX(b.layer, L, lens);
      // the boundary as a range: its bootstrap interval over sequences, else its signals' range
      const span = b.interval || b.range;
      if (span) {
        shapes.push({ type: "rect", xref: "x", yref: "paper", x0: edgeX(span[0] - 0.15, L, lens),
          x1: edgeX(span[1] + 0.15, L, lens), y0: 0, y1: 1, fillcolor: state.modelColor(id),
          opacity: 0.13, line: { width: 0 }, layer: "below", name: `boundary-${b.boundary}` });
      }
      const ys = Array.from({ length: 21 }, (_, i) => i / 20);
      const where = b.interval ? `${Math.round((b.interval_level || 0.9) * 100)}% interval over ` +
        `sequences: blocks ${b.interval[0]}–${b.interval[1]}` : "no interval (no per-sequence means)";
      const text = `<b>${ofModel.name}: boundary ${b.boundary}</b> (end of ${b.ends_stage})` +
        `<br>first block of the next stage: ${b.layer} (depth ${fmt(b.relative_depth, 3)})` +
        `<br>${where}; sharpness ${fmt(b.sharpness, 3)}` +
        `<br>rule: ${b.rule}<br>${evidenceText(b.evidence)}`;
      traces.push({ x: ys.map(() => x), y: ys, yaxis: yref, mode: "lines", showlegend: false,
        line: { color: state.modelColor(id), dash: "dot", width: 1 }, hoverinfo: "text",
        text: ys.map(() => text), hoverlabel: { align: "left" }, meta: "boundary",
        name: `${ofModel.name} boundary ${b.boundary}` });
    }
  }
  return { shapes, traces, annotations };
}

/* ------------------------------------------------------------------ layout */

/* A line plot's layout; `names`: its legend's entries (the legend sits under the x-axis title,
 * the mode-bar in a gutter at the right: figure.js). */
function baseLayout(panel, ytitle, names, extra = {}) {
  const depth = state.xMode() === "depth";
  return {
    ...lineFrame(names, panel.plot.clientWidth || 500), hovermode: "closest",
    xaxis: { title: { text: depth ? "relative depth" : "layer" }, zeroline: false,
      ...(depth ? { range: [-0.04, 1.04] } : { dtick: layerStep() }) },
    yaxis: { title: { text: ytitle }, zeroline: false },
    yaxis2: { overlaying: "y", range: [0, 1], visible: false, fixedrange: true },
    ...extra,
  };
}

/* Integer layer ticks, about a dozen of them at most. */
function layerStep() {
  const deepest = Math.max(1, ...state.selection().map((id) => state.model(id)?.n_layers || 1));
  return Math.max(1, Math.ceil(deepest / 12));
}

function familyOf(metric) { return metric.split(".")[0]; }

function r0unit(rows) { return rows.length ? rows[0].unit : ""; }

/* ------------------------------------------------------------------- lines */

export async function drawLine(panel) {
  const ticket = panel.ticket;
  const began = performance.now();
  const family = familyOf(panel.metric);
  const models = state.selectedModels();
  const have = models.filter((m) => state.runFor(m, family) !== undefined);
  const missing = models.filter((m) => state.runFor(m, family) === undefined).map((m) => m.name);
  const targets = have.map((m) => url(`/models/${m.id}/metrics`, { metric: panel.metric,
    component: panel.def.components ? panel.component : null, run_id: state.runFor(m, family) }));
  // `beside`: the same metric of another family (the logit lens beside the tuned lens), dotted
  const besideFamily = panel.def.beside;
  const besideMetric = besideFamily ? panel.metric.replace(/^[^.]+/, besideFamily) : null;
  const besideModels = besideFamily
    ? have.filter((m) => state.runFor(m, besideFamily) !== undefined) : [];
  const besideTargets = besideModels.map((m) => url(`/models/${m.id}/metrics`,
    { metric: besideMetric, run_id: state.runFor(m, besideFamily) }));
  const [answers, besideAnswers] = await Promise.all([
    Promise.all(targets.map((t) => get(t, true))),
    Promise.all(besideTargets.map((t) => get(t, true))), state.stagesLoaded(), plotlyReady]);
  if (ticket !== panel.ticket) return null;
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
        x: rows.map((r) => (state.xMode() === "depth" ? r.relative_depth : r.layer)),
        y: rows.map((r) => r.value),
        customdata: rows.map((r) => [r.layer, r.relative_depth, r.stderr, r.n]),
        hovertemplate: `<b>${m.name}</b><br>layer %{customdata[0]} · depth %{customdata[1]:.3f}` +
          `<br>%{y:.4g} ± %{customdata[2]:.2g} ${r0unit(rows)}<br>n = %{customdata[3]} ${per}` +
          "<extra></extra>",
        error_y: { type: "data", array: rows.map((r) => r.stderr ?? 0),
          visible: state.showErrors() && hasErr && !many, thickness: 1, width: 2 },
        line: { color: state.modelColor(m.id), width: many ? 1 : 1.5,
          dash: component === "mlp" ? "dash" : "solid" },
        marker: { size: 4, color: state.modelColor(m.id) }, meta: m.name,
      });
    }
  });
  besideAnswers.forEach((answer, i) => {
    const m = besideModels[i];
    const rows = answer.rows.filter((r) => r.layer !== null).sort((a, b) => a.layer - b.layer);
    traces.push({
      type: "scatter", mode: "lines", name: `${m.name} · ${besideMetric}`,
      x: rows.map((r) => (state.xMode() === "depth" ? r.relative_depth : r.layer)),
      y: rows.map((r) => r.value),
      hovertemplate: `<b>${m.name}</b> ${besideMetric}<br>%{y:.4g}<extra></extra>`,
      line: { color: state.modelColor(m.id), width: 1, dash: "dot" }, meta: m.name,
    });
  });
  if (!traces.length) {
    return { state: "empty", links: [], note: noResults(family, models.map((m) => m.name)) };
  }
  const overlay = stageOverlay(Boolean(panel.def.lens), "y2");
  await render(() => window.Plotly.react(panel.plot, [...traces, ...overlay.traces],
    baseLayout(panel, `${panel.metric}${unit ? ` (${unit})` : ""}`,
      many ? [] : traces.map((t) => t.name),
      { shapes: overlay.shapes, annotations: overlay.annotations }), PLOT_CONFIG));
  window.strata.lastDraw = { panel: panel.def.id, models: have.length,
    fetch_ms: fetched - began, render_ms: performance.now() - fetched };
  const notes = [];
  if (missing.length) notes.push(`no ${family} results for: ${missing.join(", ")}`);
  if (many) {
    notes.push(`${have.length} models: colours as in the selection, names on hover; no error ` +
      `bars or boundary lines above ${MANY} models`);
  }
  return { state: "drawn", note: notes.join("; "),
    links: have.map((m, i) => [m.name, targets[i]]) };
}

/* ---------------------------------------------------------------- heat maps */

export async function drawHeatmap(panel) {
  const ticket = panel.ticket;
  const family = familyOf(panel.metric);
  const models = state.selectedModels().filter((m) => state.runFor(m, family) !== undefined);
  if (!models.length) {
    return { state: "empty", links: [],
      note: noResults(family, state.selectedModels().map((m) => m.name)) };
  }
  const shown = models.slice(0, MAX_HEATMAPS);
  const targets = shown.map((m) => url(`/models/${m.id}/heads`, { metric: panel.metric,
    run_id: state.runFor(m, family) }));
  const [answers] = await Promise.all([Promise.all(targets.map((t) => get(t, true))),
    plotlyReady]);
  if (ticket !== panel.ticket) return null;
  const depthAxis = state.xMode() === "depth";
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
      y: depthAxis ? layers.map((l) => depth.get(l)) : layers,
      xaxis: `x${axis}`, yaxis: `y${axis}`, zmin: lo, zmax: hi, colorscale: "Viridis",
      showscale: i === shown.length - 1, name: m.name, meta: m.name,
      colorbar: colorbar(unit),
      hovertemplate: `<b>${m.name}</b><br>layer %{y} head %{x}<br>%{z:.4g} ${unit}<extra></extra>` };
  });
  const layout = { ...heatmapFrame(), height: 320,
    grid: { rows: 1, columns: Math.max(traces.length, 1), pattern: "independent" },
    annotations: shown.map((m, i) => ({ text: m.name, showarrow: false, xref: `x${i ? i + 1 : ""} domain`,
      yref: `y${i ? i + 1 : ""} domain`, x: 0.5, y: 1.08, font: { size: 11 } })) };
  shown.forEach((m, i) => {
    const s = i ? String(i + 1) : "";
    layout[`xaxis${s}`] = { title: { text: "head" }, dtick: 1 };
    layout[`yaxis${s}`] = { title: { text: i === 0 ? (depthAxis ? "relative depth" : "layer") : "" },
      ...(depthAxis ? {} : { dtick: 1 }) };
  });
  await render(() => window.Plotly.react(panel.plot, traces, layout, PLOT_CONFIG));
  const notes = [];
  if (models.length > shown.length) notes.push(`showing the first ${MAX_HEATMAPS} of ${models.length} models`);
  const missing = state.selection().filter((id) => !models.some((m) => m.id === id))
    .map((id) => state.modelName(id));
  if (missing.length) notes.push(`no ${family} results for: ${missing.join(", ")}`);
  return { state: "drawn", note: notes.join("; "),
    links: shown.map((m, i) => [m.name, targets[i]]) };
}

/* ---------------------------------------------------------------- stability */

/* The refit family picker; `onChange` redraws the panel. */
export function buildStabilityControls(panel, controls, onChange) {
  const select = el("select", { class: "family", "aria-label": "refit family" });
  select.addEventListener("change", () => { panel.extra.family = select.value; onChange(); });
  panel.extra.select = select;
  controls.append(select);
}

/* The stored refit families; the first with a selected model is picked until the user picks. */
function fillFamilies(panel) {
  const select = panel.extra.select;
  const families = state.refitFamilies();
  const names = families.map((f) => f.name);
  if (!names.includes(panel.extra.family)) {
    const picked = families.find((f) => f.members.some((m) => state.isSelected(m.id))
      || state.isSelected(f.anchor.id));
    panel.extra.family = picked ? picked.name : names[0];
  }
  select.replaceChildren(...optionList(names, panel.extra.family));
}

export async function drawStability(panel) {
  const ticket = panel.ticket;
  await Promise.all([plotlyReady, state.familiesLoaded()]);
  if (ticket !== panel.ticket) return null;
  fillFamilies(panel);
  const family = panel.extra.family;
  if (!family) {
    return { state: "empty", note: "no refit families stored (strata stability --store)", links: [] };
  }
  const target = url(`/families/${encodeURIComponent(family)}/stability`);
  const answer = await get(target, true);
  if (ticket !== panel.ticket) return null;
  const by = (metric) => answer.rows.filter((r) => r.metric === metric && r.head === null)
    .sort((a, b) => a.layer - b.layer);
  const x = (rows) => rows.map((r) => (state.xMode() === "depth" ? r.relative_depth : r.layer));
  // per layer, stability is a mean over the layer's heads without a stderr: its bars are the
  // std over those heads (`_std`); residual CKA is a mean over refits: its bars, their stderr
  const series = [["heads.stability", "heads.stability_std", "trained refits", "#1f77b4", "solid"],
    ["heads.stability_null", "heads.stability_null_std", "null baseline (random init)", "#7f7f7f", "dash"],
    ["heads.residual_cka.linear", null, "residual CKA (linear)", "#2ca02c", "dot"],
    ["heads.residual_cka.rbf", null, "residual CKA (RBF)", "#ff7f0e", "dot"]];
  const traces = [];
  let ckaStderr = false;
  for (const [metric, spread, name, color, dash] of series) {
    const rows = by(metric);
    if (!rows.length) continue;
    const bar = spread ? new Map(by(spread).map((r) => [r.layer, r.value]))
      : new Map(rows.filter((r) => r.stderr !== null).map((r) => [r.layer, r.stderr]));
    if (!spread && bar.size) ckaStderr = true;
    const what = spread ? "std over heads" : "stderr over refits";
    traces.push({ type: "scatter", mode: "lines+markers", name, x: x(rows), y: rows.map((r) => r.value),
      error_y: { type: "data", array: rows.map((r) => bar.get(r.layer) ?? 0),
        visible: state.showErrors() && bar.size > 0, thickness: 1, width: 2 },
      customdata: rows.map((r) => [r.layer, bar.get(r.layer) ?? null]),
      hovertemplate: `<b>${name}</b><br>layer %{customdata[0]}<br>%{y:.4f}`
        + (bar.size ? ` (± %{customdata[1]:.3f} ${what})` : "") + "<extra></extra>",
      line: { color, dash }, marker: { color, size: 5 }, meta: metric });
  }
  if (!traces.length) {
    return { state: "empty", links: [[family, target]],
      note: `family ${family}: no stability rows stored` };
  }
  await render(() => window.Plotly.react(panel.plot, traces,
    baseLayout(panel, "cosine / CKA", traces.map((t) => t.name)), PLOT_CONFIG));
  return { state: "drawn", links: [[family, target]],
    note: `family ${family}: anchor ${answer.family.anchor.name}, `
      + `${answer.family.members.length} members; error bars: ${STABILITY_BARS}`
      + (ckaStderr ? "; residual CKA: ± stderr over refits" : "") };
}

/* Per layer, the correlation over heads between a head's stability across the family's refits
 * and its ablation importance on the anchor (claim 3 of the head-stability paper): Pearson r
 * with its 95% interval, and Spearman rho. */
export async function drawStabilityImportance(panel) {
  const ticket = panel.ticket;
  await Promise.all([plotlyReady, state.familiesLoaded()]);
  if (ticket !== panel.ticket) return null;
  fillFamilies(panel);
  const family = panel.extra.family;
  if (!family) {
    return { state: "empty", note: "no refit families stored (strata stability --store)", links: [] };
  }
  const target = url(`/families/${encodeURIComponent(family)}/stability-importance`);
  let answer;
  try {
    answer = await get(target, true);
  } catch (error) {
    if (ticket !== panel.ticket) return null;
    if (error.status !== 404) throw error;
    return { state: "empty", note: error.body ? error.body.detail : String(error), links: [] };
  }
  if (ticket !== panel.ticket) return null;
  const rows = answer.rows.filter((r) => r.pearson !== null);
  const x = rows.map((r) => (state.xMode() === "depth" ? r.relative_depth : r.layer));
  const traces = [
    { type: "scatter", mode: "lines+markers", name: "Pearson r (95% interval)", x,
      y: rows.map((r) => r.pearson),
      error_y: { type: "data", symmetric: false, visible: state.showErrors(), thickness: 1, width: 2,
        array: rows.map((r) => (r.pearson_high === null ? 0 : r.pearson_high - r.pearson)),
        arrayminus: rows.map((r) => (r.pearson_low === null ? 0 : r.pearson - r.pearson_low)) },
      customdata: rows.map((r) => [r.layer, r.n_heads]),
      hovertemplate: "<b>Pearson r</b><br>layer %{customdata[0]}, %{customdata[1]} heads<br>%{y:.3f}<extra></extra>",
      line: { color: "#9467bd" }, marker: { color: "#9467bd", size: 5 }, meta: "pearson" },
    { type: "scatter", mode: "lines+markers", name: "Spearman ρ", x, y: rows.map((r) => r.spearman),
      line: { color: "#8c564b", dash: "dot" }, marker: { color: "#8c564b", size: 5 }, meta: "spearman" },
  ];
  if (!rows.length) {
    return { state: "empty", links: [[family, target]],
      note: `family ${family}: no layer has a correlation (too few heads)` };
  }
  const layout = baseLayout(panel, "correlation over heads", traces.map((t) => t.name),
    { yaxis: { range: [-1.05, 1.05], title: { text: "correlation over heads" }, zeroline: true } });
  await render(() => window.Plotly.react(panel.plot, traces, layout, PLOT_CONFIG));
  return { state: "drawn", links: [[family, target]],
    note: `family ${family}: stability (run ${answer.stability_run.id}) against ${answer.importance} `
      + `on ${answer.family.anchor.name} (run ${answer.importance_run.id}); a negative r: less `
      + "stable heads matter more" };
}
