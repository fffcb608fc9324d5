"""The tiny model zoo: GPT-2-style models trained on the built-in corpus, shipped as checkpoints.

`compute.zoo.tokenizer` trains the shared byte-level BPE; `compute.zoo.train` trains a model and
writes a self-contained checkpoint directory (`checkpoints/<name>/`) that `compute.models` loads
through TransformerLens. Shipped: `tiny-4l-s0`, `tiny-4l-s1` (4 layers, AdamW, seeds 0 and 1)
and `tiny-2l-s0` (2 layers, plain Adam). Each directory's `strata_zoo.json` records how it was
trained and its validation loss.
"""
