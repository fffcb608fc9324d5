"""The tuned lens (Belrose et al. 2023): per-point affine translators (`translators`), their
training on a run's token source (`training`) and the stored artifacts (`store`). The metric
family that evaluates a lens is `compute.metrics.tuned_lens`."""
