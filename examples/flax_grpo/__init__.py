"""A GRPO trainer in flax nnx on a toy multi-turn task, with process rewards from a prm-jax scorer.

``python -m examples.flax_grpo --mode gvpo --steps 100`` trains one policy; ``--compare`` trains every
shaping mode and outcome-only over a few seeds and writes a learning-curve plot. See the README.
"""
