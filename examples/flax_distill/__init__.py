"""On-policy distillation in flax nnx on the GRPO example's multi-turn cue task: a student distilled from a
fixed teacher, its log-probs of the student's own tokens as a dense reward (on-policy distillation as verl computes it
(verl-project/verl @ 1dda039b, verl/trainer/distillation/losses.py) and AReaL's MOPD (areal/trainer/mopd/loss.py)).

``python -m examples.flax_distill --steps 60`` trains one student per way of using the teacher and writes
their learning curves. See the credit guide's "On-policy distillation".
"""
