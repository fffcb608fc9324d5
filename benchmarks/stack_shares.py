"""Where a profiled `strata compute` spent its sweep: shares of py-spy's samples by part.

    .venv/bin/py-spy record -r 50 -f raw -o build/prof/run.txt -- \\
        .venv/bin/strata compute --model "$GGUF" --dtype bfloat16 --n-sequences 3 --seq-len 128 \\
        --quiet --out build/prof/run.parquet
    .venv/bin/python benchmarks/stack_shares.py build/prof/run.txt

Reads py-spy's raw (collapsed) output: one line per distinct stack, frames separated by `;`,
then the sample count. Of the samples inside `compute.engine.sweep`, those of the neurons family
are set aside (it reads weights only: a fixed cost, not the sweep's), and the rest are counted by
the innermost part of Strata they fall in:

  logit reductions   anything under compute/reduce.py: the unembedding's columns, their casts
                     and the softmax / logsumexp / KL / entropy over the vocabulary
    of which matmul  the unembedding's columns themselves (`logit_columns`)
  blocks             a transformer block (compute/blocks.py, or TransformerLens's blocks)
  other              the rest (the families' own bookkeeping, accumulators, OpenMP waits
                     outside both)

The logit reductions' share is issue 37's measure (54% of a bfloat16 SmolLM2 sweep before the
fused reductions, on the AMX Xeon).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path


def stacks(path: Path) -> Iterator[tuple[list[str], int]]:
    """(frames outermost first, samples) per stack of py-spy's raw output. With
    `--subprocesses` a process frame holds its command line, newlines included, so a stack may
    span lines: each ends at its sample count."""
    pending = ""
    for line in path.read_text(errors="replace").splitlines():
        pending = f"{pending}\n{line}" if pending else line
        text, _, count = pending.rpartition(" ")
        if text and count.isdigit():
            yield text.split(";"), int(count)
            pending = ""


def part_of(frames: list[str]) -> str | None:
    """The part of the sweep a stack belongs to, or None outside the sweep or in neurons."""
    if not any(f.startswith("sweep (compute/engine.py") for f in frames):
        return None
    if any("compute/metrics/neurons" in f for f in frames):
        return None
    if any("compute/reduce.py" in f for f in frames):
        if any(f.startswith("LoadedModel.logit_columns") for f in frames):
            return "logit reductions: matmul"
        return "logit reductions: the rest"
    if any("compute/blocks.py" in f or "transformer_lens/model_bridge" in f for f in frames):
        return "blocks"
    return "other"


def shares(path: Path) -> dict[str, object]:
    counts: Counter[str] = Counter()
    total = 0
    for frames, n in stacks(path):
        total += n
        part = part_of(frames)
        if part is not None:
            counts[part] += n
    swept = sum(counts.values())
    reductions = counts["logit reductions: matmul"] + counts["logit reductions: the rest"]
    return {
        "samples": total,
        "sweep_samples_without_neurons": swept,
        "logit_reductions": reductions / swept if swept else 0.0,
        **{part: n / swept for part, n in sorted(counts.items())},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("profiles", nargs="+", type=Path, help="py-spy raw files")
    args = parser.parse_args()
    for path in args.profiles:
        result = shares(path)
        print(path)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
