/* What the page knows, shared by the other modules: the model catalog and the run the API would
 * read for each model and family, the selection, the view options, the stage boundaries of the
 * selection, the refit families and the saved API key. Read through the getters; change only
 * through the updates below, which keep the pieces consistent (the selection never names a
 * model the catalog lacks; colours follow the selection order).
 */

const KEY_STORAGE = "strata.key";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f"];

let key = localStorage.getItem(KEY_STORAGE) || "";
let models = Object.freeze([]);
let byId = new Map();
let runs = [];
let runIndex = new Map();
let selected = Object.freeze([]);
let xAxis = "layer";
let showErr = true;
let shaded = null;
let stages = null;
let stagesReady = Promise.resolve();
let families = [];

/* The page's own timings, read by benchmarks/dashboard.py (first plot, the last line drawn). */
window.strata = { firstPlotAt: null, lastDraw: null };

/* ------------------------------------------------------------------ API key */

export function apiKey() { return key; }

/* Kept in this browser only (localStorage); an empty key forgets it. */
export function saveApiKey(value) {
  key = value;
  if (key) localStorage.setItem(KEY_STORAGE, key);
  else localStorage.removeItem(KEY_STORAGE);
}

/* ------------------------------------------------------------ models, runs */

function versionKey(v) {
  return /^\d+$/.test(v) ? v.padStart(12, "0") : v;
}

/* For each model and family, the run the API reads by default: its latest succeeded run under
 * the current metric version (the newest version among stored runs) computing the family. */
function indexRuns(all) {
  const versions = all.map((r) => r.metric_version);
  const current = versions.reduce((a, b) => (versionKey(b) > versionKey(a) ? b : a), "");
  const index = new Map();
  const order = [...all].filter((r) => r.metric_version === current).sort((a, b) => {
    const fa = a.timings.finished_at || "", fb = b.timings.finished_at || "";
    return fa === fb ? a.id - b.id : (fa < fb ? -1 : 1);
  });
  for (const run of order) {  // later runs overwrite earlier ones
    if (!index.has(run.model_id)) index.set(run.model_id, {});
    for (const family of run.families) index.get(run.model_id)[family] = run.id;
  }
  return index;
}

/* A new catalog (the models and their succeeded runs); selected models it lacks are dropped. */
export function setCatalog(newModels, newRuns) {
  models = Object.freeze([...newModels]);
  byId = new Map(models.map((m) => [m.id, m]));
  runs = newRuns;
  runIndex = indexRuns(runs);
  selected = Object.freeze(selected.filter((id) => byId.has(id)));
}

export function allModels() { return models; }
export function model(id) { return byId.get(id); }
export function hasModel(id) { return byId.has(id); }
export function modelName(id) { return byId.get(id)?.name ?? id; }
export function hasRuns(id) { return runIndex.has(id); }
export function runCount() { return runs.length; }
export function latestRunId() { return runs.length ? Math.max(...runs.map((r) => r.id)) : 0; }

/* The id of the run the API reads for this model and family; undefined if none computed it. */
export function runFor(m, family) {
  const byFamily = runIndex.get(m.id);
  return byFamily ? byFamily[family] : undefined;
}

/* -------------------------------------------------------------- selection */

/* The selected model ids, in the order they were picked (a frozen array). */
export function selection() { return selected; }
export function isSelected(id) { return selected.includes(id); }
/* The selected models the catalog holds, in selection order. */
export function selectedModels() { return selected.map((id) => byId.get(id)).filter(Boolean); }

export function select(id) {
  if (!selected.includes(id)) selected = Object.freeze([...selected, id]);
}

export function deselect(id) {
  selected = Object.freeze(selected.filter((s) => s !== id));
}

export function setSelection(ids) { selected = Object.freeze([...ids]); }

export function modelColor(id) {
  const i = selected.indexOf(id);
  if (i < 0) return "#888";
  return i < PALETTE.length ? PALETTE[i] : `hsl(${(i * 137.5) % 360}, 60%, 45%)`;
}

/* ------------------------------------------------------------ view options */

/* "layer" or "depth" (relative depth). */
export function xMode() { return xAxis; }
export function setXMode(mode) { xAxis = mode; }
export function showErrors() { return showErr; }
export function setShowErrors(on) { showErr = on; }
/* The model whose stages are shaded in the line panels (null: none). */
export function stageModel() { return shaded; }
export function setStageModel(id) { shaded = id; }

/* ----------------------------------------------------- stages, families */

/* The selection's stage boundaries ({target, byModel, rows}), or null; `stagesReady()` settles
 * once the current selection's have been read. */
export function stageData() { return stages; }
export function setStageData(value) { stages = value; }
export function stagesLoaded() { return stagesReady; }
export function setStagesLoading(promise) { stagesReady = promise; }

export function refitFamilies() { return families; }
export function setRefitFamilies(value) { families = value; }
