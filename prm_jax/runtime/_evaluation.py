"""One scorer on one branch: its results obtained (per turn, concurrently, or the whole branch in one call,
through its executor; a prefix-determined scorer's shared turns once), validated (shape, finiteness, the
observation rules, stable metric schemas) and staged; then every scorer's staged rewards committed at once.
``PRMRunner.run`` drives it."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from prm_jax._validation import short_repr
from prm_jax.runtime import _shared_turns as shared_turns
from prm_jax.runtime._concurrency import concurrently
from prm_jax.runtime._executors import AsyncExecutor, Executor
from prm_jax.runtime._rewards import weighted_rewards
from prm_jax.runtime._scoring import BaseScorer, PRMMetricObservation, PRMScorerResult, PRMTurnResult
from prm_jax.runtime._trajectory import Interaction


def _raised_on(err: BaseException, scorer: BaseScorer, where: str) -> None:
    """The note naming the scorer and what its call covered; a batch's error has one naming its items (the
    same object is raised by every branch in the batch), so it gets none per branch."""
    if not getattr(err, "prm_batch", False):
        err.add_note(f"raised by scorer {scorer.name!r} on {where}")


def _plain(scorer: BaseScorer) -> bool:
    """The scorer keeps BaseScorer's ``evaluate_result``/``prepare_result``: its raw results need no wrapper."""
    return (type(scorer).evaluate_result is BaseScorer.evaluate_result
            and type(scorer).prepare_result is BaseScorer.prepare_result)


def _prepares(scorer: BaseScorer) -> bool:
    """The scorer overrides ``prepare_result``: the runner applies it to what a synchronous or batched
    ``evaluate`` returned (an async scorer's ``evaluate_result`` applies it itself)."""
    return type(scorer).prepare_result is not BaseScorer.prepare_result


@dataclasses.dataclass
class Staged:
    """One scorer's validated results for a branch, waiting to be committed with the others."""

    scorer: BaseScorer
    weighted: list[np.ndarray] = dataclasses.field(default_factory=list)
    results: list[PRMTurnResult] = dataclasses.field(default_factory=list)
    schemas: dict = dataclasses.field(default_factory=dict)


async def _evaluate_all(scorer: BaseScorer, executor: Executor, views: list[Interaction],
                        ctx: Mapping[str, Any]) -> list[Any]:
    if scorer.unit == "trajectory":
        return await _evaluate_trajectory(scorer, executor, views, ctx)
    return await _evaluate_turns(scorer, executor, views, ctx)

async def _evaluate_trajectory(scorer: BaseScorer, executor: Executor, views: list[Interaction],
                               ctx: Mapping[str, Any]) -> list[Any]:
    """The whole branch in one call: a mapping of interaction id to reward (missing ids get 0.0)."""
    where = f"the branch ending at {views[-1].interaction_id!r}"
    try:
        mapping = await executor.run((tuple(views), ctx), where)
    except Exception as err:
        _raised_on(err, scorer, where)
        raise
    if mapping is None:
        return [None] * len(views)
    if not isinstance(mapping, Mapping):
        raise TypeError(f"scorer {scorer.name!r}: evaluate_trajectory must return a mapping of interaction "
                        f"id to reward, got {type(mapping).__name__}")
    ids = {view.interaction_id for view in views}
    unknown = sorted(map(str, set(mapping) - ids))
    if unknown:
        raise ValueError(f"scorer {scorer.name!r}: evaluate_trajectory returned unknown interaction ids "
                         f"{short_repr(unknown)}")
    return [scorer.prepare_result(view, mapping.get(view.interaction_id, 0.0), ctx) for view in views]

async def _evaluate_turns(scorer: BaseScorer, executor: Executor, views: list[Interaction],
                          ctx: Mapping[str, Any]) -> list[Any]:
    """Every turn concurrently; the first failure cancels the others and is raised."""
    outcomes: list[Any] = [None] * len(views)
    done = [False] * len(views)
    failure: list[BaseException] = []
    # An async scorer that keeps BaseScorer's evaluate_result/prepare_result is awaited directly: its raw
    # result is wrapped later only if needed (two allocations fewer per turn on the hot path).
    if scorer.executor == "async" and not _plain(scorer):
        run = _async_results(scorer, executor)
    else:
        run = executor.run
    prepare = scorer.prepare_result if scorer.executor != "async" and _prepares(scorer) else None

    shared = shared_turns.current() if scorer.prefix_determined else None

    async def score(i: int) -> None:
        view = views[i]
        try:
            origin = view.__dict__.get("_origin") if shared is not None else None
            if origin is None or shared is None:
                outcome = await run((view, ctx), view)
            else:
                outcome = await shared_turns.once(shared, (origin, view.interaction_id, id(scorer)),
                                      lambda: run((view, ctx), view))
            outcomes[i] = outcome if prepare is None else prepare(view, outcome, ctx)
            done[i] = True
        except Exception as err:  # (a cancellation that was asked for passes through)
            _raised_on(err, scorer, f"interaction {view.interaction_id!r}")
            if not failure:
                failure.append(err)
            raise  # the group cancels the other turns

    try:
        await concurrently([score(i) for i in range(len(views))])
    except Exception:
        if not failure:
            raise
    if failure:
        raise failure[0]
    if not all(done):
        raise RuntimeError(f"scorer {scorer.name!r} was cancelled on {done.count(False)} of {len(views)} turns "
                           "before returning")
    return outcomes

def _async_results(scorer: BaseScorer, executor: Executor) -> Any:
    """An async scorer's ``evaluate_result`` under its executor (its deadline, its slots)."""
    assert isinstance(executor, AsyncExecutor)

    async def run(args: tuple[Any, ...], on: Any) -> Any:
        return await executor.run_call(scorer.evaluate_result(*args), on)
    return run

async def staged(scorer: BaseScorer, executor: Executor, chain: list[Interaction], views: list[Interaction],
                 ctx: Mapping[str, Any], schemas: Mapping[tuple[str, str, str], Any]) -> Staged:
    """Evaluates and validates one scorer's results on a branch (``schemas``: the metric schemas committed so
    far); nothing is committed here."""
    outcomes = await _evaluate_all(scorer, executor, views, ctx)
    missing = [turn.interaction_id for turn, outcome in zip(chain, outcomes)
               if outcome is None or (isinstance(outcome, PRMScorerResult) and outcome.reward is None)]
    if missing:
        raise RuntimeError(f"scorer {scorer.name!r} returned None for {len(missing)} of {len(outcomes)} turns "
                           f"(interaction {short_repr(missing[0]) if len(missing) == 1 else short_repr(missing)}), "
                           "which rejects the trajectory (return 0.0 for a real zero)")
    stage = Staged(scorer)
    seen: set = set()
    raw_allowed = _plain(scorer) and scorer.unit == "turn"
    for turn, outcome in zip(chain, outcomes):
        if isinstance(outcome, PRMScorerResult):
            reward, observations = outcome.reward, outcome.observations
        elif raw_allowed:  # what BaseScorer.prepare_result would have wrapped
            reward, observations = outcome, ()
        else:
            raise TypeError(f"scorer {scorer.name!r} on interaction {turn.interaction_id!r}: evaluate_result "
                            f"must return a PRMScorerResult, got {type(outcome).__name__}")
        weighted, mean = weighted_rewards(scorer, turn, reward)
        for obs in observations:
            _check_observation(scorer, turn, obs, seen, schemas, stage.schemas)
        stage.weighted.append(weighted)
        stage.results.append(PRMTurnResult(scorer.name, turn.interaction_id, scorer.weight, weighted, mean,
                                           observations))
    return stage

def _check_observation(scorer: BaseScorer, turn: Interaction, obs: Any, seen: set,
                       schemas: Mapping[tuple[str, str, str], Any], new_schemas: dict) -> None:
    where = f"scorer {scorer.name!r} on interaction {turn.interaction_id!r}"
    if not isinstance(obs, PRMMetricObservation):
        raise TypeError(f"{where}: observations must be PRMMetricObservation, got {type(obs).__name__}")
    if obs.scope == "turn" and obs.target_id != turn.interaction_id:
        raise ValueError(f"{where}: a turn-scope observation must target its own turn, got target "
                         f"{obs.target_id!r}")
    key = (obs.scope, obs.target_id, obs.metric_id)
    if key in seen:
        raise ValueError(f"{where}: observation {key} reported more than once in one scorer run")
    seen.add(key)
    schema_key = (scorer.name, obs.scope, obs.metric_id)
    known = schemas.get(schema_key, new_schemas.get(schema_key))
    if known is not None and known != obs.schema:
        raise ValueError(f"{where}: metric {obs.metric_id!r} ({obs.scope}) changed schema from {known} to "
                         f"{obs.schema}; a scorer's metric keeps one value type and aggregation set")
    new_schemas[schema_key] = obs.schema


def commit(chain: list[Interaction], staged: list[Staged], schemas: dict[tuple[str, str, str], Any]) -> list[PRMTurnResult]:
    """Adds every scorer's weighted rewards to the turns, all at once or (non-finite sums) not at all; the
    stages' metric schemas join ``schemas``."""
    totals = []
    for i, turn in enumerate(chain):
        if len(staged) == 1 and turn.token_rewards is None:  # the usual case: 0 + the one scorer's rewards
            only = staged[0].weighted[i]  # the stage's own float32 array, checked finite when staged
            totals.append(np.add(only, np.float32(0), out=only))  # as the sum below gives it (-0.0 -> 0.0)
            continue
        total = turn.token_rewards if turn.token_rewards is not None else np.zeros(turn.output_len, np.float32)
        with np.errstate(over="ignore", invalid="ignore"):
            for stage in staged:
                total = (total + stage.weighted[i]).astype(np.float32)
        if not np.isfinite(total).all():
            names = [stage.scorer.name for stage in staged]
            raise ValueError(f"the committed token rewards of interaction {turn.interaction_id!r} would be "
                             f"non-finite (the float32 sum over scorers {names} and its earlier rewards "
                             "overflows); nothing was committed")
        totals.append(total)
    for turn, total in zip(chain, totals):
        turn.token_rewards = total
    results = []
    for stage in staged:
        schemas.update(stage.schemas)
        results.extend(stage.results)
    return results
