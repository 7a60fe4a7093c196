"""The runtime floor: trajectories, the scorer contract, the runner, export, host-side group filters,
device batches and metrics. It builds on ``prm_jax.kernels`` and knows nothing of files or the CLI."""
