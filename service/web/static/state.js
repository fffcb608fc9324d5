/* What the page knows, shared by the other modules: the model catalog (each model says which
 * run the API reads for each family: `current_runs`, and why: `current_run_basis`), the runs a
 * person chose to draw instead, the selection, the view options, the
 * stage boundaries of the selection, the refit families and the saved API key. Read through the
 * getters; change only through the updates below, which keep the pieces consistent (the
 * selection never names a model the catalog lacks; colours follow the selection order).
 */

const KEY_STORAGE = "strata.key";
const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
  "#17becf", "#bcbd22", "#7f7f7f"];

let key = localStorage.getItem(KEY_STORAGE) || "";
let models = Object.freeze([]);
let byId = new Map();
let runsSeen = { total: 0, latest: 0 };
const runChoice = new Map();  // model id -> the run id a person chose to draw
const runLists = new Map();  // model id -> its succeeded runs (GET /runs)
let selected = Object.freeze([]);
let xAxis = "layer";
let showErr = true;
let shaded = null;
let stages = null;
let stagesReady = Promise.resolve();
let families = [];
let familiesReady = Promise.resolve();

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

/* A new catalog: the models, and how many succeeded runs there were and the newest one's id
 * (what `watchRuns` compares with); selected models it lacks are dropped. */
export function setCatalog(newModels, seen) {
  models = Object.freeze([...newModels]);
  byId = new Map(models.map((m) => [m.id, m]));
  runsSeen = seen;
  runLists.clear();  // read again when a menu is next drawn: new runs may have arrived
  selected = Object.freeze(selected.filter((id) => byId.has(id)));
}

export function allModels() { return models; }
export function model(id) { return byId.get(id); }
export function hasModel(id) { return byId.has(id); }
export function modelName(id) { return byId.get(id)?.name ?? id; }
export function hasRuns(id) {
  return Object.keys(byId.get(id)?.current_runs ?? {}).length > 0;
}
export function runCount() { return runsSeen.total; }
export function latestRunId() { return runsSeen.latest; }

/* The id of the run drawn for this model and family: the run a person chose for the model
 * (`chooseRun`) where it computed the family, else the model's canonical run (the model
 * answer's `current_runs`: the service decides); undefined if none computed it. */
export function runFor(m, family) {
  const chosen = runChoice.get(m.id);
  if (chosen !== undefined) {
    const run = (runLists.get(m.id) ?? []).find((r) => r.id === chosen);
    if (run && run.families.includes(family)) return chosen;
  }
  return (byId.get(m.id) ?? m).current_runs?.[family];
}

/* Why the service reads a family's run by default: "pinned", "default" or "latest". */
export function runBasis(m, family) {
  return (byId.get(m.id) ?? m).current_run_basis?.[family];
}

/* The run a person chose to draw for a model instead of its canonical runs (undefined: the
 * canonical ones), and the model's succeeded runs to choose from (read once per model). */
export function chosenRun(id) { return runChoice.get(id); }
export function chooseRun(id, runId) {
  if (runId === undefined || runId === null) runChoice.delete(id);
  else runChoice.set(id, runId);
}
export function runsOf(id) { return runLists.get(id); }
export function setRunsOf(id, runs) { runLists.set(id, runs); }

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

/* The stored refit families; `familiesLoaded()` settles once the list has been read (or could not
 * be), so that a stability panel never calls the list empty before it has arrived. */
export function refitFamilies() { return families; }
export function setRefitFamilies(value) { families = value; }
export function familiesLoaded() { return familiesReady; }
export function setFamiliesLoading(promise) { familiesReady = promise; }
