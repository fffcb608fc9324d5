/* The sidebar's models: the catalog read from the API, the searchable model list, the selection
 * (chips, the header's stage-model picker, the URL hash that keeps it across reloads) and the
 * form that registers a model.
 */

import { pages, request, url } from "./api.js";
import { el } from "./dom.js";
import { selectionChanged } from "./panels.js";
import * as state from "./state.js";

const LISTED = 200;  // models listed at once; a search narrows the rest
let hashRead = false;  // until the hash is read on load, it still says what to select

/* Read the models (each with its current run per family) again, and show them; the newest
 * succeeded run is remembered to notice new results. */
export async function loadCatalog() {
  const [models, newest] = await Promise.all([pages("/models"), request("GET",
    url("/runs", { status: "succeeded", limit: 1 }))]);
  state.setCatalog(models, { total: newest.total,
    latest: newest.items.length ? newest.items[0].id : 0 });
  document.getElementById("model-count").textContent = `(${models.length})`;
  const names = document.getElementById("model-names");
  names.replaceChildren(...models.map((m) => el("option", { value: m.name })));
  renderModelList();
  renderSelection();
}

export function renderModelList() {
  const terms = document.getElementById("model-search").value.toLowerCase().split(/\s+/)
    .filter(Boolean);
  const matches = state.allModels().filter((m) => {
    const text = `${m.name} ${m.source} ${m.architecture || ""} ${m.n_layers || ""}L ${m.id}`
      .toLowerCase();
    return terms.every((t) => text.includes(t));
  });
  const shown = matches.slice(0, LISTED);
  const list = document.getElementById("model-list");
  list.replaceChildren(...shown.map((m) => {
    const hasRuns = state.hasRuns(m.id);
    const box = el("input", { type: "checkbox", checked: state.isSelected(m.id) });
    box.addEventListener("change", () => toggleModel(m.id, box.checked));
    return el("li", { "data-model-id": m.id, "data-model-name": m.name, class: hasRuns ? "" : "no-runs" },
      el("label", {}, box, el("span", { class: "name", text: m.name }),
        el("span", { class: "details" },
          el("span", { class: "meta", text: `${m.n_layers ?? "?"}L · ${m.source}${hasRuns ? "" : " · no results"}` }),
          parityBadge(m.parity))));
  }));
  document.getElementById("model-list-more").textContent = matches.length > shown.length
    ? `${matches.length - shown.length} more: refine the search` : "";
}

/* The model's parity report in a word, with the numbers on hover: "HF ✓" when Strata's forward
 * matched the Hugging Face forward, "no HF" for models without a Hugging Face original. */
function parityBadge(parity) {
  if (!parity) return el("span", { class: "parity unknown", text: "parity ?",
    title: "not measured yet (the model has not been loaded)" });
  if (parity.reference === null) return el("span", { class: "parity none", text: "no HF",
    title: parity.note });
  const floor = parity.noise_floor_kl === null ? ""
    : `; ${parity.dtype} noise floor KL ${parity.noise_floor_kl.toPrecision(2)} nats`;
  const title = `max |Δ log p| ${parity.max_abs_logprob_diff.toPrecision(2)} nats, `
    + `KL ${parity.kl_to_reference.toPrecision(2)} nats against Hugging Face `
    + `(${parity.block_paths.length} blocks: ${[...new Set(parity.block_paths)].join(", ")})${floor}`;
  return el("span", { class: parity.passed ? "parity ok" : "parity failed",
    text: parity.passed ? "HF ✓" : "HF ✗", title });
}

function toggleModel(id, on) {
  if (on) state.select(id);
  else state.deselect(id);
  renderSelection();
  renderModelList();
  selectionChanged();
}

export function clearSelection() {
  state.setSelection([]);
  renderSelection();
  renderModelList();
  selectionChanged();
}

/* A run in a few words: id, why it is read (for the canonical one), its configuration. */
function describeRun(run, basis) {
  const tokens = run.config?.tokens ?? {};
  const size = `${tokens.n_sequences || "all"}×${tokens.seq_len || "?"} ${tokens.source ?? ""}`;
  return `run ${run.id}${basis ? ` (${basis})` : ""} · ${size} · ${run.dtype}`;
}

/* Which run is drawn for a model, and a menu to draw another: its canonical runs (the default,
 * the service's choice, what every answer reads unless told otherwise) or any of its succeeded
 * runs (read from /runs when the menu is first drawn). */
function runPicker(m) {
  const canonical = m.current_runs?.intervention ?? Object.values(m.current_runs ?? {})[0];
  const basis = m.current_run_basis?.intervention ?? Object.values(m.current_run_basis ?? {})[0];
  const picker = el("select", { class: "run-choice", "data-model-id": m.id,
    title: "the run drawn for this model" });
  const runs = state.runsOf(m.id);
  const chosen = state.chosenRun(m.id);
  const label = canonical === undefined ? "no runs"
    : `canonical: run ${canonical}${basis ? ` (${basis})` : ""}`;
  picker.append(el("option", { value: "", text: label }));
  for (const run of runs ?? []) {
    const text = describeRun(run, run.id === canonical ? basis : null);
    picker.append(el("option", { value: run.id, text }));
  }
  picker.value = chosen === undefined ? "" : String(chosen);
  picker.addEventListener("change", () => {
    state.chooseRun(m.id, picker.value === "" ? undefined : Number(picker.value));
    renderSelection();
    selectionChanged();
  });
  if (runs === undefined) {
    request("GET", url("/runs", { model_id: m.id, status: "succeeded", limit: 200 }))
      .then((page) => {
        state.setRunsOf(m.id, page.items);
        renderSelection();
      }).catch(() => {});
  }
  return picker;
}

/* What is drawn for a model, in words (the chip's hover and its `data-run` attribute). */
function drawnRun(m) {
  const chosen = state.chosenRun(m.id);
  if (chosen !== undefined) return `run ${chosen} (chosen here)`;
  const entries = Object.entries(m.current_runs ?? {});
  if (!entries.length) return "no runs";
  return entries.map(([family, run]) => `${family}: run ${run} (${m.current_run_basis?.[family]
    ?? "?"})`).join("; ");
}

export function renderSelection() {
  const selected = state.selection();
  const chips = selected.map((id) => {
    const m = state.model(id);
    return el("span", { class: "chip", "data-model-id": id,
      "data-run": m ? (state.chosenRun(id) ?? m.current_runs?.intervention ?? "") : "",
      title: m ? `drawn: ${drawnRun(m)}` : "" },
      el("i", { style: `background:${state.modelColor(id)}` }),
      el("span", { class: "chip-name", text: m ? m.name : String(id) }),
      ...(m ? [runPicker(m)] : []),
      el("button", { type: "button", title: "remove", text: "×",
        onclick: () => toggleModel(id, false) }));
  });
  document.getElementById("selected-chips").replaceChildren(...chips);
  document.getElementById("selected-count").textContent = `${selected.length} selected`;
  document.getElementById("empty-hint").hidden = selected.length > 0;
  const stageSelect = document.getElementById("stage-model");
  const keep = state.stageModel();
  stageSelect.replaceChildren(el("option", { value: "", text: "(none)" }),
    ...selected.map((id) => el("option", { value: id, text: state.modelName(id) })));
  if (keep !== null && selected.includes(keep)) stageSelect.value = String(keep);
  else {
    state.setStageModel(selected.length ? selected[0] : null);
    stageSelect.value = state.stageModel() === null ? "" : String(state.stageModel());
  }
  writeHash();
}

/* The URL hash names the selected models and the x axis, so a link or a reload shows them. */
export function writeHash() {
  if (!hashRead) return;
  const names = state.selection().map((id) => state.modelName(id));
  const hash = `#models=${names.map(encodeURIComponent).join(",")}&x=${state.xMode()}`;
  if (location.hash !== hash) history.replaceState(null, "", hash);
}

export function readHash() {
  hashRead = true;
  const params = new URLSearchParams(location.hash.slice(1));
  if (params.get("x") === "depth") state.setXMode("depth");
  const wanted = (params.get("models") || "").split(",").filter(Boolean).map(decodeURIComponent);
  const byName = new Map(state.allModels().map((m) => [m.name, m.id]));
  state.setSelection(wanted.map((w) => byName.get(w) ?? (state.hasModel(Number(w)) ? Number(w) : null))
    .filter((id) => id !== null));
}

export function wireRegister() {
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
