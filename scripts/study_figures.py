"""Draw a model's per-layer study figures from a running Strata service's answers.

    .venv/bin/python scripts/study_figures.py --url http://127.0.0.1:8000 \
        --model SmolLM2-135M-Instruct.Q4_1 --compare demo-4l --out docs/study-smollm2

Every number comes from the HTTP API through the project's client (`service.client.Client`):
nothing is recomputed here. Error bars are the API's standard errors (sequences as the unit);
stage boundaries are drawn at their layer with their bootstrap interval shaded. Figures (PNG):

  interventions.png   drop and swap: KL and top-1 agreement by layer
  components.png      attention-only vs MLP-only ablation (drop_attn, drop_mlp) KL
  logit_lens.png      logit-lens KL to the final prediction, entropy, top-1 agreement
  tuned_lens.png      the same three for the tuned lens, the logit lens dotted beside it
  neurons.png         prediction and suppression neurons by depth (calibrated and fixed)
  similarity.png      component-output cosines under adjacent swaps (self, index, adjacent)
  attention.png       attention locality (prev_k) and the sink score (bos) by layer, each
                      with its chance level (uniform causal attention) dotted
  induction.png       induction score of every head (layer x head)
  compare.png         drop KL and logit-lens KL against --compare models on relative depth
Figures whose metrics the model has no run for are skipped (and listed).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import matplotlib  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import polars as pl  # noqa: E402

from service.client import ApiError, Client  # noqa: E402


def curve(client: Client, model: str, metric: str, component: str | None = None
          ) -> pl.DataFrame | None:
    try:
        frame = client.metrics(model, metric, component)
    except ApiError:
        return None
    if frame.is_empty():
        return None
    if "head" in frame.columns:
        frame = frame.filter(pl.col("head").is_null())
    return frame.sort("layer")


def errorbar(ax: Any, frame: pl.DataFrame | None, label: str, x: str = "layer",
             **style: Any) -> None:
    if frame is None:
        return
    err = frame["stderr"].fill_null(0.0).to_list() if "stderr" in frame.columns else None
    ax.errorbar(frame[x].to_list(), frame["value"].to_list(), yerr=err, label=label, capsize=2,
                marker="o", markersize=3, linewidth=1.2, **style)


def attention_chance(client: Client, model: str) -> dict[str, float]:
    """The chance level of each attention metric at the sequence length of the model's current
    attention run (`compute.metrics.attention.chance_levels`: uniform causal attention)."""
    from compute.metrics.attention import chance_levels

    run_id = client.current_runs(model).get("attention")
    if run_id is None:
        return {}
    config = client.run(run_id).config
    return chance_levels(int(config["tokens"]["seq_len"]), (1, 2, 4, 5, 8, 16))


def stage_lines(client: Client, model: str, axes: list[Any]) -> None:
    """Each boundary found: a dashed line at its layer and its bootstrap interval shaded."""
    try:
        boundaries = client.stages(model).boundaries
    except ApiError:
        return
    for b in boundaries.filter(boundaries["found"]).iter_rows(named=True):
        low, high = b["interval_low"], b["interval_high"]
        for ax in axes:
            if low is not None and high is not None:
                ax.axvspan(low - 0.5, high + 0.5, color="grey", alpha=0.12)
            if b["layer"] is not None:
                ax.axvline(b["layer"] - 0.5, color="grey", linestyle="--", linewidth=0.8)


def figure(path: Path, rows: int, title: str, draw: Callable[[list[Any]], bool]) -> bool:
    fig, axes = plt.subplots(rows, 1, figsize=(8, 2.8 * rows), sharex=True, squeeze=False)
    flat = list(axes[:, 0])
    ok = draw(flat)
    if ok:
        fig.suptitle(title)
        for ax in flat:
            ax.grid(alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
        if not flat[-1].get_xlabel():
            flat[-1].set_xlabel("layer")
        fig.tight_layout()
        fig.savefig(path, dpi=110)
    plt.close(fig)
    return ok


def draw_all(client: Client, model: str, compare: list[str], out: Path) -> list[str]:
    out.mkdir(parents=True, exist_ok=True)
    made: list[str] = []

    def interventions(ax: list[Any]) -> bool:
        frames = {k: curve(client, model, m, k) for k in ("drop", "swap")
                  for m in ("intervention.kl",)}
        if all(f is None for f in frames.values()):
            return False
        for kind in ("drop", "swap"):
            errorbar(ax[0], curve(client, model, "intervention.kl", kind), kind)
            errorbar(ax[1], curve(client, model, "intervention.top1_agreement", kind), kind)
        ax[0].set_ylabel("KL(P||Q), nats")
        ax[0].set_yscale("log")
        ax[1].set_ylabel("top-1 agreement")
        stage_lines(client, model, ax)
        return True

    def components(ax: list[Any]) -> bool:
        a = curve(client, model, "intervention.kl", "drop_attn")
        m = curve(client, model, "intervention.kl", "drop_mlp")
        if a is None and m is None:
            return False
        errorbar(ax[0], a, "attention only zeroed (drop_attn)")
        errorbar(ax[0], m, "MLP only zeroed (drop_mlp)")
        ax[0].set_ylabel("KL(P||Q), nats")
        ax[0].set_yscale("log")
        stage_lines(client, model, ax)
        return True

    def lens(ax: list[Any]) -> bool:
        kl = curve(client, model, "logit_lens.kl_to_final")
        if kl is None:
            return False
        errorbar(ax[0], kl, "KL to final")
        ax[0].set_ylabel("nats")
        ax[0].set_yscale("symlog", linthresh=1.0)
        errorbar(ax[1], curve(client, model, "logit_lens.entropy"), "entropy")
        ax[1].set_ylabel("bits")
        errorbar(ax[2], curve(client, model, "logit_lens.top1_agreement"), "top-1 agreement")
        ax[2].set_ylabel("fraction")
        ax[2].set_xlabel("lens point i (0 = embeddings, i = after block i-1)")
        return True

    def tuned(ax: list[Any]) -> bool:
        """The tuned lens beside the raw lens, metric by metric, on the same axes."""
        if curve(client, model, "tuned_lens.kl_to_final") is None:
            return False
        for row, (name, unit) in enumerate((("kl_to_final", "nats"), ("entropy", "bits"),
                                            ("top1_agreement", "fraction"))):
            errorbar(ax[row], curve(client, model, f"tuned_lens.{name}"), f"tuned lens {name}")
            errorbar(ax[row], curve(client, model, f"logit_lens.{name}"), f"logit lens {name}",
                     linestyle=":")
            ax[row].set_ylabel(unit)
        ax[0].set_yscale("symlog", linthresh=1.0)
        ax[2].set_xlabel("lens point i (0 = embeddings, i = after block i-1)")
        return True

    def neurons(ax: list[Any]) -> bool:
        drawn = False
        for suffix, style in (("_cal", "-"), ("", ":")):
            for cls in ("prediction", "suppression"):
                frame = curve(client, model, f"neurons.n_{cls}{suffix}")
                if frame is not None:
                    drawn = True
                    name = "calibrated" if suffix else "fixed (kurt > 10)"
                    ax[0].plot(frame["layer"].to_list(), frame["value"].to_list(), style,
                               marker="o", markersize=3, label=f"{cls}, {name}")
        ax[0].set_ylabel("neurons")
        stage_lines(client, model, ax)
        return drawn

    def similarity(ax: list[Any]) -> bool:
        drawn = False
        for i, comp in enumerate(("attn", "mlp")):
            for m in ("self", "index", "adjacent"):
                frame = curve(client, model, f"similarity.{m}", comp)
                if frame is not None:
                    drawn = True
                    errorbar(ax[i], frame, m)
            ax[i].set_ylabel(f"{comp} cosine")
        return drawn

    def attention(ax: list[Any]) -> bool:
        drawn = False
        chance = attention_chance(client, model)
        for k in (1, 2, 4, 8, 16):
            frame = curve(client, model, f"attention.prev_{k}")
            if frame is not None:
                drawn = True
                errorbar(ax[0], frame, f"prev_{k}")
                color = ax[0].get_lines()[-1].get_color()
                if f"prev_{k}" in chance:
                    ax[0].axhline(chance[f"prev_{k}"], color=color, linestyle=":", linewidth=1)
        ax[0].set_ylabel("attention on previous k\n(dotted: uniform attention)")
        errorbar(ax[1], curve(client, model, "attention.bos"), "bos (sink)")
        if "bos" in chance:
            ax[1].axhline(chance["bos"], color="grey", linestyle=":", linewidth=1,
                          label=f"uniform attention ({chance['bos']:.3f})")
        ax[1].set_ylabel("attention on BOS")
        stage_lines(client, model, ax)
        return drawn

    def induction(ax: list[Any]) -> bool:
        try:
            heads = client.heads(model, "heads.induction")
        except ApiError:
            return False
        if heads.is_empty():
            return False
        grid = heads.pivot(index="layer", on="head", values="value").sort("layer")
        values = grid.drop("layer").to_numpy()
        image = ax[0].imshow(values.T, aspect="auto", origin="lower", cmap="viridis",
                             vmin=0, vmax=max(0.5, float(values.max())))
        ax[0].set_ylabel("head")
        plt.colorbar(image, ax=ax[0], label="induction score")
        return True

    def comparison(ax: list[Any]) -> bool:
        drawn = False
        for name in [model, *compare]:
            drop = curve(client, name, "intervention.kl", "drop")
            lens_kl = curve(client, name, "logit_lens.kl_to_final")
            if drop is not None:
                drawn = True
                errorbar(ax[0], drop, name, x="relative_depth")
            if lens_kl is not None:
                errorbar(ax[1], lens_kl, name, x="relative_depth")
        ax[0].set_ylabel("drop KL, nats")
        ax[0].set_yscale("log")
        ax[1].set_ylabel("lens KL to final, nats")
        ax[1].set_xlabel("relative depth (l/(L-1) for blocks, i/L for lens points)")
        ax[1].set_yscale("symlog", linthresh=1.0)
        return drawn

    plan: list[tuple[str, int, str, Callable[[list[Any]], bool]]] = [
        ("interventions.png", 2, "drop and swap", interventions),
        ("components.png", 1, "attention-only vs MLP-only ablation", components),
        ("logit_lens.png", 3, "logit lens", lens),
        ("tuned_lens.png", 3, "tuned lens beside the logit lens", tuned),
        ("neurons.png", 1, "prediction and suppression neurons", neurons),
        ("similarity.png", 2, "component outputs under adjacent swaps", similarity),
        ("attention.png", 2, "attention locality and sink", attention),
        ("induction.png", 1, "induction heads", induction),
        ("compare.png", 2, "against other models, on relative depth", comparison),
    ]
    for file, rows, title, draw in plan:
        if figure(out / file, rows, f"{model}: {title}", draw):
            made.append(file)
        else:
            print(f"skipped {file}: no results for it", file=sys.stderr)
    return made


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--compare", default="", help="comma-separated models to draw beside")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with Client(args.url) as client:
        made = draw_all(client, args.model, [m for m in args.compare.split(",") if m],
                        args.out)
    print("\n".join(str(args.out / f) for f in made))


if __name__ == "__main__":
    main()
