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
