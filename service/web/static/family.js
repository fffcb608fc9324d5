/* The family page (/family?name=F): a refit family's members and their state, its stability
 * per layer against the null, per head, and against ablation importance, and its stability
 * job's progress (polled while it is queued or running; the plots are drawn again when it
 * succeeds). Everything is read from the public API (/api/v1/families/..., /api/v1/jobs/...);
 * "compute stability" queues the job with the key saved on the dashboard.
 */

import { get, request, url } from "./api.js";
import { el, fmt } from "./dom.js";
import { colorbar, heatmapFrame, lineFrame, PLOT_CONFIG, STABILITY_BARS } from "./figure.js";

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

/* Draw a panel's plot; `frame`: its margins, legend and mode-bar (figure.js), by default a
 * line plot's, legend under the x-axis title and the mode-bar in a gutter of its own. */
async function draw(id, traces, layout, frame = null) {
  const Plotly = await plotly();
  const div = panel(id).querySelector(".plot");
  div.hidden = false;
  const chrome = frame ?? lineFrame(traces.map((t) => t.name), div.clientWidth || 500,
    { top: 10, height: 300 });
  await Plotly.react(div, traces, { height: 320, ...chrome, ...layout },
    { ...PLOT_CONFIG, toImageButtonOptions: { format: "png" } });
  panel(id).dataset.drawn = String(traces.length);
}

/* A panel with nothing to draw: no plot (no empty axes), its note says why. */
async function blank(id, text) {
  const div = panel(id).querySelector(".plot");
  if (div.data) (await plotly()).purge(div);
  div.hidden = true;
  panel(id).dataset.drawn = "0";
  note(id, text);
}

function rowsOf(answer, metric) {
  return answer.rows.filter((r) => r.metric === metric && r.head === null)
    .sort((a, b) => a.layer - b.layer);
}

/* Per layer, the mean over the layer's heads (which has no stderr), with the std over those
 * heads as its error bars (`heads.stability_std`, `_null_std`): as the dashboard draws it. */
async function drawLayers(name) {
  const answer = await get(url(`/families/${encodeURIComponent(name)}/stability`));
  const trace = (metric, label, dash) => {
    const rows = rowsOf(answer, metric);
    const std = new Map(rowsOf(answer, `${metric}_std`).map((r) => [r.layer, r.value]));
    return { name: label, x: rows.map((r) => r.layer), y: rows.map((r) => r.value),
      error_y: { type: "data", array: rows.map((r) => std.get(r.layer) ?? 0),
        visible: std.size > 0, thickness: 1, width: 2 },
      customdata: rows.map((r) => std.get(r.layer) ?? null),
      hovertemplate: `<b>${label}</b><br>layer %{x}<br>%{y:.4f}`
        + (std.size ? " (± %{customdata:.3f} std over heads)" : "") + "<extra></extra>",
      mode: "lines+markers", line: { dash } };
  };
  await draw("family-layers", [trace("heads.stability", "trained refits", "solid"),
    trace("heads.stability_null", "null baseline (random init)", "dot")],
  { xaxis: { title: { text: "layer" }, dtick: 1 },
    yaxis: { title: { text: "matched pattern cosine" } } });
  note("family-layers", `run ${answer.run.id}: mean over each layer's heads, against random `
    + `models (the null); error bars: ${STABILITY_BARS}`);
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
    zmin: 0, zmax: 1, colorbar: colorbar("cosine") }],
  { xaxis: { title: { text: "head" }, dtick: 1 }, yaxis: { title: { text: "layer" }, dtick: 1 } },
  heatmapFrame({ top: 10 }));
  note("family-heads", `${heads.length} heads, each its matched cosine averaged over refits`);
}

async function drawImportance(family) {
  // The join needs the anchor's heads run (the API's 404 otherwise): asked only when it has one
  const anchor = await get(url(`/models/${family.anchor.id}`));
  if (anchor.current_runs.heads === undefined) {
    await blank("family-importance", `the anchor ${family.anchor.name} has no heads run yet: `
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
    await Promise.all(["family-layers", "family-heads", "family-importance"].map((id) =>
      blank(id, "no stability computed yet: compute it (the job's progress is above)")));
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
