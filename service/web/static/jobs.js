/* The jobs box: submit a compute job, follow its progress (polled twice a second), cancel it;
 * when results arrive (a job of this page, or runs stored by others, checked every 10 s) the
 * catalog is read again and the panels redraw.
 */

import { V1, request, url } from "./api.js";
import { el, fmt } from "./dom.js";
import { loadCatalog, renderModelList, renderSelection } from "./models.js";
import { selectionChanged } from "./panels.js";
import * as state from "./state.js";

const FAMILIES = ["intervention", "logit_lens", "neurons", "similarity", "attention", "norms",
  "heads", "tuned_lens", "pruning", "pruning_drops"];
// asked for, not assumed: tuned_lens trains a lens first; pruning and pruning_drops are opt-in
// (docs/metrics.md), the families the pruning-plan panel needs
const NOT_DEFAULT = new Set(["tuned_lens", "pruning", "pruning_drops"]);
const ACTIVE = new Set(["queued", "running"]);
const JOB_POLL_MS = 500;
const RUNS_POLL_MS = 10000;

const jobs = new Map();  // id -> the job as last read
const ownJobs = new Set();  // ids of the jobs submitted from this page

export function wireJobs() {
  document.getElementById("job-families").replaceChildren(...FAMILIES.map((f) =>
    el("label", {}, el("input", { type: "checkbox", value: f, checked: !NOT_DEFAULT.has(f) }), f)));
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
      ownJobs.add(job.id);
      trackJob(job);
    } catch (error) {
      out.textContent = error.message;
      out.dataset.state = "error";
    }
  });
}

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
  if (ownJobs.has(job.id)) {
    document.getElementById("job-result").textContent = `job ${job.id} ${job.state}`;
  }
  item.dataset.jobId = job.id;
  if (ownJobs.has(job.id)) item.dataset.own = "true";
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
    jobs.set(id, job);
    renderJob(job);
    out.textContent = `job ${id} ${job.state}`;
    out.dataset.state = "ok";
  } catch (error) {
    out.textContent = error.message;
    out.dataset.state = "error";
  }
}

function trackJob(job) {
  jobs.set(job.id, job);
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
    const before = jobs.get(id);
    jobs.set(id, job);
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
  if (job && ownJobs.has(job.id) && state.hasModel(job.model_id)
      && !state.isSelected(job.model_id)) {
    state.select(job.model_id);
    renderSelection();
    renderModelList();
  }
  await selectionChanged();
}

/* Whether this service has the jobs API (its OpenAPI document says); if so, its recent jobs. */
export async function detectJobs() {
  let available;
  try {
    const schema = await request("GET", "/schema/openapi.json");
    available = Boolean(schema.paths && schema.paths[`${V1}/jobs`]);
  } catch (error) {
    available = false;
  }
  document.getElementById("jobs-box").dataset.available = String(available);
  document.getElementById("job-submit").disabled = !available;
  if (!available) {
    document.getElementById("job-result").textContent = "this service has no jobs endpoint";
    return;
  }
  const page = await request("GET", url("/jobs", { limit: 10 })).catch(() => null);
  if (page) for (const job of [...page.items].reverse()) trackJob(job);
}

/* Results delivered by others (CLI ingest, other users' jobs): checked every 10 s. */
export function watchRuns() {
  setInterval(async () => {
    try {
      const page = await request("GET", url("/runs", { status: "succeeded", limit: 1 }));
      const latest = page.items.length ? page.items[0].id : 0;
      if (page.total !== state.runCount() || latest !== state.latestRunId()) {
        await resultsArrived(null);
      }
    } catch (error) { /* next time */ }
  }, RUNS_POLL_MS);
}
