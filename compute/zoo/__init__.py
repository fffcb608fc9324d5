"""The tiny model zoo: models shipped with Strata or built by its code.

- Trained checkpoints (`checkpoints/<name>/`): GPT-2-style (or rotary GPT-NeoX) models trained
  on the built-in corpus by `compute.zoo.train`, with the shared byte-level BPE of
  `compute.zoo.tokenizer`. Each directory's `strata_zoo.json` records how it was trained and its
  validation loss. `tiny-4l-s0`, `tiny-4l-s1`, `tiny-2l-s0`, the refit family `fam4l-adamw-*`,
  and the demo model `demo-4l` (`compute.zoo.demo`: corpus plus synthetic repeated sequences,
  so that induction heads form; its measured figures are in its metadata).
- Planted controls (`compute.zoo.planted`): built from explicit weights with known answers —
  `planted-induction` (and refits `-s1`, `-s2`) and `planted-stages`.

`compute.zoo.describe` describes any of them without loading it (`strata zoo list` / `show`).
"""
