#!/usr/bin/env python3
"""A jitted train step with and without `compute_advantages` and a policy loss inside, and its host round trips.

  python benchmarks/bench_train_step.py [--rows 64] [--width 2048] [--vocab 256] [--repeats 20]
                                        [--check-values off|counts|callback] [--losses]

Prints the median step time of three forms of one PPO update (a softmax policy's log-probs, the clipped
surrogate, its gradient, an SGD step), interleaved in one run: `compute_advantages` and
`prm_jax.losses.ppo_clip_loss` inside the step; the library's loss on advantages computed once outside;
neither (those advantages and the clipped surrogate written by hand in four lines). Then each one's share,
the compile time, and the host round trips in the compiled step: host callbacks (a custom call whose target
names a callback) and send/recv/infeed/outfeed in its optimized HLO, each a device-to-host round trip per
step. `--check-values`: `off` compiles the value checks out (`check_values=False`, the default
here), `counts` returns them as counts (`check_values=True`, the library's default: no callback),
`callback` raises from a host callback (`check_values="callback"`). The exit status is 1 when a step
compiled with `off` or `counts` has a host round trip.

`--losses` times instead each policy loss of `prm_jax.losses` (every `policy_loss` mode, verl's names, and
TRL's `gspo_sequence_loss`) beside `ppo_clip_loss`: the jitted loss and its gradient with respect to the
log-probs, on the same `[rows, width]` arrays, interleaved in one run; the median of each and its ratio to
`ppo_clip_loss`'s; and the floors of the two losses that select tokens (a uniform draw per token, a top-k of
all tokens), measured alike.
"""

from __future__ import annotations

import argparse
import collections
import re
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

    def hand_loss(logprobs, adv):  # the clipped surrogate as a user writes it (the "neither" form)
        ratio = jnp.exp(logprobs - adv.logprobs)
        clipped = jnp.clip(ratio, 0.8, 1.2)
        per_token = -jnp.minimum(ratio * adv.advantages, clipped * adv.advantages)
        return (per_token * adv.loss_mask).sum() / jnp.maximum(adv.loss_mask.sum(), 1.0)

    def library_loss(logprobs, adv):
        return prm_jax.losses.ppo_clip_loss(logprobs, adv.logprobs, adv.advantages, adv.loss_mask, eps_clip=0.2)[0]

    def update(params, batch, adv, loss):
        loss_value, grads = jax.value_and_grad(lambda p: loss(policy_logprobs(p, batch["input_ids"]), adv))(params)
        return params - 0.1 * grads, loss_value

    def full_step(p, b):
        return update(p, b, prm_jax.compute_advantages(b, config), library_loss)

    steps = {"compute_advantages + ppo_clip_loss": jax.jit(full_step),
             "ppo_clip_loss only": jax.jit(lambda p, b, adv: update(p, b, adv, library_loss)),
             "neither (hand-written loss)": jax.jit(lambda p, b, adv: update(p, b, adv, hand_loss))}
    precomputed = prm_jax.compute_advantages(batch, config)
    start = time.perf_counter()
    compiled = steps["compute_advantages + ppo_clip_loss"].lower(params, batch).compile()
    compile_s = time.perf_counter() - start
    trips = host_round_trips(compiled.as_text())
    args_of = {"compute_advantages + ppo_clip_loss": (params, batch)}
    timed = interleaved_medians({name: (lambda step=step, a=args_of.get(name, (params, batch, precomputed)): step(*a))
                                 for name, step in steps.items()}, args.repeats, inner=1)
    full, neither = timed["compute_advantages + ppo_clip_loss"], timed["neither (hand-written loss)"]
    print(f"backend={jax.default_backend()} batch {rows}x{width} vocab {args.vocab} check_values={args.check_values}")
    for name, seconds in timed.items():
        print(f"train step, {name:<36} {seconds * 1e3:9.3f} ms  {seconds / neither:5.2f}x neither")
    print(f"the share of compute_advantages and the loss in the step: {(full - neither) / full:.1%} (compute_advantages "
          f"{(full - timed['ppo_clip_loss only']) / full:.1%}); compile {compile_s:.2f} s")
    print(f"host round trips in the compiled step: {sum(trips.values())} {dict(trips) or ''}".rstrip())
    if trips and args.check_values != "callback":  # only the callback form may leave the device
        raise SystemExit(f"a host round trip inside the step with check_values={args.check_values}: {dict(trips)}")


def host_round_trips(hlo: str) -> collections.Counter:
    """Host round trips in an optimized HLO module's text: custom calls whose target names a callback
    (``jax.debug.callback``, ``pure_callback``, ``io_callback`` on any backend) and send/recv/infeed/outfeed."""
    found = collections.Counter(re.findall(r'custom_call_target="([^"]*callback[^"]*)"', hlo))
    found.update(re.findall(r"= \S+ (send|recv|infeed|outfeed)\(", hlo))
    return found


if __name__ == "__main__":
    main()
