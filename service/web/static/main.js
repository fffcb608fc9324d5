/* Strata dashboard: every figure is drawn from the public API (/api/v1), nothing else.
 *
 * Data flow: the model list (/models) is read once (and again when a job finishes or new runs
 * appear); for each selected model and metric family the page pins the run the API names as
 * current (each model's `current_runs`: the service decides, the page does not work it out)
 * and reads its rows (/models/{id}/metrics, /heads, /neurons, /stages,
 * /families/{f}/stability). Answers pinned by run id never change, so they are cached here.
 * Panels draw when they scroll into view; switching the x axis redraws from the cache.
 *
 * The modules: api.js (requests, errors, the cache), state.js (what the page knows), dom.js
 * (element and number helpers), models.js (catalog, model list, selection), panels.js (the
 * panels' frames and when they draw), plots.js and tables.js (what they draw), jobs.js (the
 * jobs box). This one wires them to the page and starts it.
 */

import { get, showStatus, url } from "./api.js";
import { detectJobs, watchRuns, wireJobs } from "./jobs.js";
import { clearSelection, loadCatalog, readHash, renderModelList, renderSelection, wireRegister,
  writeHash } from "./models.js";
import { buildPanels, redrawAll, selectionChanged } from "./panels.js";
import * as state from "./state.js";

function wireKey() {
  const input = document.getElementById("api-key");
  input.value = state.apiKey();
  const show = () => {
    document.getElementById("key-state").textContent = state.apiKey()
      ? "a key is saved in this browser" : "no key saved";
  };
  document.getElementById("key-form").addEventListener("submit", (event) => {
    event.preventDefault();
    state.saveApiKey(input.value.trim());
    show();
  });
  show();
}

/* The header: x axis, error bars, the model whose stages are shaded. */
function wireViewControls() {
  for (const radio of document.querySelectorAll("input[name=xmode]")) {
    radio.addEventListener("change", () => {
      state.setXMode(radio.value);
      writeHash();
      redrawAll();
    });
  }
  document.getElementById("show-err").addEventListener("change", (event) => {
    state.setShowErrors(event.target.checked);
    redrawAll();
  });
  document.getElementById("stage-model").addEventListener("change", (event) => {
    state.setStageModel(event.target.value === "" ? null : Number(event.target.value));
    redrawAll();
  });
}

async function start() {
  performance.mark("strata:start");
  wireKey();
  wireRegister();
  wireJobs();
  buildPanels();
  document.getElementById("model-search").addEventListener("input", renderModelList);
  document.getElementById("clear-selection").addEventListener("click", clearSelection);
  wireViewControls();
  try {
    await loadCatalog();
  } catch (error) {
    showStatus(`could not read the models: ${error.message}`);
    return;
  }
  performance.mark("strata:catalog");
  readHash();
  document.getElementById(state.xMode() === "depth" ? "x-depth" : "x-layer").checked = true;
  renderSelection();
  renderModelList();
  // Read beside the selection's panels; the stability panels wait for it (state.familiesLoaded).
  state.setFamiliesLoading(get(url("/families")).then((families) => {
    state.setRefitFamilies(families);
  }).catch(() => {}));
  await selectionChanged();
  detectJobs();
  watchRuns();
  document.body.dataset.ready = "true";
}

if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", start);
else start();
