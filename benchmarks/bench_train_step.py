#!/usr/bin/env python3
"""The README's jitted train step, with and without `compute_advantages` inside, and its host callbacks.

  python benchmarks/bench_train_step.py [--rows 64] [--width 2048] [--vocab 256] [--repeats 20]
                                        [--check-values off|counts|callback] [--losses]

Prints the median step time with the call, without it (the same step on advantages computed once outside),
the call's share, and the number of host callbacks in the compiled step (each is a device-to-host round
trip per step). `--check-values`: `off` compiles the value checks out (`check_values=False`, the default
here), `counts` returns them as counts (`check_values=True`, the library's default: no callback),
`callback` raises from a host callback (`check_values="callback"`).

`--losses` times instead each policy loss of `prm_jax.losses` (every `policy_loss` mode, verl's names, and
TRL's `gspo_sequence_loss`) beside `ppo_clip_loss`: the jitted loss and its gradient with respect to the
log-probs, on the same `[rows, width]` arrays, interleaved in one run; the median of each and its ratio to
`ppo_clip_loss`'s; and the floors of the two losses that select tokens (a uniform draw per token, a top-k of
all tokens), measured alike.
"""

from __future__ import annotations

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
from bench_advantages import interleaved_medians

import prm_jax

CHECKS = {"off": False, "counts": True, "callback": "callback"}
# The options a loss needs beyond the four arrays (dro has no default for its beta, clip_cov draws its
# tokens with a key).
LOSS_OPTIONS = {"dro": {"dro_beta": 1e-3}, "clip_cov": {"key": jax.random.key(0)}}


def time_losses(rows: int, width: int, repeats: int) -> None:
    """Each loss with its gradient, beside ``ppo_clip_loss``'s (``--losses``)."""
    from prm_jax import losses
    rng = np.random.default_rng(1)
    mask = jnp.asarray((np.arange(width)[None] < rng.integers(width // 2, width + 1, size=rows)[:, None]), jnp.float32)
    proximal = jnp.asarray(-rng.exponential(size=(rows, width)), jnp.float32)
    logprobs = proximal + jnp.asarray(rng.normal(0.0, 0.1, (rows, width)), jnp.float32)
    advantages = jnp.asarray(rng.normal(size=(rows, width)), jnp.float32)

    def with_gradient(loss):
        return jax.jit(jax.value_and_grad(lambda lp: loss(lp)[0]))

    steps = {"ppo_clip_loss": with_gradient(lambda lp: losses.ppo_clip_loss(lp, proximal, advantages, mask))}
    for mode in losses.POLICY_LOSS_MODES:
        steps[f"policy_loss({mode})"] = with_gradient(lambda lp, mode=mode: losses.policy_loss(
            lp, proximal, advantages, mask, mode=mode, **LOSS_OPTIONS.get(mode, {})))
    steps["gspo_sequence_loss"] = with_gradient(  # (TRL's: one advantage per sequence)
        lambda lp: losses.gspo_sequence_loss(lp, proximal, advantages[:, 0], mask))
    # The floors of the two selecting losses, in the same run: clip_cov draws a uniform number per token (verl
    # draws a random permutation), and both take a top-k of the tokens (k = 0.02% of them, verl's default).
    key = jax.random.key(0)
    steps["floor: random.uniform [B, T]"] = jax.jit(lambda lp: jax.random.uniform(key, lp.shape))
    steps["floor: top_k of B*T"] = jax.jit(lambda lp: jax.lax.top_k(-lp.ravel(), int(lp.size * 2e-4) + 1))
    timed = interleaved_medians({name: (lambda step=step: step(logprobs)) for name, step in steps.items()}, repeats)
    base = timed["ppo_clip_loss"]
    print(f"backend={jax.default_backend()} loss and gradient, {rows}x{width} (medians of {repeats} interleaved rounds)")
    for name, seconds in timed.items():
        print(f"{name:<28} {seconds * 1e3:9.3f} ms  {seconds / base:5.2f}x ppo_clip_loss")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--check-values", choices=sorted(CHECKS), default="off", help="the value checks' form")
    parser.add_argument("--losses", action="store_true", help="time each policy loss beside ppo_clip_loss")
    args = parser.parse_args()
    if args.losses:
        time_losses(args.rows, args.width, args.repeats)
        return
    rng = np.random.default_rng(0)
    rows, width = args.rows, args.width
    lengths = rng.integers(width // 2, width + 1, size=rows)
    attention = (np.arange(width)[None] < lengths[:, None]).astype(np.int32)
    loss_mask = attention * (np.arange(width)[None] >= width // 8)
    batch = jax.device_put(dict(
        input_ids=rng.integers(0, args.vocab, size=(rows, width)).astype(np.int32), attention_mask=attention,
        loss_mask=loss_mask.astype(np.int32), logprobs=(-rng.exponential(size=(rows, width))).astype(np.float32),
        token_rewards=(rng.random((rows, width)) * loss_mask).astype(np.float32),
        rewards=rng.choice([0.0, 1.0], size=rows).astype(np.float32), is_truncated=lengths == width,
        group_sizes=np.full(rows // 8, 8, np.int32)))
    config = prm_jax.AdvantageConfig(kl_ctl=0.0, adv_norm=prm_jax.NormConfig("batch", "batch"),
                                     advantage_shaping=prm_jax.ShapingConfig("process_weighted"),
                                     check_values=CHECKS[args.check_values])
    params = jnp.asarray(rng.normal(size=(args.vocab, args.vocab)) * 0.01, jnp.float32)

    def policy_logprobs(params, input_ids):
        logp = jax.nn.log_softmax(params[input_ids[:, :-1]], axis=-1)
        taken = jnp.take_along_axis(logp, input_ids[:, 1:, None], axis=-1)[..., 0]
        return jnp.pad(taken, ((0, 0), (0, 1)))

    def update(params, batch, adv):
        def loss_fn(p):
            ratio = jnp.exp(policy_logprobs(p, batch["input_ids"]) - adv.logprobs)
            clipped = jnp.clip(ratio, 0.8, 1.2)
            per_token = -jnp.minimum(ratio * adv.advantages, clipped * adv.advantages)
            return (per_token * adv.loss_mask).sum() / jnp.maximum(adv.loss_mask.sum(), 1.0)
        loss, grads = jax.value_and_grad(loss_fn)(params)
        return params - 0.1 * grads, loss

    with_call = jax.jit(lambda p, b: update(p, b, prm_jax.compute_advantages(b, config)))
    precomputed = prm_jax.compute_advantages(batch, config)
    without_call = jax.jit(lambda p, b, adv: update(p, b, adv))
    start = time.perf_counter()
    with_call.lower(params, batch).compile()
    compile_s = time.perf_counter() - start
    jaxpr = jax.make_jaxpr(lambda p, b: update(p, b, prm_jax.compute_advantages(b, config)))(params, batch)
    callbacks = sum(eqn.primitive.name in ("debug_callback", "pure_callback", "io_callback")
                    for eqn in jaxpr.jaxpr.eqns)

    timed = interleaved_medians({"with": lambda: with_call(params, batch),
                                 "without": lambda: without_call(params, batch, precomputed)}, args.repeats, inner=1)
    t_with, t_without = timed["with"], timed["without"]
    print(f"backend={jax.default_backend()} batch {rows}x{width} vocab {args.vocab} check_values={args.check_values}")
    print(f"train step with compute_advantages: {t_with * 1e3:.3f} ms; without: {t_without * 1e3:.3f} ms; "
          f"the call's share {(t_with - t_without) / t_with:.1%}; compile {compile_s:.2f} s")
    print(f"host callbacks in the step: {callbacks}")


if __name__ == "__main__":
    main()
