"""On-policy distillation in flax nnx on the GRPO example's multi-turn cue task: a student distilled from a
fixed teacher, its log-probs of the student's own tokens as a dense reward (``../shared/CREDIT2.md`` 3).

``python -m examples.flax_distill --steps 60`` trains one student per way of using the teacher and writes
their learning curves. See the credit guide's "On-policy distillation".
"""
