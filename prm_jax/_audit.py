"""The credit auditor's core (issue 59, in part; its public module, its problems suite, report and
command come later): on a problem small enough to enumerate, the exact policy gradient of a tabular softmax
policy beside the expected gradient the configured advantage pipeline gives, both in float64.

The policy: a response of at most ``max_len`` tokens from a vocabulary of ``vocab``, token ``j`` drawn from
``softmax(theta[j])`` (a tabular policy indexed by position); with ``eos`` set, the token ``eos`` ends the
response early (the policy controls its length), else every response has ``max_len`` tokens. A problem's
``reward`` scores a whole response. The true gradient of ``J = E[R]`` is
``sum_tau p(tau) R(tau) grad log p(tau)``, by enumeration of every response.

The estimate: ``group_size`` responses drawn independently make a group; the configured pipeline
(``compute_advantages`` with the given ``AdvantageConfig``) turns each group into advantages, and the policy
loss's gradient at the sampling policy is ``sum_i sum_t w_it A_it grad log pi(a_it)``, with the aggregation's
weights ``w`` (``token-sum``: ``1 / G``; ``seq-mean-token-mean``: ``1 / (G n_i)``, GRPO's; ``token-mean``:
``1 / sum_i n_i``, DAPO's). Its expectation is exact: every ordered group is enumerated with its probability
(``K ** G`` groups of ``K`` responses, all in one call of the pipeline); where they are too many,
``sampled_estimate`` draws groups with a fixed seed and gives the standard error.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np

Aggregation = Literal["token-sum", "seq-mean-token-mean", "token-mean"]


@dataclasses.dataclass(frozen=True)
class Problem:
    """A response space small enough to enumerate, and its reward.

    Args:
        name: How reports name it.
        vocab: Tokens to choose from at each position, >= 2.
        max_len: The longest response, >= 1.
        reward: A response's reward (its tokens, a tuple).
        eos: The token that ends a response early; ``None``: every response has ``max_len`` tokens.
    """

    name: str
    vocab: int
    max_len: int
    reward: Callable[[tuple[int, ...]], float]
    eos: int | None = None


def responses(problem: Problem) -> list[tuple[int, ...]]:
    """Every response the policy can give, shortest first."""
    out: list[tuple[int, ...]] = []
    tokens = range(problem.vocab)
    for length in range(1, problem.max_len + 1):
        for seq in itertools.product(tokens, repeat=length):
            ends = problem.eos is not None and seq[-1] == problem.eos
            earlier_eos = problem.eos is not None and problem.eos in seq[:-1]
            if earlier_eos:
                continue
            if length == problem.max_len or ends:
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
    """``grad E[R] = sum_tau p(tau) R(tau) grad log p(tau)``, by enumeration (float64)."""
    out = np.zeros(theta.shape)
    for seq in responses(problem):
        logp, grads = log_prob_grads(theta, seq)
        out += np.exp(logp) * problem.reward(seq) * grads.sum(axis=0)
    return out


def group_gradients(problem: Problem, theta: np.ndarray, config: object, groups: np.ndarray,
                    aggregation: Aggregation = "token-sum") -> np.ndarray:
    """Each group's policy-loss gradient, ``[n_groups, *theta.shape]`` (float64 sums of the pipeline's float32
    advantages): ``groups`` holds each group's responses as indices into ``responses(problem)``, and the
    configured pipeline scores all of them in one call.

    Args:
        problem: The problem.
        theta: The policy's logits, ``[max_len, vocab]``.
        config: The ``AdvantageConfig`` (or its plan).
        groups: ``[n_groups, group_size]`` indices of responses.
        aggregation: How the loss aggregates tokens (the module docstring).
    """
    import prm_jax

    seqs = responses(problem)
    n, g = groups.shape
    width = problem.max_len + 1  # (a one-token prompt, then the response)
    rows = groups.reshape(-1)
    lengths = np.array([len(s) for s in seqs])
    positions = np.arange(width)
    row_lengths = lengths[rows]
    batch = {"attention_mask": (positions[None, :] <= row_lengths[:, None]).astype(np.int32),
             "loss_mask": ((positions[None, :] >= 1) & (positions[None, :] <= row_lengths[:, None])).astype(np.int32),
             "logprobs": np.zeros((rows.size, width), np.float32),
             "rewards": np.array([problem.reward(s) for s in seqs], np.float32)[rows],
             "is_truncated": np.zeros(rows.size, bool),
             "group_sizes": np.full(n, g, np.int32)}
    out = prm_jax.compute_advantages(batch, config)  # type: ignore[arg-type]
    # timestep t predicts the response's token t (position t + 1): the first max_len timesteps
    advantages = np.asarray(out.advantages, np.float64)[:, :problem.max_len]
    token_grads = np.zeros((len(seqs), problem.max_len, theta.size))
    for index, seq in enumerate(seqs):
        token_grads[index, :len(seq)] = log_prob_grads(theta, seq)[1].reshape(len(seq), -1)
    row_grads = np.einsum("rt,rtp->rp", advantages, token_grads[rows]).reshape(n, g, theta.size)
    tokens = lengths[groups]
    if aggregation == "token-sum":
        per_row = np.full(groups.shape, 1.0 / g)
    elif aggregation == "seq-mean-token-mean":
        per_row = 1.0 / (g * tokens)
    elif aggregation == "token-mean":
        per_row = np.repeat(1.0 / tokens.sum(axis=1, keepdims=True), g, axis=1)
    else:
        raise ValueError(f"aggregation must be token-sum, seq-mean-token-mean or token-mean, got {aggregation!r}")
    return np.einsum("ng,ngp->np", per_row, row_grads).reshape(n, *theta.shape)


def expected_estimate(problem: Problem, theta: np.ndarray, config: object, group_size: int,
                      aggregation: Aggregation = "token-sum") -> np.ndarray:
    """The expectation, over every ordered group of ``group_size`` responses (``K ** G`` of them), of the policy
    loss's gradient the configured pipeline gives (see the module docstring).

    Args:
        problem: The problem.
        theta: The policy's logits, ``[max_len, vocab]``.
        config: The ``AdvantageConfig`` (or its plan).
        group_size: Responses a group.
        aggregation: How the loss aggregates tokens.
    """
    seqs = responses(problem)
    groups = np.array(list(itertools.product(range(len(seqs)), repeat=group_size)), np.int64)
    probabilities = np.exp([log_prob_grads(theta, s)[0] for s in seqs])[groups].prod(axis=1)
    return np.tensordot(probabilities, group_gradients(problem, theta, config, groups, aggregation), axes=1)


def sampled_estimate(problem: Problem, theta: np.ndarray, config: object, group_size: int, samples: int,
                     seed: int = 0, aggregation: Aggregation = "token-sum") -> tuple[np.ndarray, np.ndarray]:
    """Monte Carlo where groups are too many to enumerate: the mean of ``samples`` groups drawn from the policy
    (a fixed ``seed``) and its standard error, per parameter.

    Args:
        problem: The problem.
        theta: The policy's logits, ``[max_len, vocab]``.
        config: The ``AdvantageConfig`` (or its plan).
        group_size: Responses a group.
        samples: Groups drawn, >= 2.
        seed: The generator's seed.
        aggregation: How the loss aggregates tokens.
    """
    if samples < 2:
        raise ValueError(f"samples must be >= 2 (a standard error needs two), got {samples}")
    seqs = responses(problem)
    probabilities = np.exp([log_prob_grads(theta, s)[0] for s in seqs])
    rng = np.random.default_rng(seed)
    groups = rng.choice(len(seqs), size=(samples, group_size), p=probabilities / probabilities.sum())
    per_group = group_gradients(problem, theta, config, groups, aggregation)
    return per_group.mean(axis=0), per_group.std(axis=0, ddof=1) / np.sqrt(samples)


@dataclasses.dataclass(frozen=True)
class Comparison:
    """The estimate against the true gradient: their cosine, the estimate's scale along the true gradient
    (``<est, true> / |true|^2``) and what is left across it, relative to ``|true|``."""

    cosine: float
    scale: float
    across: float


def compare(estimate: np.ndarray, truth: np.ndarray) -> Comparison:
    """How far ``estimate`` is from a multiple of ``truth`` (float64)."""
    e, t = np.ravel(estimate), np.ravel(truth)
    norm_t = float(np.linalg.norm(t))
    if norm_t == 0.0:
        raise ValueError("the true gradient is zero: nothing to compare against")
    scale = float(e @ t) / norm_t ** 2
    cosine = float(e @ t) / (float(np.linalg.norm(e)) * norm_t) if np.linalg.norm(e) else 0.0
    return Comparison(cosine, scale, float(np.linalg.norm(e - scale * t)) / norm_t)


def compare_questions(problems: Sequence[Problem], thetas: Sequence[np.ndarray], config: object, group_size: int,
                      aggregation: Aggregation = "token-sum") -> Comparison:
    """Several questions at once, each with its own tabular policy and its own groups (the training batch's
    questions): the estimate and the true gradient of ``sum_q J_q``, each question's block side by side. A
    normalization whose scale differs by question (std normalization, by the question's reward spread) turns
    the estimate away from the truth even where each question's block is parallel to its own."""
    estimate = np.concatenate([np.ravel(expected_estimate(p, t, config, group_size, aggregation))
                               for p, t in zip(problems, thetas, strict=True)])
    truth = np.concatenate([np.ravel(true_gradient(p, t)) for p, t in zip(problems, thetas, strict=True)])
    return compare(estimate, truth)
