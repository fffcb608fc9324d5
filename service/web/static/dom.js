/* Small helpers to build elements and format values. */

/* An element: `class`, `text`, `on<event>` handlers and other attributes (false/null: absent). */
export function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k === "text") node.textContent = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== false && v !== null && v !== undefined) node.setAttribute(k, v === true ? "" : v);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

/* Options for `values`: each a value, or a [value, label] pair. */
export function optionList(values, current) {
  return values.map((item) => {
    const [v, label] = Array.isArray(item) ? item : [item, item];
    return el("option", { value: v, text: label, selected: v === current });
  });
}

export function fmt(v, digits = 4) {
  if (v === null || v === undefined) return "—";
  if (typeof v !== "number") return String(v);
  if (Number.isInteger(v)) return String(v);
  return Math.abs(v) >= 1e4 || (Math.abs(v) < 1e-3 && v !== 0) ? v.toExponential(2)
    : v.toPrecision(digits);
}

/* A boundary's evidence as HTML lines (hover text, the stage table). */
export function evidenceText(evidence, depth = 0) {
  const lines = [];
  for (const [k, v] of Object.entries(evidence || {})) {
    if (v && typeof v === "object" && !Array.isArray(v)) {
      if (depth < 2) {  // nested evidence (signals: {drop_kl: {...}}) on one line each
        const inner = evidenceText(v, depth + 1).split("<br>");
        lines.push(depth === 0 ? `${k}: ${inner.join("; ")}` : `${k} (${inner.join(", ")})`);
      }
    } else if (Array.isArray(v)) {
      lines.push(`${k}: [${v.slice(0, 8).map((x) => fmt(x, 3)).join(", ")}${v.length > 8 ? ", …" : ""}]`);
    } else {
      lines.push(`${k}: ${fmt(v, 3)}`);
    }
  }
  return lines.join("<br>");
}
