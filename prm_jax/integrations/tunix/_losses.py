"""prm-jax's policy losses in tunix: its PPO loss (``tunix_ppo_loss``, ``register_loss``) and every loss of
``prm_jax.losses`` under verl's mode names (``register_losses``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import jax
import jax.numpy as jnp

from prm_jax.kernels._policy_loss import LossAggMode
from prm_jax.kernels._verl_losses import PolicyLossMode

LOSS_NAME = "prm_jax_ppo"  # GRPOConfig(policy_loss_fn=LOSS_NAME) after register_loss()
# tunix's loss_agg_mode names -> prm_jax.losses' (and verl's), and whether the loss is then divided by the
# completion width C: tunix's "sequence-mean-token-scale" (Dr. GRPO's) divides each row's sum by C before
# the mean over non-empty rows (verl's seq-mean-token-sum-norm at its default scale, the padded width), and
# its "sequence-mean-token-sum-norm" divides the sum by the non-empty rows (verl's seq-mean-token-sum).
_AGG_MODES: dict[str, tuple[LossAggMode, bool]] = {
    "token-mean": ("token-mean", False), "sequence-mean-token-mean": ("seq-mean-token-mean", False),
    "seq-mean-token-sum": ("seq-mean-token-sum", False), "sequence-mean-token-sum-norm": ("seq-mean-token-sum", False),
    "sequence-mean-token-scale": ("seq-mean-token-sum", True)}


def _aggregated(loss: jax.Array, algo_config: Any, width: int) -> jax.Array:
    """The loss under tunix's ``loss_agg_mode`` (``_AGG_MODES``): divided by the completion width ``C`` for
    ``sequence-mean-token-scale``."""
    return loss / width if _AGG_MODES[algo_config.loss_agg_mode][1] else loss


def tunix_ppo_loss(model: Any, train_example: Any, algo_config: Any, pad_id: int, eos_id: int,
                   **kwargs: Any) -> tuple[Any, dict[str, Any]]:
    """tunix's policy-loss interface around ``prm_jax.losses.ppo_clip_loss`` (AReaL's clipped loss).

    The per-token log-probs come from tunix (``common.compute_per_token_logps``, completion token ``j`` at
    column ``j``, the advantages' layout); ``epsilon``, ``epsilon_high``, ``epsilon_c`` (the dual clip) and
    ``loss_agg_mode`` are read from tunix's ``GRPOConfig``. tunix's KL term (``beta``) is not part of
    AReaL's loss: ``beta`` must be 0 (a KL penalty goes into the rewards with ``kl_ctl`` instead).
    """
    from prm_jax import losses

    logprobs, proximal, advantages, mask = _tunix_loss_inputs(LOSS_NAME, model, train_example, algo_config, pad_id,
                                                              eos_id)
    loss, stats = losses.ppo_clip_loss(
        logprobs, proximal, advantages, mask,
        eps_clip=algo_config.epsilon, eps_clip_higher=getattr(algo_config, "epsilon_high", None),
        c_clip=getattr(algo_config, "epsilon_c", None), loss_agg_mode=_AGG_MODES[algo_config.loss_agg_mode][0])
    loss = _aggregated(loss, algo_config, mask.shape[1])
    return loss, {"kl": 0.0, "pg_loss": loss, "pg_clipfrac": stats.clip_fraction,
                  "pg_clipfrac_lower": stats.dual_clip_fraction, "ppo_kl": stats.approx_kl,
                  "is_ratio/mean": stats.importance_weight}


def register_loss() -> str:
    """Registers ``tunix_ppo_loss`` in tunix's policy-loss registry (once) and returns its name, for
    ``GRPOConfig(policy_loss_fn=...)``."""
    from tunix.rl import function_registry

    try:
        function_registry.get_policy_loss_fn(LOSS_NAME)
    except LookupError:  # not registered yet
        function_registry.register_policy_loss_fn(LOSS_NAME)(tunix_ppo_loss)
    return LOSS_NAME


# Every policy loss of prm_jax.losses under verl's mode names, by name in tunix's FunctionRegistry
# (register_losses): GRPOConfig(policy_loss_fn="prm_jax_cispo").
LOSS_PREFIX = "prm_jax_"


def tunix_policy_loss(mode: PolicyLossMode, **options: Any) -> Callable[..., tuple[Any, dict[str, Any]]]:
    """tunix's policy-loss interface around ``prm_jax.losses.policy_loss(..., mode=mode, **options)`` (verl's
    loss of that ``loss_mode``, its options with verl's names: ``clip_ratio_low``, ``dro_beta``, a
    ``key`` for ``clip_cov``, ...; an option the loss does not take is refused when the loss first runs).

    As ``tunix_ppo_loss``: tunix's per-token log-probs, ``old_per_token_logps`` (or the log-probs,
    stopped: on-policy) as the proximal ones, a ``[B]`` advantage broadcast over the completion, tunix's
    ``loss_agg_mode`` (its five names mapped to verl's, ``_AGG_MODES``; ``geo_mean``, GMPO, aggregates each sequence itself
    and ignores it), and ``beta`` must be 0.
    """
    from prm_jax import losses

    aggregates = "loss_agg_mode" in losses.policy_loss_options(mode)  # (geo_mean aggregates per sequence itself)
    name = f"{LOSS_PREFIX}{mode}"

    def loss_fn(model: Any, train_example: Any, algo_config: Any, pad_id: int, eos_id: int,
                **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        logprobs, proximal, advantages, mask = _tunix_loss_inputs(name, model, train_example, algo_config, pad_id,
                                                                  eos_id, aggregates=aggregates)
        aggregation = {"loss_agg_mode": _AGG_MODES[algo_config.loss_agg_mode][0]} if aggregates else {}
        loss, stats = losses.policy_loss(logprobs, proximal, advantages, mask, mode=mode, **aggregation, **options)
        if aggregates:
            loss = _aggregated(loss, algo_config, mask.shape[1])
        return loss, {"kl": 0.0, "pg_loss": loss, "pg_clipfrac": stats.pg_clipfrac,
                      "pg_clipfrac_lower": stats.pg_clipfrac_lower, "ppo_kl": stats.ppo_kl}

    loss_fn.__name__ = name
    return loss_fn


def _tunix_loss_inputs(name: str, model: Any, train_example: Any, algo_config: Any, pad_id: int, eos_id: int, *,
                       aggregates: bool = True) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    """``(logprobs, proximal, advantages [B, C], mask)`` of a tunix ``TrainExample`` (see ``tunix_ppo_loss``),
    after the checks of tunix's config every loss ``name`` makes: no KL term, and (where it ``aggregates``
    by ``loss_agg_mode``) one of tunix's aggregations (``_AGG_MODES``)."""
    from flax import nnx
    from tunix.rl import common

    if algo_config.beta != 0.0:
        raise ValueError(f"{name} has no KL term: set GRPOConfig(beta=0.0), got beta={algo_config.beta}")
    if aggregates and algo_config.loss_agg_mode not in _AGG_MODES:
        raise ValueError(f"{name} aggregates as {sorted(_AGG_MODES)}, got {algo_config.loss_agg_mode!r}")

    graphdef, state = nnx.split(model)
    logprobs = common.compute_per_token_logps(
        graphdef, state, prompt_tokens=train_example.prompt_ids, completion_tokens=train_example.completion_ids,
        pad_id=pad_id, eos_id=eos_id, stop_gradient=False, temperature=algo_config.temperature).astype(jnp.float32)
    old = train_example.old_per_token_logps
    proximal = jax.lax.stop_gradient(logprobs) if old is None else jnp.asarray(old, jnp.float32)
    advantages = jnp.asarray(train_example.advantages, jnp.float32)
    if advantages.ndim == 1:
        advantages = jnp.broadcast_to(advantages[:, None], logprobs.shape)
    return logprobs, proximal, advantages, jnp.asarray(train_example.completion_mask, jnp.bool_)


def register_losses(**options: Mapping[str, Any]) -> dict[str, str]:
    """Registers every loss of ``prm_jax.losses.POLICY_LOSS_MODES`` in tunix's policy-loss registry as
    ``prm_jax_<mode>`` (``tunix_policy_loss``), and AReaL's PPO clip as ``prm_jax_ppo`` (``register_loss``);
    ``options``: a mode's options, by mode (``dro={"dro_beta": 1e-3}``; ``clip_cov`` defaults to a fixed
    key). Registering again replaces them (tunix logs that). Returns ``{mode: registered name}``."""
    import jax.random
    from tunix.rl import function_registry

    from prm_jax import losses

    unknown = sorted(set(options) - set(losses.POLICY_LOSS_MODES))
    if unknown:
        raise ValueError(f"no policy loss named {unknown}; the modes are {losses.POLICY_LOSS_MODES}")
    defaults: dict[str, dict[str, Any]] = {"clip_cov": {"key": jax.random.key(0)}, "dro": {"dro_beta": 1e-3}}
    names = {"ppo_clip": register_loss()}
    for mode in losses.POLICY_LOSS_MODES:
        names[mode] = f"{LOSS_PREFIX}{mode}"
        function_registry.register_policy_loss_fn(names[mode])(
            tunix_policy_loss(mode, **{**defaults.get(mode, {}), **dict(options.get(mode, {}))}))
    return names
