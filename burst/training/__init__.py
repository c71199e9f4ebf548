"""The training loop's side of burst: the Run, its steps, the failure guard, the sampler, AMP, metrics."""
