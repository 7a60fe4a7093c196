"""The credit auditor: does the advantage configuration as written estimate the policy gradient it is meant to?

``audit(config)`` runs the configured pipeline (``compute_advantages`` with the ``AdvantageConfig``, and the
policy loss's aggregation) on small synthetic problems where the exact policy gradient is computable by
enumeration, and compares the two. Each problem is aimed at a known failure (``SUITE``); each gets a verdict
with its reason in words. ``prm-jax audit --config CONFIG`` prints the report (``--json``, ``--plot``) and exits
non-zero when a problem marked required (``--require``) fails.

**The policy.** A response of at most ``max_len`` tokens from a vocabulary of ``vocab``, token ``j`` drawn
from ``softmax(theta[j])`` (a tabular policy indexed by position). Each token is one turn of the agent (turn
id ``j``); with ``eos`` set, the token ``eos`` ends the response (the policy decides when to stop), else every
response has ``max_len`` turns; with ``tool_tokens``, that many untrained tokens (a tool's output) follow every
turn but the last. A problem's ``reward`` scores a whole response (the outcome), its ``turn_rewards`` each turn
(process rewards, on the turn's token). The policy is audited at its reference (KL 0).

**The truth.** ``J = E[R + sum_k r_k]`` (outcome plus process rewards) and
``grad J = sum_tau p(tau) (R + sum_k r_k)(tau) grad log p(tau)``, by enumeration of every response (float64).

**The estimate.** ``group_size`` responses drawn independently make a group, and each group is one batch of
``compute_advantages``. The policy loss's gradient at the sampling policy is
``sum_i sum_t w_it A_it grad log pi(a_it)``, with the aggregation's weights ``w`` taken from
``prm_jax.losses``' aggregation itself (verl's ``loss_agg_mode``: ``token-mean`` ``1 / sum_i n_i``;
``seq-mean-token-mean`` ``1 / (G n_i)``, GRPO's; ``seq-mean-token-sum`` ``1 / G``; ``seq-mean-token-sum-norm``
``1 / (G T)``; ``token-sum`` 1). Its expectation is exact: every ordered group is enumerated with its
probability (``K ** G`` groups of ``K`` responses, in one call of the pipeline); where they are more than
``max_groups``, ``samples`` groups are drawn with a fixed ``seed`` and the report gives the interval.

**Comparing.** ``scale = <E, g> / |g|^2`` (a step-size factor), ``across = |E - scale g| / |g|`` (what turns the
update away from the true direction), the cosine, the relative bias ``|E - g| / |g|``, and the variance of one
group's estimate ``E|ĝ - E ĝ|^2 / |g|^2``. A problem with several questions (``difficulty``) stacks their
gradients side by side, each question with its own groups. **The verdict**: *pass* where ``across`` is within
``TOLERANCE`` (1e-5: float32 advantages; an exact estimate comes within about 1e-8) plus, when sampled, four
standard errors of it, and ``scale`` above that bound (a scale other than 1 is a step-size factor, stated);
*fail* otherwise, with the angle in words and the known cause the problem is aimed at. A problem with a
``focus`` turn (``process``) also reports the share of the estimate's mean square on the other turns'
parameters (misassignment: the noise a turn's reward puts on turns
it does not concern; with turns drawn independently its expectation there is 0, so it is noise, not bias).
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, BinaryIO, Literal

import jax
import jax.numpy as jnp
import numpy as np

from prm_jax.config import AdvantageConfig, ExperimentConfig
from prm_jax.estimators import EstimatorSpec, StageResult, estimator_for, register_estimator, unregister_estimator
from prm_jax.kernels import compute_advantages
from prm_jax.kernels._policy_loss import AggMode, aggregate
from prm_jax.kernels._recurrence import ScanStrategy
from prm_jax.kernels._turn_rloo import turn_baselines
from prm_jax.kernels._verl_losses import VERL_AGG_MODES

__all__ = ["BUILT_IN", "SUITE", "AuditProblem", "AuditReport", "Comparison", "Problem", "ProblemResult", "audit",
           "audit_problem", "built_in_config", "built_in_table", "compare", "expected_estimate", "known_forms",
           "plot", "responses", "sampled_estimate", "tree_groups", "tree_layout", "true_gradient"]

Aggregation = AggMode
Verdict = Literal["pass", "fail", "not audited"]
TOLERANCE = 1e-5  # float32 advantages summed in float64: an exact estimate comes within ~1e-8


@dataclasses.dataclass(frozen=True)
class Problem:
    """A response space small enough to enumerate, and its rewards (see the module docstring).

    Args:
        name: How reports name it.
        vocab: Tokens to choose from at each turn, >= 2.
        max_len: The most turns, >= 1 (each turn one token).
        reward: A response's outcome reward (its tokens, a tuple).
        eos: The token that ends a response early; ``None``: every response has ``max_len`` turns.
        turn_rewards: Each turn's process reward (a sequence as long as the response); ``None``: none.
        tool_tokens: Untrained tokens (a tool's output) after every turn but the last.

    Example:
        >>> problem = prm_jax.audit.Problem("toy", vocab=2, max_len=2, reward=lambda s: float(s[0]))
        >>> prm_jax.audit.responses(problem)
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """

    name: str
    vocab: int
    max_len: int
    reward: Callable[[tuple[int, ...]], float]
    eos: int | None = None
    turn_rewards: Callable[[tuple[int, ...]], Sequence[float]] | None = None
    tool_tokens: int = 0

    def __post_init__(self) -> None:
        if self.vocab < 2 or self.max_len < 1 or self.tool_tokens < 0:
            raise ValueError(f"problem {self.name!r}: vocab must be >= 2, max_len >= 1 and tool_tokens >= 0")
        if self.eos is not None and not 0 <= self.eos < self.vocab:
            raise ValueError(f"problem {self.name!r}: eos must be a token below vocab {self.vocab}, got {self.eos}")

    def total(self, seq: tuple[int, ...]) -> float:
        """The reward the truth maximizes: the outcome plus every turn's process reward.

        Args:
            seq: A response's tokens.
        """
        return float(self.reward(seq)) + (math.fsum(self.turn_rewards(seq)) if self.turn_rewards else 0.0)

    @property
    def width(self) -> int:
        """Positions of a row: the prompt, every turn's token and the tool outputs between them."""
        return 1 + self.max_len + (self.max_len - 1) * self.tool_tokens

    def position(self, turn: int) -> int:
        """Where turn ``turn``'s token sits (position 0 is the prompt).

        Args:
            turn: The turn's index, from 0.
        """
        return 1 + turn * (1 + self.tool_tokens)


def responses(problem: Problem) -> list[tuple[int, ...]]:
    """Every response the policy can give, shortest first.

    Args:
        problem: The problem.

    Example:
        >>> prm_jax.audit.responses(prm_jax.audit.Problem("stop", vocab=2, max_len=2, reward=len, eos=0))
        [(0,), (1, 0), (1, 1)]
    """
    out: list[tuple[int, ...]] = []
    for length in range(1, problem.max_len + 1):
        for seq in itertools.product(range(problem.vocab), repeat=length):
            if problem.eos is not None and problem.eos in seq[:-1]:
                continue
            if length == problem.max_len or (problem.eos is not None and seq[-1] == problem.eos):
                out.append(seq)
    return out


def _softmax(theta: np.ndarray) -> np.ndarray:
    z = theta - theta.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def log_prob_grads(theta: np.ndarray, seq: Sequence[int]) -> tuple[float, np.ndarray]:
    """``log p(seq)`` and each token's ``grad log pi(a_j)`` (``[len(seq), max_len, vocab]``), float64."""
    probs = _softmax(np.asarray(theta, np.float64))
    grads = np.zeros((len(seq), *theta.shape))
    logp = 0.0
    for j, token in enumerate(seq):
        logp += float(np.log(probs[j, token]))
        grads[j, j] = -probs[j]
        grads[j, j, token] += 1.0
    return logp, grads


def true_gradient(problem: Problem, theta: np.ndarray) -> np.ndarray:
    """``grad E[R + sum_k r_k] = sum_tau p(tau) (R + sum_k r_k)(tau) grad log p(tau)``, by enumeration (float64).

    Args:
        problem: The problem.
        theta: The policy's logits, ``[max_len, vocab]``.

    Example:
        >>> problem = prm_jax.audit.Problem("toy", vocab=2, max_len=1, reward=lambda s: float(s[0]))
        >>> prm_jax.audit.true_gradient(problem, np.zeros((1, 2))).tolist()   # p (1 - p) on token 1
        [[-0.25, 0.25]]
    """
    out = np.zeros(theta.shape)
    for seq in responses(problem):
        logp, grads = log_prob_grads(theta, seq)
        out += np.exp(logp) * problem.total(seq) * grads.sum(axis=0)
    return out


def _batch(problem: Problem, theta: np.ndarray, rows: np.ndarray, group_size: int,
           tree: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """The pipeline's batch of the responses ``rows`` (indices into ``responses``), groups of ``group_size``:
    each response's row built once, then gathered; with ``tree``, each group a tree (``group_gradients``), whose
    rows name their turns' nodes (``node_ids``) and each group its tree (``node_parents``, side by side)."""
    seqs = responses(problem)
    probs = _softmax(np.asarray(theta, np.float64))
    width, k = problem.width, len(seqs)
    attention = np.zeros((k, width), np.int32)
    loss = np.zeros((k, width), np.int32)
    logprobs = np.zeros((k, width), np.float32)
    turn_ids = np.full((k, width), -1, np.int32)
    token_rewards = np.zeros((k, width), np.float32)
    sum_pi_squared = np.zeros((k, width), np.float32)
    for r, seq in enumerate(seqs):
        attention[r, :problem.position(len(seq) - 1) + 1] = 1
        turns = problem.turn_rewards(seq) if problem.turn_rewards else [0.0] * len(seq)
        for j, token in enumerate(seq):
            p = problem.position(j)
            loss[r, p] = 1
            turn_ids[r, p] = j
            logprobs[r, p] = np.log(probs[j, token])
            token_rewards[r, p] = turns[j]
            sum_pi_squared[r, p - 1] = np.sum(probs[j] ** 2)  # a model output: on the timestep predicting it
    ref_logprobs = np.zeros_like(logprobs)
    ref_logprobs[:, :-1] = logprobs[:, 1:]  # a model output, on timesteps: at the reference, no KL
    outcome = np.array([problem.reward(s) for s in seqs], np.float32)
    templates = {"attention_mask": attention, "loss_mask": loss, "logprobs": logprobs, "ref_logprobs": ref_logprobs,
                 "rewards": outcome, "turn_ids": turn_ids, "sum_pi_squared": sum_pi_squared}
    if problem.turn_rewards is not None:
        templates["token_rewards"] = token_rewards
    batch = {key: value[rows] for key, value in templates.items()}
    batch["is_truncated"] = np.zeros(rows.size, bool)
    batch["group_sizes"] = np.full(rows.size // group_size, group_size, np.int32)
    if tree is not None:
        parents, _, paths = tree_layout(tree)
        batch["node_ids"] = np.tile(paths, (rows.size // group_size, 1)).astype(np.int32)
        batch["node_parents"] = np.tile(parents, rows.size // group_size).astype(np.int32)
    return batch


def _as_plan_source(config: object) -> object:
    return config.actor if isinstance(config, ExperimentConfig) else config


def missing_inputs(config: object, batch: Mapping[str, np.ndarray]) -> tuple[str, ...]:
    """The batch keys the configured estimator needs that a problem's ``batch`` does not give (a PRM's log-probs;
    a tree's nodes, except on a ``tree`` problem): its audit is then ``not audited``, naming them."""
    source = _as_plan_source(config)
    if not isinstance(source, AdvantageConfig):
        return ()
    return tuple(key for key in estimator_for(source.plan.estimator).reads if key not in batch)


def group_gradients(problem: Problem, theta: np.ndarray, config: object, groups: np.ndarray,
                    aggregation: Aggregation = "token-mean", tree: Sequence[int] | None = None) -> np.ndarray:
    """Each group's policy-loss gradient, ``[n_groups, *theta.shape]`` (float64 sums of the pipeline's float32
    advantages): ``groups`` holds each group's responses as indices into ``responses(problem)``, and the
    configured pipeline scores all of them in one call, one group a batch of it.

    Args:
        problem: The problem.
        theta: The policy's logits, ``[max_len, vocab]``.
        config: The ``AdvantageConfig`` (or an ``ExperimentConfig``: its ``actor``).
        groups: ``[n_groups, group_size]`` indices of responses.
        aggregation: The loss's ``loss_agg_mode`` (the module docstring).
        tree: Each group is a tree of this branching (``tree_layout``), its rows the leaves' paths in level order
            (``groups`` from ``tree_groups``): the batch also names each row's turns' nodes (``node_ids``) and
            the tree (``node_parents``). ``None``: independent responses.
    """
    seqs = responses(problem)
    n, g = groups.shape
    rows = groups.reshape(-1)
    batch = _batch(problem, theta, rows, g, tree)
    advantages = np.asarray(_grouped_advantages(batch, _as_plan_source(config), n, g), np.float64)
    # timestep p - 1 predicts the token at position p
    steps = np.array([problem.position(j) - 1 for j in range(problem.max_len)])
    active = batch["loss_mask"][:, 1:].astype(bool)
    mask = np.zeros(advantages.shape, bool)
    mask[:, :-1] = active
    weights = np.asarray(_aggregation_weights(mask.reshape(n, g, -1), aggregation), np.float64).reshape(n * g, -1)
    per_token = (weights * advantages)[:, steps]                                   # [rows, max_len]
    token_grads = np.zeros((len(seqs), problem.max_len, theta.size))
    for index, seq in enumerate(seqs):
        token_grads[index, :len(seq)] = log_prob_grads(theta, seq)[1].reshape(len(seq), -1)
    grads = np.einsum("rt,rtp->rp", per_token, token_grads[rows]).reshape(n, g, theta.size).sum(axis=1)
    return grads.reshape(n, *theta.shape)


def _grouped_advantages(batch: Mapping[str, np.ndarray], config: Any, n: int, g: int) -> jax.Array:
    """The pipeline on each group as its own batch (batch-wide statistics see one group), vmapped."""
    grouped = {key: np.asarray(value).reshape(n, g, *np.shape(value)[1:]) for key, value in batch.items()
               if key not in ("group_sizes", "node_parents")}
    grouped["group_sizes"] = np.full((n, 1), g, np.int32)
    if "node_parents" in batch:
        grouped["node_parents"] = np.asarray(batch["node_parents"]).reshape(n, -1)
    return jax.vmap(lambda b: compute_advantages(b, config).advantages)(grouped).reshape(n * g, -1)


def _aggregation_weights(mask: np.ndarray, aggregation: Aggregation) -> jax.Array:
    """``[n, G, T]``: each timestep's weight in the loss, ``d aggregate / d loss``, per group (one batch each)."""
    def weights(m: jax.Array) -> jax.Array:
        return jax.grad(lambda losses: aggregate(losses, m, aggregation))(jnp.zeros(m.shape, jnp.float32))
    return jax.vmap(weights)(jnp.asarray(mask))


@dataclasses.dataclass(frozen=True)
class Estimate:
    """The expected policy-loss gradient: ``mean``, its standard error per parameter (``None`` when exact), the
    variance of one group's estimate (the trace of its covariance) and how it was taken, in words."""

    mean: np.ndarray
    stderr: np.ndarray | None
    variance: float
    method: str
    square: np.ndarray  # E[ĝ_p^2] per parameter


def _probabilities(problem: Problem, theta: np.ndarray) -> np.ndarray:
    return np.exp([log_prob_grads(theta, s)[0] for s in responses(problem)])


def expected_estimate(problem: Problem, theta: np.ndarray, config: object, group_size: int,
                      aggregation: Aggregation = "token-mean") -> np.ndarray:
    """The expectation, over every ordered group of ``group_size`` responses (``K ** G`` of them), of the policy
    loss's gradient the configured pipeline gives (see the module docstring).

    Args:
        problem: The problem.
        theta: The policy's logits, ``[max_len, vocab]``.
        config: The ``AdvantageConfig``.
        group_size: Responses a group.
        aggregation: The loss's ``loss_agg_mode``.

    Example:
        >>> toy = prm_jax.audit.Problem("toy", vocab=2, max_len=1, reward=lambda s: float(s[0]))
        >>> plain = prm_jax.AdvantageConfig(kl_ctl=0.0, reward_norm=None, adv_norm=None)   # no baseline
        >>> np.round(prm_jax.audit.expected_estimate(toy, np.zeros((1, 2)), plain, 2), 4).tolist()   # the truth
        [[-0.25, 0.25]]
    """
    return _exact(problem, theta, config, group_size, aggregation).mean


def tree_layout(branching: Sequence[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A tree of sampled turns, nodes in level order: ``branching[d]`` children of every node of depth ``d - 1``
    (``branching[0]`` roots, the first turns). Returns each node's parent (-1: a root), each node's depth, and
    each leaf's path of nodes (``[leaves, depth]``, the leaves in level order).

    Args:
        branching: Children a node, per depth; its length is the number of turns.

    Example:
        >>> parents, depth, paths = prm_jax.audit.tree_layout([2, 2])
        >>> parents.tolist(), paths.tolist()
        ([-1, -1, 0, 0, 1, 1], [[0, 2], [0, 3], [1, 4], [1, 5]])
    """
    parents: list[int] = []
    depths: list[int] = []
    level = [-1]
    for d, width in enumerate(branching):
        if width < 1:
            raise ValueError(f"branching must be >= 1 at every depth, got {list(branching)}")
        start = len(parents)
        for node in level:
            parents += [node] * width
            depths += [d] * width
        level = list(range(start, len(parents)))
    paths = []
    for leaf in level:
        path, node = [], leaf
        while node != -1:
            path.append(node)
            node = parents[node]
        paths.append(path[::-1])
    return np.array(parents), np.array(depths), np.array(paths)


def tree_groups(problem: Problem, theta: np.ndarray, branching: Sequence[int],
                tokens: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The trees as groups: ``(groups [n_trees, leaves], probabilities [n_trees])``, each row a leaf's path as an
    index into ``responses(problem)``; every assignment of tokens to the tree's nodes (``vocab ** N``), or the
    ``tokens [n, N]`` given (sampled).

    Args:
        problem: A problem of fixed length (no ``eos``) with ``max_len == len(branching)``.
        theta: The policy's logits.
        branching: The tree (``tree_layout``).
        tokens: Each tree's token a node; ``None``: every assignment.

    Example:
        >>> toy = prm_jax.audit.Problem("toy", vocab=2, max_len=1, reward=lambda s: float(s[0]))
        >>> groups, p = prm_jax.audit.tree_groups(toy, np.zeros((1, 2)), [2])
        >>> groups.tolist(), p.tolist()
        ([[0, 0], [0, 1], [1, 0], [1, 1]], [0.25, 0.25, 0.25, 0.25])
    """
    if problem.eos is not None or problem.max_len != len(branching):
        raise ValueError(f"problem {problem.name!r}: a tree needs a fixed length (no eos) of len(branching) turns")
    parents, depths, paths = tree_layout(branching)
    if tokens is None:
        tokens = np.array(list(itertools.product(range(problem.vocab), repeat=parents.size)), np.int64)
    index = {seq: i for i, seq in enumerate(responses(problem))}
    groups = np.array([[index[tuple(int(t) for t in assignment[path])] for path in paths] for assignment in tokens])
    probs = _softmax(np.asarray(theta, np.float64))
    return groups, probs[depths[None, :], tokens].prod(axis=1)


def _exact(problem: Problem, theta: np.ndarray, config: object, group_size: int,
           aggregation: Aggregation, tree: Sequence[int] | None = None) -> Estimate:
    if tree is not None:
        groups, probabilities = tree_groups(problem, theta, tree)
    else:
        groups = np.array(list(itertools.product(range(len(responses(problem))), repeat=group_size)), np.int64)
        probabilities = _probabilities(problem, theta)[groups].prod(axis=1)
    per_group = group_gradients(problem, theta, config, groups, aggregation, tree)
    mean = np.tensordot(probabilities, per_group, axes=1)
    square = np.tensordot(probabilities, per_group ** 2, axes=1)
    return Estimate(mean, None, max(float(square.sum() - np.sum(mean ** 2)), 0.0), f"exact ({len(groups)} groups)",
                    square)


def sampled_estimate(problem: Problem, theta: np.ndarray, config: object, group_size: int, samples: int,
                     seed: int = 0, aggregation: Aggregation = "token-mean") -> tuple[np.ndarray, np.ndarray]:
    """Monte Carlo where groups are too many to enumerate: the mean of ``samples`` groups drawn from the policy
    (a fixed ``seed``) and its standard error, per parameter.

    Args:
        problem: The problem.
        theta: The policy's logits, ``[max_len, vocab]``.
        config: The ``AdvantageConfig``.
        group_size: Responses a group.
        samples: Groups drawn, >= 2.
        seed: The generator's seed.
        aggregation: The loss's ``loss_agg_mode``.

    Example:
        >>> toy = prm_jax.audit.Problem("toy", vocab=2, max_len=1, reward=lambda s: float(s[0]))
        >>> plain = prm_jax.AdvantageConfig(kl_ctl=0.0, reward_norm=None, adv_norm=None)
        >>> mean, error = prm_jax.audit.sampled_estimate(toy, np.zeros((1, 2)), plain, 2, 2000, seed=1)
        >>> bool(np.all(np.abs(mean - [[-0.25, 0.25]]) < 4 * error))
        True
    """
    estimate = _sampled(problem, theta, config, group_size, samples, seed, aggregation)
    assert estimate.stderr is not None
    return estimate.mean, estimate.stderr


def _sampled(problem: Problem, theta: np.ndarray, config: object, group_size: int, samples: int, seed: int,
             aggregation: Aggregation, tree: Sequence[int] | None = None) -> Estimate:
    if samples < 2:
        raise ValueError(f"samples must be >= 2 (a standard error needs two), got {samples}")
    rng = np.random.default_rng(seed)
    if tree is not None:  # each node's token drawn from its turn's policy
        _, depths, _ = tree_layout(tree)
        probs = _softmax(np.asarray(theta, np.float64))
        tokens = np.stack([rng.choice(problem.vocab, size=samples, p=probs[d]) for d in depths], axis=1)
        groups, _ = tree_groups(problem, theta, tree, tokens)
    else:
        probabilities = _probabilities(problem, theta)
        groups = rng.choice(probabilities.size, size=(samples, group_size), p=probabilities / probabilities.sum())
    per_group = group_gradients(problem, theta, config, groups, aggregation, tree)
    variance = float(per_group.reshape(samples, -1).var(axis=0, ddof=1).sum())
    return Estimate(per_group.mean(axis=0), per_group.std(axis=0, ddof=1) / np.sqrt(samples), variance,
                    f"sampled ({samples} groups, seed {seed})", (per_group ** 2).mean(axis=0))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The estimate against the true gradient (``compare``).

    Attributes:
        cosine: The cosine of the angle between them.
        scale: The estimate's scale along the true gradient, ``<est, true> / |true|^2`` (a step-size factor).
        across: What is left of the estimate across the true gradient, relative to ``|true|``.

    Example:
        >>> prm_jax.audit.compare(np.array([1.0, 1.0]), np.array([1.0, 0.0])).scale
        1.0
    """

    cosine: float
    scale: float
    across: float


def compare(estimate: np.ndarray, truth: np.ndarray) -> Comparison:
    """How far ``estimate`` is from a multiple of ``truth`` (float64).

    Args:
        estimate: The expected estimate.
        truth: The true gradient (not zero).

    Example:
        >>> prm_jax.audit.compare(np.array([2.0, 0.1]), np.array([1.0, 0.0]))
        Comparison(cosine=0.99875..., scale=2.0, across=0.1...)
    """
    e, t = np.ravel(estimate), np.ravel(truth)
    norm_t = float(np.linalg.norm(t))
    if norm_t == 0.0:
        raise ValueError("the true gradient is zero: nothing to compare against")
    scale = float(e @ t) / norm_t ** 2
    cosine = float(e @ t) / (float(np.linalg.norm(e)) * norm_t) if np.linalg.norm(e) else 0.0
    return Comparison(cosine, scale, float(np.linalg.norm(e - scale * t)) / norm_t)


@dataclasses.dataclass(frozen=True)
class AuditProblem:
    """One problem of the suite: its questions (each a ``Problem`` and its policy's logits), the group size,
    what it tests and the known failure it is aimed at, in words.

    Args:
        name: How the report and ``--require`` name it.
        tests: What it tests, a sentence.
        failure: The known failure it is aimed at (the verdict's reason when it is found).
        questions: ``(problem, theta)`` each; several are stacked side by side.
        group_size: Responses a group.
        focus: The one turn whose reward there is (the ``process`` problem): the report measures the share of the
            update on the other turns.
        tree: A group is a tree of sampled turns of this branching (``tree_layout``; the ``trees`` problem), its
            rows the leaves' paths sharing their prefixes; ``None``: ``group_size`` independent responses.

    Example:
        >>> toy = prm_jax.audit.Problem("toy", vocab=2, max_len=1, reward=lambda s: float(s[0]))
        >>> mine = prm_jax.audit.AuditProblem("toy", "one token", "none", ((toy, np.zeros((1, 2))),), group_size=2)
        >>> prm_jax.audit.audit(prm_jax.AdvantageConfig(kl_ctl=0.0), problems=[mine]).results[0].verdict
        'pass'
    """

    name: str
    tests: str
    failure: str
    questions: tuple[tuple[Problem, np.ndarray], ...]
    group_size: int = 3
    focus: int | None = None
    tree: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ProblemResult:
    """One problem's audit (the module docstring defines each number).

    Attributes:
        problem: The problem's name.
        cosine: The cosine of the expected estimate and the true gradient.
        scale: The expected estimate's scale along the true gradient.
        across: What is left of it across the true gradient, relative to ``|g|``.
        relative_bias: ``|E - g| / |g|``.
        variance: The variance of one group's estimate (the trace of its covariance), relative to ``|g|^2``.
        interval: Four standard errors of ``across`` where sampled; 0 when exact.
        misassignment: The share of the estimate's mean square on the turns without the reward (``focus``
            problems; else ``None``).
        method: How the expectation was taken, in words.
        verdict: ``pass``, ``fail`` or ``not audited``.
        reason: The verdict's reason, in words.
        truth: The true gradient, flattened.
        estimate: The expected estimate, flattened.

    Example:
        >>> result = prm_jax.audit.audit(prm_jax.AdvantageConfig(kl_ctl=0.0), problems=prm_jax.audit.SUITE[:1]).results[0]
        >>> result.problem, result.verdict, round(result.cosine, 6)
        ('control', 'pass', 1.0)
    """

    problem: str
    cosine: float
    scale: float
    across: float
    relative_bias: float
    variance: float
    interval: float
    misassignment: float | None
    method: str
    verdict: Verdict
    reason: str
    truth: np.ndarray = dataclasses.field(repr=False, compare=False, default_factory=lambda: np.zeros(0))
    estimate: np.ndarray = dataclasses.field(repr=False, compare=False, default_factory=lambda: np.zeros(0))

    def as_dict(self) -> dict[str, Any]:
        """Its fields as JSON values (the gradients as lists; a number a ``not audited`` problem lacks, ``None``)."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("truth", "estimate")}
        out = {key: None if isinstance(value, float) and math.isnan(value) else value for key, value in out.items()}
        return {**out, "truth": self.truth.tolist(), "estimate": self.estimate.tolist()}


def _theta(*rows: Sequence[float]) -> np.ndarray:
    return np.array(rows, np.float64)


#: The built-in problems, each aimed at a known failure (issue 59; the guide's auditor page says more of each).
SUITE: tuple[AuditProblem, ...] = (
    AuditProblem(
        "control", "an outcome reward on responses of a fixed length: every unbiased estimator passes",
        "the estimator is biased even without lengths, turns or process rewards",
        ((Problem("control", vocab=2, max_len=2, reward=lambda s: float(sum(s))), _theta([0.3, -0.2], [-0.4, 0.1])),),
        group_size=4),
    AuditProblem(
        "length", "the policy decides the length and the reward does not depend on it",
        "a per-sequence token mean weights a short response's tokens more (Dr. GRPO's length bias)",
        ((Problem("length", vocab=3, max_len=3, reward=lambda s: float(s[0] == 1), eos=2),
          _theta([0.2, -0.1, 0.4], [-0.3, 0.5, 0.0], [0.1, 0.2, -0.2])),)),
    AuditProblem(
        "difficulty", "two questions of different reward spread (an easy and a hard one), each with its own groups",
        "a per-group std normalization weighs each question by one over its reward spread (Dr. GRPO's "
        "question-difficulty bias)",
        ((Problem("easy", vocab=2, max_len=2, reward=lambda s: float(1 in s)), _theta([-1.0, 1.0], [-1.0, 1.0])),
         (Problem("hard", vocab=2, max_len=2, reward=lambda s: float(s == (1, 1))), _theta([0.3, -0.3], [0.3, -0.3]))),
        group_size=6),
    AuditProblem(
        "variable_turns", "the policy decides how many turns to take; every turn taken earns a process reward",
        "a per-turn baseline with one term per turn the row goes on to take depends on the row's own later "
        "actions: a hidden cost on every 'take another turn' (verl RFC #7244)",
        ((Problem("variable_turns", vocab=3, max_len=3, eos=2, reward=lambda s: float(s[0] == 1),
                  turn_rewards=lambda s: [0.0 if t == 2 else 0.5 for t in s]),
          _theta([0.1, -0.2, 0.3], [0.2, 0.1, -0.1], [-0.2, 0.3, 0.0])),)),
    AuditProblem(
        "tool_outputs", "two untrained tokens (a tool's output) between turns; the reward comes after them",
        "the return is cut at the tool's output, so the turns before it lose the reward (verl #7278, #7300)",
        ((Problem("tool_outputs", vocab=2, max_len=3, tool_tokens=2,
                  reward=lambda s: float(s[0] == 1) + 0.5 * float(s[2] == 0)),
          _theta([0.2, -0.3], [0.1, 0.4], [-0.2, 0.0])),)),
    AuditProblem(
        "process", "a process reward on the second of three turns only, no outcome reward",
        "a turn's process reward reaches the wrong turns, or none (a shaping that only reweights the outcome's "
        "advantages moves nothing where there is no outcome reward)",
        ((Problem("process", vocab=2, max_len=3, reward=lambda s: 0.0,
                  turn_rewards=lambda s: [0.0, float(s[1] == 1), 0.0]),
          _theta([0.2, -0.3], [0.1, 0.4], [-0.2, 0.0])),),
        focus=1),
    AuditProblem(
        "trees", "each group a tree: two first turns, each continued twice, the rows the four paths sharing their "
                 "first turns",
        "rows of one tree share their earlier turns, so a baseline over the tree's other rows depends on the row's "
        "own shared actions",
        ((Problem("trees", vocab=2, max_len=2, reward=lambda s: float(s[0] == 1) + 0.5 * float(s == (0, 1))),
          _theta([0.3, -0.1], [-0.2, 0.4])),),
        tree=(2, 2)),
)


def _estimate(problem: Problem, theta: np.ndarray, config: object, group_size: int, aggregation: Aggregation,
              max_groups: int, samples: int, seed: int, tree: Sequence[int] | None = None) -> Estimate:
    count = problem.vocab ** len(tree_layout(tree)[0]) if tree is not None else len(responses(problem)) ** group_size
    if count <= max_groups:
        return _exact(problem, theta, config, group_size, aggregation, tree)
    return _sampled(problem, theta, config, group_size, samples, seed, aggregation, tree)


def audit_problem(problem: AuditProblem, config: object, aggregation: Aggregation = "token-mean", *,
                  max_groups: int = 20_000, samples: int = 4_000, seed: int = 0) -> ProblemResult:
    """One problem's audit (the module docstring says how the verdict is reached).

    Args:
        problem: The problem (one of ``SUITE``, or your own).
        config: The ``AdvantageConfig`` (or an ``ExperimentConfig``: its ``actor``).
        aggregation: The loss's ``loss_agg_mode``.
        max_groups: Enumerate the groups up to this many; beyond, sample.
        samples: Groups drawn when sampling.
        seed: The sampling's seed.

    Example:
        >>> length = prm_jax.audit.SUITE[1]
        >>> config = prm_jax.AdvantageConfig(kl_ctl=0.0, reward_norm={"mean_level": "group", "std_level": None})
        >>> prm_jax.audit.audit_problem(length, config, "seq-mean-token-mean").verdict
        'fail'
    """
    (first, theta), *_ = problem.questions
    size = len(tree_layout(problem.tree)[2]) if problem.tree is not None else problem.group_size
    missing = missing_inputs(config, _batch(first, theta, np.zeros(size, np.int64), size, problem.tree))
    if missing:
        return ProblemResult(problem.name, math.nan, math.nan, math.nan, math.nan, math.nan, math.nan, None, "-",
                             "not audited", f"its estimator needs {', '.join(missing)}, which these problems do not "
                                            "give")
    estimates = [_estimate(q, t, config, problem.group_size, aggregation, max_groups, samples, seed, problem.tree)
                 for q, t in problem.questions]
    truth = np.concatenate([np.ravel(true_gradient(q, t)) for q, t in problem.questions])
    mean = np.concatenate([np.ravel(e.mean) for e in estimates])
    norm = float(np.linalg.norm(truth))
    comparison = compare(mean, truth)
    stderr = [e.stderr for e in estimates]
    interval = 0.0 if all(s is None for s in stderr) else 4.0 * float(np.linalg.norm(np.concatenate(
        [np.ravel(s) if s is not None else np.zeros(e.mean.size) for s, e in zip(stderr, estimates, strict=True)]))) / norm
    misassignment = None
    if problem.focus is not None:  # the share of the update's mean square on the other turns' parameters
        square = estimates[0].square
        others = np.ones(square.shape, bool)
        others[problem.focus] = False
        misassignment = float(square[others].sum() / max(square.sum(), 1e-300))
    variance = sum(e.variance for e in estimates) / norm ** 2
    verdict, reason = _verdict(problem, comparison, interval, misassignment)
    return ProblemResult(problem.name, comparison.cosine, comparison.scale, comparison.across,
                         float(np.linalg.norm(mean - truth)) / norm, variance, interval, misassignment,
                         "; ".join(sorted({e.method for e in estimates})), verdict, reason, truth, mean)


def _verdict(problem: AuditProblem, c: Comparison, interval: float,
             misassignment: float | None) -> tuple[Verdict, str]:
    bound = TOLERANCE + interval
    extra = (f"; {misassignment:.1%} of its mean square on the turns without the reward"
             if misassignment is not None else "")
    if c.scale <= bound:
        how = "has no component along" if c.scale > -bound else "points against"
        return "fail", (f"biased: the expected update {how} the true gradient (scale {c.scale:.3g}, cosine "
                        f"{c.cosine:.3f}{extra}); the known cause this problem is aimed at: {problem.failure}")
    if c.across > bound:
        angle = math.degrees(math.acos(max(-1.0, min(1.0, c.cosine))))
        return "fail", (f"biased: the expected update turns {angle:.2f} degrees from the true gradient (cosine "
                        f"{c.cosine:.4f}, {c.across:.2%} of it across{extra}); the known cause this problem is "
                        f"aimed at: {problem.failure}")
    factor = "" if abs(c.scale - 1.0) <= bound else f" up to a step-size factor of {c.scale:.3g}"
    return "pass", f"unbiased{factor} (across {c.across:.1e} <= {bound:.1e}{extra})"


@dataclasses.dataclass(frozen=True)
class AuditReport:
    """Every problem's result for one configuration (``audit``).

    Attributes:
        config: The configuration, in a few words.
        aggregation: The loss's ``loss_agg_mode`` it was audited under.
        results: A ``ProblemResult`` a problem.

    Example:
        >>> report = prm_jax.audit.audit(prm_jax.AdvantageConfig(kl_ctl=0.0), problems=prm_jax.audit.SUITE[:1])
        >>> report.table().splitlines()[3].split()[:2], report.failed(["all"])
        (['control', 'pass'], [])
    """

    config: str
    aggregation: str
    results: tuple[ProblemResult, ...]

    def failed(self, required: Sequence[str] = ()) -> list[str]:
        """The problems among ``required`` (``"all"``: every problem) whose verdict is ``fail``.

        Args:
            required: The problems that must pass, by name (``"all"``: every one).
        """
        names = {r.problem for r in self.results} if "all" in required else set(required)
        return [r.problem for r in self.results if r.problem in names and r.verdict == "fail"]

    def table(self) -> str:
        """The report as a plain-text table, a row per problem, then each verdict's reason."""
        header = f"{'problem':<15} {'verdict':<11} {'cosine':>8} {'scale':>7} {'across':>9} {'bias':>8} " \
                 f"{'variance':>9} {'interval':>9}  method"
        lines = [f"audit of {self.config} (loss_agg_mode {self.aggregation})", header, "-" * len(header)]
        for r in self.results:
            lines.append(f"{r.problem:<15} {r.verdict:<11} {r.cosine:>8.4f} {r.scale:>7.3f} {r.across:>9.2e} "
                         f"{r.relative_bias:>8.3f} {r.variance:>9.3g} {r.interval:>9.1e}  {r.method}")
        lines.append("")
        lines += [f"{r.problem}: {r.reason}" for r in self.results]
        return "\n".join(lines)

    def as_json(self) -> str:
        """The report as strict JSON (each problem's numbers, verdict, reason and both gradients; ``null`` for a
        number a ``not audited`` problem lacks)."""
        return json.dumps({"config": self.config, "aggregation": self.aggregation,
                           "results": [r.as_dict() for r in self.results]}, indent=1, allow_nan=False)


def describe(config: object) -> str:
    """A configuration in a few words: its estimator and the stages around it."""
    source = _as_plan_source(config)
    if not isinstance(source, AdvantageConfig):
        return type(source).__name__
    parts = [estimator_for(source.plan.estimator).name]
    keys = ["reward_norm", "process_reward_transform", "adv_norm"]
    if source.token_rewards_as_adv:  # (else the process rewards are folded into the rewards: no shaping)
        keys.append("advantage_shaping")
    for key in keys:
        value = getattr(source, key, None)
        if value is not None:
            parts.append(f"{key} {_short(value)}")
    return ", ".join(parts)


def _short(value: object) -> str:
    fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)} if dataclasses.is_dataclass(value) \
        else {}
    return "{" + ", ".join(f"{k}: {v}" for k, v in fields.items() if v not in (None, False)) + "}"


def audit(config: object, aggregation: Aggregation = "token-mean", *, problems: Sequence[AuditProblem] = SUITE,
          max_groups: int = 20_000, samples: int = 4_000, seed: int = 0) -> AuditReport:
    """Audits ``config`` on ``problems`` (the module docstring).

    Args:
        config: The ``AdvantageConfig`` (or an ``ExperimentConfig``: its ``actor``).
        aggregation: The policy loss's ``loss_agg_mode``.
        problems: The problems (default: ``SUITE``).
        max_groups: Enumerate a problem's groups up to this many; beyond, sample.
        samples: Groups drawn when sampling.
        seed: The sampling's seed.

    Example:
        >>> config = prm_jax.AdvantageConfig(kl_ctl=0.0, reward_norm={"mean_level": "group", "std_level": None,
        ...                                                          "mean_leave1out": True}, adv_norm=None)
        >>> report = prm_jax.audit.audit(config, "seq-mean-token-sum", problems=prm_jax.audit.SUITE[:2])
        >>> [(r.problem, r.verdict) for r in report.results]
        [('control', 'pass'), ('length', 'pass')]
        >>> prm_jax.audit.audit(config, "seq-mean-token-mean", problems=prm_jax.audit.SUITE[1:2]).results[0].verdict
        'fail'
    """
    if aggregation not in VERL_AGG_MODES:
        raise ValueError(f"aggregation must be one of verl's loss_agg_modes {VERL_AGG_MODES}, got {aggregation!r}")
    results = tuple(audit_problem(p, config, aggregation, max_groups=max_groups, samples=samples, seed=seed)
                    for p in problems)
    return AuditReport(describe(config), aggregation, results)


@dataclasses.dataclass(frozen=True)
class TurnIndexBaseline:
    """``credit_assignment: {mode: turn_index_baseline}``, registered only inside ``known_forms()``: verl RFC
    #7244's biased per-turn-index form (each turn's reward less the group's mean reward at that index, over the
    other rows that reach it, summed over the row's own remaining turns), which ``turn_rloo`` replaces. The
    auditor shows its bias; prm-jax does not offer it for training."""


def _turn_index_run(stage: TurnIndexBaseline, rewards: jax.Array, active: jax.Array, turn_ids: jax.Array,
                    gamma: jax.Array, real_rows: jax.Array, row_group: jax.Array, num_groups: int, num_turns: int,
                    strategy: ScanStrategy) -> StageResult:
    advantages, returns, _ = turn_baselines(rewards, active, turn_ids, gamma, real_rows, row_group, num_groups,
                                            num_turns, strategy.gae, form="per_index")
    return StageResult(advantages, returns=returns)


TURN_INDEX_BASELINE = EstimatorSpec(TurnIndexBaseline, _turn_index_run, "credit_assignment 'turn_index_baseline'",
                                    mode="turn_index_baseline", reads=("turn_ids",), needs_turn_ids=True,
                                    kl="rewards", units=("token",))


@contextlib.contextmanager
def known_forms() -> Iterator[None]:
    """Registers the known biased forms the auditor demonstrates (``turn_index_baseline``) while inside.

    Example:
        >>> with prm_jax.audit.known_forms():
        ...     config = prm_jax.AdvantageConfig(kl_ctl=0.0, credit_assignment={"mode": "turn_index_baseline"})
        ...     prm_jax.audit.audit(config, problems=[prm_jax.audit.SUITE[3]]).results[0].verdict
        'fail'
    """
    register_estimator(TURN_INDEX_BASELINE)
    try:
        yield
    finally:
        unregister_estimator(TURN_INDEX_BASELINE)


def plot(report: AuditReport, path: str | os.PathLike[str] | BinaryIO) -> None:
    """The true against the expected estimated gradient, per parameter, a panel per problem (the ``plot`` extra:
    matplotlib), as a PNG.

    Args:
        report: An audit's report.
        path: Where the PNG goes: a path, or a binary file open for writing.

    Example:
        >>> import os, tempfile
        >>> report = prm_jax.audit.audit(prm_jax.AdvantageConfig(kl_ctl=0.0), problems=prm_jax.audit.SUITE[:1])
        >>> path = os.path.join(tempfile.mkdtemp(), "audit.png")
        >>> prm_jax.audit.plot(report, path)
        >>> open(path, "rb").read(4)
        b'\x89PNG'
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in report.results if r.truth.size]
    fig, axes = plt.subplots(1, max(len(shown), 1), figsize=(3.2 * max(len(shown), 1), 3.2), squeeze=False)
    for ax, result in zip(axes[0], shown, strict=False):
        ax.scatter(result.truth, result.estimate, s=14, color="tab:red" if result.verdict == "fail" else "tab:blue")
        low = float(min(result.truth.min(), result.estimate.min()))
        high = float(max(result.truth.max(), result.estimate.max()))
        ax.plot([low, high], [low, high], color="0.6", linewidth=0.8)
        ax.set_title(f"{result.problem}: {result.verdict}", fontsize=9)
        ax.set_xlabel("true gradient", fontsize=8)
    axes[0][0].set_ylabel("expected estimate", fontsize=8)
    fig.suptitle(f"{report.config} ({report.aggregation})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110, format="png")
    plt.close(fig)


#: The built-in modes as the guide's audit table shows them: a name, the ``actor`` settings beside the defaults
#: (no KL, no ``adv_norm``, process rewards folded unless a shaping is named) and the loss aggregation.
BUILT_IN: tuple[tuple[str, Mapping[str, Any], Aggregation], ...] = (
    ("GRPO: group mean and std, per-sequence token mean", {"reward_norm": {"mean_level": "group", "std_level": "group"}},
     "seq-mean-token-mean"),
    ("DAPO's token mean, group mean and std", {"reward_norm": {"mean_level": "group", "std_level": "group"}},
     "token-mean"),
    ("Dr. GRPO: group mean, constant normalizer", {"reward_norm": {"mean_level": "group", "std_level": None}},
     "seq-mean-token-sum-norm"),
    ("RLOO: leave-one-out group mean, token sum",
     {"reward_norm": {"mean_level": "group", "std_level": None, "mean_leave1out": True}}, "seq-mean-token-sum"),
    ("GAE, lambda 1, no critic, token sum", {}, "seq-mean-token-sum"),
    ("GAE, lambda 0.95, no critic, token sum", {"gae_lambda": 0.95}, "seq-mean-token-sum"),
    ("turn-level GAE, token sum", {"gae_timestep_unit": "turn"}, "seq-mean-token-sum"),
    ("additive shaping (RLOO)", {"reward_norm": {"mean_level": "group", "std_level": None, "mean_leave1out": True},
                                 "token_rewards_as_adv": True}, "seq-mean-token-sum"),
    ("gvpo shaping (RLOO)", {"reward_norm": {"mean_level": "group", "std_level": None, "mean_leave1out": True},
                             "token_rewards_as_adv": True, "advantage_shaping": {"mode": "gvpo"}},
     "seq-mean-token-sum"),
    ("process_weighted shaping (RLOO)",
     {"reward_norm": {"mean_level": "group", "std_level": None, "mean_leave1out": True},
      "token_rewards_as_adv": True, "advantage_shaping": {"mode": "process_weighted"}}, "seq-mean-token-sum"),
    ("gigpo", {"credit_assignment": {"mode": "gigpo"}}, "seq-mean-token-sum"),
    ("pure", {"credit_assignment": {"mode": "pure"}}, "seq-mean-token-sum"),
    ("prime", {"credit_assignment": {"mode": "prime"}}, "seq-mean-token-sum"),
    ("tree", {"credit_assignment": {"mode": "tree"}}, "seq-mean-token-sum"),
    ("reinforce_pp", {"credit_assignment": {"mode": "reinforce_pp"}}, "seq-mean-token-sum"),
    ("reinforce_pp_baseline", {"credit_assignment": {"mode": "reinforce_pp_baseline"}}, "seq-mean-token-sum"),
    ("otb", {"credit_assignment": {"mode": "otb"}}, "seq-mean-token-sum"),
    ("turn_rloo: the unbiased per-turn baseline", {"credit_assignment": {"mode": "turn_rloo"}}, "seq-mean-token-sum"),
    ("RFC #7244's per-turn-index baseline (not offered)", {"credit_assignment": {"mode": "turn_index_baseline"}},
     "seq-mean-token-sum"),
)


def built_in_config(settings: Mapping[str, Any]) -> AdvantageConfig:
    """A ``BUILT_IN`` entry's ``AdvantageConfig``: its settings over no KL, no ``adv_norm`` and folded process
    rewards.

    Args:
        settings: The entry's ``actor`` settings.

    Example:
        >>> prm_jax.audit.built_in_config({"gae_lambda": 0.95}).gae_lambda
        0.95
    """
    return AdvantageConfig(**{"kl_ctl": 0.0, "reward_norm": None, "adv_norm": None, "token_rewards_as_adv": False,
                              **settings})


def built_in_table(problems: Sequence[AuditProblem] = SUITE,
                   entries: Sequence[tuple[str, Mapping[str, Any], Aggregation]] | None = None,
                   ) -> list[tuple[str, str, list[str]]]:
    """The audit of every ``BUILT_IN`` mode: ``(name, aggregation, a cell a problem)``, each cell the verdict with
    ``across`` where it fails (the guide renders it at every docs build).

    Args:
        problems: The problems (default: ``SUITE``).
        entries: The modes (default: ``BUILT_IN``).

    Example:
        >>> rows = prm_jax.audit.built_in_table(prm_jax.audit.SUITE[:1])
        >>> rows[3]
        ('RLOO: leave-one-out group mean, token sum', 'seq-mean-token-sum', ['pass'])
    """
    rows: list[tuple[str, str, list[str]]] = []
    with known_forms():
        for name, settings, aggregation in BUILT_IN if entries is None else entries:
            report = audit(built_in_config(settings), aggregation, problems=problems)
            cells = [(f"fail ({r.across:.2g} across)" if r.scale > TOLERANCE else "fail (no signal)")
                     if r.verdict == "fail" else r.verdict for r in report.results]
            rows.append((name, aggregation, cells))
    return rows
