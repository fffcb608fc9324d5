/* The family page (/family?name=F): a refit family's members and their state, its stability
 * per layer against the null, per head, and against ablation importance, and its stability
 * job's progress (polled while it is queued or running; the plots are drawn again when it
 * succeeds). Everything is read from the public API (/api/v1/families/..., /api/v1/jobs/...);
 * "compute stability" queues the job with the key saved on the dashboard.
 */

import { get, request, url } from "./api.js";
import { el, fmt } from "./dom.js";

const POLL_MS = 1000;
const FINAL = ["succeeded", "failed", "cancelled"];
const page = { family: null, drawnRun: undefined, polling: null };
window.strata.family = page;

function plotly() {
  return new Promise((resolve) => {
    if (window.Plotly) return resolve(window.Plotly);
    document.getElementById("plotly-script").addEventListener("load",
      () => resolve(window.Plotly));
  });
}

function panel(id) { return document.querySelector(`section[data-panel='${id}']`); }

function note(id, text) { panel(id).querySelector(".note").textContent = text; }

async function draw(id, traces, layout) {
  const Plotly = await plotly();
  const div = panel(id).querySelector(".plot");
  await Plotly.react(div, traces, { margin: { t: 10, r: 10 }, height: 320, ...layout },
    { displaylogo: false, toImageButtonOptions: { format: "png" } });
  panel(id).dataset.drawn = String(traces.length);
}

function rowsOf(answer, metric) {
  return answer.rows.filter((r) => r.metric === metric && r.head === null)
    .sort((a, b) => a.layer - b.layer);
}

async function drawLayers(name) {
  const answer = await get(url(`/families/${encodeURIComponent(name)}/stability`));
  const trace = (metric, label, dash) => {
    const rows = rowsOf(answer, metric);
    return { name: label, x: rows.map((r) => r.layer), y: rows.map((r) => r.value),
      error_y: { type: "data", array: rows.map((r) => r.stderr ?? 0), visible: true },
      mode: "lines+markers", line: { dash } };
  };
  await draw("family-layers", [trace("heads.stability", "trained refits", "solid"),
    trace("heads.stability_null", "null baseline (random init)", "dot")],
  { xaxis: { title: { text: "layer" }, dtick: 1 },
    yaxis: { title: { text: "matched pattern cosine" } } });
  note("family-layers", `run ${answer.run.id}: mean over each layer's heads ± stderr over `
    + "refits (null: over random models)");
}

async function drawHeads(name) {
  const answer = await get(url(`/families/${encodeURIComponent(name)}/stability`,
    { metric: "heads.stability", per_head: true }));
  const heads = answer.rows.filter((r) => r.head !== null);
  const layers = [...new Set(heads.map((r) => r.layer))].sort((a, b) => a - b);
  const nHeads = Math.max(...heads.map((r) => r.head)) + 1;
  const z = layers.map((l) => Array.from({ length: nHeads }, (_, h) =>
    heads.find((r) => r.layer === l && r.head === h)?.value ?? null));
  await draw("family-heads", [{ type: "heatmap", name: "heads.stability", z,
    x: Array.from({ length: nHeads }, (_, h) => h), y: layers, colorscale: "Viridis",
    zmin: 0, zmax: 1 }],
  { xaxis: { title: { text: "head" }, dtick: 1 }, yaxis: { title: { text: "layer" }, dtick: 1 } });
  note("family-heads", `${heads.length} heads, each its matched cosine averaged over refits`);
}

async function drawImportance(family) {
  // The join needs the anchor's heads run (the API's 404 otherwise): asked only when it has one
  const anchor = await get(url(`/models/${family.anchor.id}`));
  if (anchor.current_runs.heads === undefined) {
    panel("family-importance").dataset.drawn = "0";
    note("family-importance", `the anchor ${family.anchor.name} has no heads run yet: `
      + "submit one (metrics: heads) to see its ablation importance here");
    return;
  }
  const answer = await get(url(
    `/families/${encodeURIComponent(family.name)}/stability-importance`));
  const rows = answer.rows.filter((r) => r.pearson !== null);
  await draw("family-importance", [
    { name: "Pearson r (95% interval)", x: rows.map((r) => r.layer), y: rows.map((r) => r.pearson),
      error_y: { type: "data", symmetric: false, visible: true,
        array: rows.map((r) => (r.pearson_high ?? r.pearson) - r.pearson),
        arrayminus: rows.map((r) => r.pearson - (r.pearson_low ?? r.pearson)) },
      mode: "markers" },
    { name: "Spearman ρ", x: rows.map((r) => r.layer), y: rows.map((r) => r.spearman),
      mode: "markers", marker: { symbol: "diamond" } }],
  { xaxis: { title: { text: "layer" }, dtick: 1 },
    yaxis: { title: { text: "correlation over heads" }, range: [-1, 1] } });
  note("family-importance", `importance: ${answer.importance} on the anchor's heads run `
    + `${answer.importance_run.id}`);
}

async function drawPlots(family) {
  if (family.stability_run_id === null) {
    for (const id of ["family-layers", "family-heads", "family-importance"]) {
      panel(id).dataset.drawn = "0";
      note(id, "no stability computed yet: compute it (the job's progress is above)");
    }
    page.drawnRun = null;
    return;
  }
  if (page.drawnRun === family.stability_run_id) return;
  await Promise.all([drawLayers(family.name), drawHeads(family.name), drawImportance(family)]);
  page.drawnRun = family.stability_run_id;
}

function showFamily(family) {
  document.getElementById("family-name").textContent =
    `${family.name} — anchor ${family.anchor.name}`;
  const s = family.settings;
  document.getElementById("family-settings").textContent = s
    ? `${s.n_prompts} prompts × ${s.prompt_len} tokens (seed ${s.seed}), ${s.n_null} null `
      + `models, CKA on ${s.cka_tokens} tokens` : "";
  document.querySelector("#family-members tbody").replaceChildren(...family.member_states.map(
    (m) => el("tr", { "data-state": m.state }, el("td", {}, m.model.name),
      el("td", {}, m.anchor ? "anchor" : ""), el("td", {}, m.state),
      el("td", {}, m.architecture ?? "?"), el("td", {}, String(m.n_heads ?? "?")),
      el("td", {}, String(m.d_model ?? "?")))));
}

function showJob(job) {
  const line = document.getElementById("job-line");
  const bar = document.getElementById("job-progress");
  if (!job) {
    line.textContent = "no stability job yet";
    line.dataset.state = "none";
    bar.hidden = true;
    return;
  }
  const p = job.progress;
  let text = `job ${job.id} ${job.state} (${job.reason})`;
  if (p) {
    text += `: ${fmt(100 * p.fraction, 3)}% (${p.done}/${p.total})`
      + (p.eta_s !== null ? `, ETA ${Math.round(p.eta_s)} s` : "");
  }
  if (job.run_id !== null) text += ` → run ${job.run_id}`;
  if (job.error) text += ` — ${job.error}`;
  line.textContent = text;
  line.dataset.state = job.state;
  bar.hidden = !p && job.state !== "succeeded";
  bar.value = job.state === "succeeded" ? 1 : (p ? p.fraction : 0);
  if (p) window.strata.familyProgressSeen = (window.strata.familyProgressSeen || 0) + 1;
}

/* Read the family and its newest job; keep polling while the job is live. */
async function refresh() {
  const name = page.family;
  let family = await get(url(`/families/${encodeURIComponent(name)}`));
  const job = family.job ? await get(url(`/jobs/${family.job.id}`)) : null;
  // A job that ended between the two reads: read the family again, after it, so that its
  // stability run is in it (polling stops here, and the plots would otherwise never come).
  if (job && FINAL.includes(job.state)) family = await get(url(`/families/${encodeURIComponent(name)}`));
  showFamily(family);
  showJob(job);
  await drawPlots(family);
  clearTimeout(page.polling);
  if (job && !FINAL.includes(job.state)) page.polling = setTimeout(refresh, POLL_MS);
  document.body.dataset.ready = "1";
}

async function compute() {
  const out = document.getElementById("compute-result");
  try {
    const job = await request("POST", url(`/families/${encodeURIComponent(page.family)}/stability`),
      {});
    out.textContent = `job ${job.id} ${job.state}`;
    out.dataset.state = "ok";
    await refresh();
  } catch (e) {
    out.textContent = e.message;
    out.dataset.state = "error";
  }
}

async function start() {
  const families = await get(url("/families"));
  const pick = document.getElementById("family-pick");
  const asked = new URLSearchParams(window.location.search).get("name");
  const names = families.map((f) => f.name);
  pick.replaceChildren(...names.map((n) => el("option", { value: n }, n)));
  if (!names.length) {
    document.getElementById("family-name").textContent =
      "no refit families yet: make one (POST /api/v1/families or `strata families create`)";
    document.body.dataset.ready = "1";
    return;
  }
  page.family = names.includes(asked) ? asked : names[0];
  pick.value = page.family;
  pick.addEventListener("change", () => {
    page.family = pick.value;
    page.drawnRun = undefined;
    history.replaceState(null, "", `?name=${encodeURIComponent(page.family)}`);
    refresh();
  });
  document.getElementById("compute-stability").addEventListener("click", compute);
  await refresh();
}

start().catch((e) => {
  document.getElementById("status").textContent = e.message;
  document.body.dataset.ready = "error";
});
