"""The application floor: config files, the JSONL session format, the ``prm-jax`` command line and its
report. It builds on the runtime and the kernels; nothing below imports it."""
