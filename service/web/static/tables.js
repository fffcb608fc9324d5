/* The table panels: the stage boundaries of the selection with their evidence, and the top
 * prediction / suppression neurons of one layer of one model.
 *
 * Like the plots (see plots.js), each draw function fills `panel.body` and returns
 * {state, note, links}, or null when a newer draw of the panel started meanwhile.
 */

import { get, url } from "./api.js";
import { el, evidenceText, fmt, optionList } from "./dom.js";
import * as state from "./state.js";

/* ------------------------------------------------------------------ stages */

export async function drawStagesTable(panel) {
  const ticket = panel.ticket;
  await state.stagesLoaded();
  if (ticket !== panel.ticket) return null;
  const stages = state.stageData();
  if (!stages) {
    panel.body.replaceChildren();
    return { state: "empty", links: [],
      note: state.selection().length ? "no stage boundaries for the selected models" : "" };
  }
  const head = el("tr", {}, ...["model", "boundary", "ends stage", "found", "first block after",
    "relative depth", "rule", "evidence", "interval", "sharpness"].map((h) => el("th", { text: h })));
  const rows = [];
  for (const id of state.selection()) {
    const m = stages.byModel.get(id);
    if (!m) continue;
    for (const b of m.boundaries) {
      const evidence = el("td", { class: "evidence" });
      evidence.innerHTML = evidenceText(b.evidence);
      rows.push(el("tr", {}, el("td", {}, el("i", { class: "swatch", style: `background:${state.modelColor(id)}` }), m.name),
        el("td", { text: b.boundary }), el("td", { text: b.ends_stage }),
        el("td", { text: b.found ? "yes" : "no" }), el("td", { text: fmt(b.layer) }),
        el("td", { text: fmt(b.relative_depth, 3) }), el("td", { text: b.rule }), evidence,
        el("td", { text: b.interval ? `${b.interval[0]}–${b.interval[1]}` : "—" }),
        el("td", { text: fmt(b.sharpness, 3) })));
    }
  }
  panel.body.replaceChildren(el("table", {}, el("thead", {}, head), el("tbody", {}, ...rows)));
  return { state: rows.length ? "drawn" : "empty", note: "", links: [["stages", stages.target]] };
}

/* ----------------------------------------------------------------- neurons */

/* Model, class, layer and top-k pickers; `onChange` redraws the panel. */
export function buildNeuronControls(panel, controls, onChange) {
  const model = el("select", { class: "neuron-model", "aria-label": "model" });
  const cls = el("select", { class: "neuron-class", "aria-label": "class" },
    el("option", { value: "prediction,suppression", text: "prediction + suppression",
      selected: true }),
    ...optionList(["prediction", "suppression", "partition"], null));
  const layer = el("select", { class: "neuron-layer", "aria-label": "layer" });
  const top = el("select", { class: "neuron-top", "aria-label": "top" }, ...optionList(["5", "10", "20"], "10"));
  for (const s of [model, cls, layer, top]) {
    s.addEventListener("change", () => {
      if (s === model) layer.replaceChildren();  // the new model opens at its own last layer
      onChange();
    });
  }
  Object.assign(panel.extra, { model, cls, layer, top });
  controls.append(model, cls, layer, top);
}

export async function drawNeurons(panel) {
  const ticket = panel.ticket;
  const { model, cls, layer, top } = panel.extra;
  const candidates = state.selectedModels().filter((m) => state.runFor(m, "neurons") !== undefined);
  const current = Number(model.value);
  model.replaceChildren(...candidates.map((m) => el("option", { value: m.id, text: m.name })));
  const m = candidates.find((c) => c.id === current) || candidates[0];
  if (!m) {
    panel.body.replaceChildren();
    return { state: "empty", links: [],
      note: state.selection().length ? "no neuron results for the selected models" : "" };
  }
  model.value = String(m.id);
  const L = m.n_layers || 1;
  const currentLayer = layer.value === "" ? Math.max(L - 1, 0) : Math.min(Number(layer.value), L - 1);
  layer.replaceChildren(...Array.from({ length: L }, (_, i) => el("option", { value: i, text: `layer ${i}` })));
  layer.value = String(currentLayer);
  const classes = cls.value.split(",");
  const targets = classes.map((c) => url(`/models/${m.id}/neurons`, { class: c,
    layer: currentLayer, top: top.value, run_id: state.runFor(m, "neurons") }));
  const answers = await Promise.all(targets.map((t) => get(t, true)));
  if (ticket !== panel.ticket) return null;
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
  const empty = classes.filter((c, i) => answers[i].rows.length === 0);
  return { state: "drawn",
    links: classes.map((c, i) => [`${m.name} layer ${currentLayer} ${c}`, targets[i]]),
    note: empty.length ? `no ${empty.join(" or ")} neurons in layer ${currentLayer} of ${m.name}` : "" };
}

/* ------------------------------------------------------------ pruning plan */

const CHOICE_LABELS = {
  measured: "measured best",
  block_influence: "Block Influence (ShortGPT)",
  angular_distance_last: "Gromov d(l, n), last token",
  angular_distance: "Gromov d(l, n), all tokens",
};
const PREDICTOR_LABELS = {
  block_influence: "Block Influence",
  angular_distance_last: "d(l, n) last token",
  angular_distance: "d(l, n) all tokens",
};

/* Model and budget pickers; `onChange` redraws the panel. */
export function buildPruningControls(panel, controls, onChange) {
  const model = el("select", { class: "pruning-model", "aria-label": "model" });
  const budget = el("select", { class: "pruning-n", "aria-label": "budget n" });
  model.addEventListener("change", () => { budget.replaceChildren(); onChange(); });
  budget.addEventListener("change", onChange);
  Object.assign(panel.extra, { model, budget });
  controls.append(model, budget);
}

const plusMinus = (value, stderr) => (value === null || value === undefined ? "—"
  : `${fmt(value)} ± ${fmt(stderr, 2)}`);

/* The plan for one selected model with pruning_drops, for the chosen budget n: the measured
 * best, Block Influence's and Gromov's choices with their measured costs, and the predictors'
 * rank correlations with the measured drops (GET /models/{id}/pruning-plan). A model with
 * intervention but no pruning_drops has the plan for n = 1 (its single-block drops). */
export async function drawPruningPlan(panel) {
  const ticket = panel.ticket;
  const { model, budget } = panel.extra;
  const candidates = state.selectedModels()
    .filter((m) => state.runFor(m, "pruning_drops") !== undefined
      || state.runFor(m, "intervention") !== undefined);
  const current = Number(model.value);
  model.replaceChildren(...candidates.map((m) => el("option", { value: m.id, text: m.name })));
  const m = candidates.find((c) => c.id === current) || candidates[0];
  if (!m) {
    const names = state.selectedModels().map((s) => s.name);
    const example = names.length ? names[0] : "MODEL";
    budget.replaceChildren();
    panel.body.replaceChildren(el("p", { class: "hint empty-state", text:
      `No pruning results for ${names.join(", ")}: the plan needs the pruning and `
      + "pruning_drops families (opt-in). Compute them with the jobs box (families: pruning, "
      + `pruning_drops) or \`strata jobs submit --model ${example} --metrics `
      + "pruning,pruning_drops`." }));
    return { state: "empty", links: [], note: "no pruning results for the selected models" };
  }
  model.value = String(m.id);
  const top = Math.max(1, Math.floor((m.n_layers || 2) / 2));
  const drops = state.runFor(m, "pruning_drops") !== undefined;
  const n = !drops || budget.value === "" ? 1 : Math.min(Number(budget.value), top);
  // the run a person chose for the model (kept: it never changes), else the canonical one
  const chosen = state.chosenRun(m.id) === undefined ? undefined
    : state.runFor(m, drops ? "pruning_drops" : "intervention");
  const target = url(`/models/${m.id}/pruning-plan`, { n, run_id: chosen });
  const answer = await get(target, chosen !== undefined);
  if (ticket !== panel.ticket) return null;
  budget.replaceChildren(...answer.widths.map((w) => el("option", { value: w,
    text: `n = ${w} block${w > 1 ? "s" : ""}` })));
  budget.value = String(answer.n);
  const head = el("tr", {}, ...["choice", "blocks removed", "KL (nats)", "KL above best",
    "top-1 agreement", "loss delta (nats)", "note"].map((h) => el("th", { text: h })));
  const rows = answer.rows.map((r) => el("tr", { "data-choice": r.choice },
    el("td", { text: CHOICE_LABELS[r.choice] ?? r.choice, title: r.rule }),
    el("td", { class: "blocks", text: r.blocks ? r.blocks.join(", ") : "—" }),
    el("td", { class: "kl", text: plusMinus(r.kl, r.kl_stderr) }),
    el("td", { text: fmt(r.kl_excess) }),
    el("td", { text: plusMinus(r.top1_agreement, r.top1_agreement_stderr) }),
    el("td", { text: plusMinus(r.loss_delta, r.loss_delta_stderr) }),
    el("td", { class: "evidence", text: r.note ?? (r.same_as_measured ? "the measured best" : "") })));
  const wanted = new Set([1, answer.n]);
  const scoreHead = el("tr", {}, ...["predictor", "n", "ρ with measured KL",
    `${Math.round((answer.scores[0]?.level ?? 0.9) * 100)}% interval`, "predicts?"]
    .map((h) => el("th", { text: h })));
  const scoreRows = answer.scores.filter((s) => wanted.has(s.n)).map((s) => el("tr",
    { "data-predictor": s.predictor, "data-n": s.n },
    el("td", { text: PREDICTOR_LABELS[s.predictor] ?? s.predictor }), el("td", { text: s.n }),
    el("td", { class: "rho", text: fmt(s.rho, 3) }),
    el("td", { text: `[${fmt(s.low, 3)}, ${fmt(s.high, 3)}]` }),
    el("td", { text: s.predicts === null ? "—" : s.predicts ? "yes (interval > 0)" : "no" })));
  const run = answer.run;
  panel.body.replaceChildren(
    el("p", { class: "muted", text: `${m.name}: budget n = ${answer.n} of ${m.n_layers} blocks `
      + `· run ${run.id} (${run.selected_by}, ${run.n_sequences ?? "?"} sequences) · `
      + answer.tie_rule }),
    el("table", { class: "pruning-choices" }, el("thead", {}, head), el("tbody", {}, ...rows)),
    el("table", { class: "pruning-scores" }, el("thead", {}, scoreHead),
      el("tbody", {}, ...scoreRows)));
  const notes = [];
  if (answer.costs_from !== "pruning_drops") {
    notes.push(`n = 1 from the ${answer.costs_from} family's single-block drops; wider budgets `
      + `need pruning_drops (strata jobs submit --model ${m.name} --metrics pruning,pruning_drops)`);
  }
  if (!answer.predictor_run) {
    notes.push("no pruning run: Block Influence and Gromov choices need the pruning family");
  }
  return { state: "drawn", links: [[`${m.name} pruning plan n=${answer.n}`, target]],
    note: notes.join("; ") };
}
