/* What the plots of the dashboard (plots.js) and of the refit family page (family.js) share:
 * Plotly's configuration, the margins that keep Plotly's mode-bar (its toolbar, drawn upright
 * in a gutter of its own at the plot's right edge) off titles, legends and colour bars, the
 * legend in the bottom margin under the x-axis title, and the caption of the stability error
 * bars (the same words on both pages).
 */

/* Pixels kept free at the right of every plot for the upright mode-bar (about 26 px wide). */
export const MODEBAR_GUTTER = 40;

export const PLOT_CONFIG = { displaylogo: false, responsive: true,
  modeBarButtonsToRemove: ["select2d", "lasso2d"] };

/* Under the x axis: its tick labels and its title, then the legend. */
const AXIS_BELOW = 50;
const LEGEND_ROW = 20;

/* How many rows a horizontal legend of these entries takes in `width` pixels (an estimate:
 * Plotly's 12 px legend font, the entry's line sample and gaps). */
function legendRows(names, width) {
  let rows = 1, used = 0;
  for (const name of names) {
    const item = 46 + 7.2 * String(name).length;
    if (used > 0 && used + item > width) { rows += 1; used = 0; }
    used += item;
  }
  return rows;
}

/* Height, margins and legend of a line plot `width` pixels wide whose legend lists `names`
 * (none: no legend): the legend sits at the bottom of the figure, below the x-axis title, and
 * the figure grows by a row for each row of it; the mode-bar stands in its right gutter. */
export function lineFrame(names, width, { left = 60, top = 20, height = 280 } = {}) {
  const rows = names.length ? legendRows(names, Math.max(width - left, 200)) : 0;
  return {
    height: height + rows * LEGEND_ROW,
    margin: { l: left, r: MODEBAR_GUTTER, t: top, b: AXIS_BELOW + rows * LEGEND_ROW },
    modebar: { orientation: "v" },
    legend: { orientation: "h", x: 0, xanchor: "left", y: 0, yref: "container",
      yanchor: "bottom" },
    showlegend: names.length > 0,
  };
}

/* Margins of heat maps with a colour bar on the right: the bar, its tick labels, then the
 * mode-bar's gutter. */
export function heatmapFrame({ left = 60, top = 30, bottom = 40 } = {}) {
  return { margin: { l: left, r: 80 + MODEBAR_GUTTER, t: top, b: bottom },
    modebar: { orientation: "v" } };
}

/* A heat map's colour bar, just right of the plot area, clear of the mode-bar's gutter. */
export function colorbar(unit) {
  return { title: { text: unit, side: "top" }, x: 1, xanchor: "left", xpad: 12, thickness: 16 };
}

/* The stability panels' error bars, on `/` and `/family` alike: per layer, `heads.stability` is
 * the mean over the layer's heads (it has no stderr); its spread is `heads.stability_std`, the
 * population std over those heads (docs/metrics.md; `_null_std` for the null). */
export const STABILITY_BARS = "± std over the layer's heads (heads.stability_std, a spread "
  + "across heads, not a standard error)";
