"""Issue 41 ("every stage's inputs come from the schema"): for every configured stage, a batch built by each
entry point (the command line's sessions, packed by ``pack_branches``; ``rollout_from_tunix``; a trainer's
arrays scored by ``score_arrays``) holds every key the stage reads, or ``compute_advantages`` refuses it
naming the key, never a silent fallback (41.7: tunix's ``turn_ids`` left out made turn stages count runs of
the loss mask)."""

import numpy as np
import pytest
import yaml

from prm_jax import PRMRunner, compute_advantages, score_arrays
from prm_jax.app import _cli as cli
from prm_jax.config import AdvantageConfig
from prm_jax.integrations import tunix as adapter
from prm_jax.kernels._schema import REQUIRED_KEYS

STAGES = {
    "gae": {},
    "kl": {"kl_ctl": 0.1},
    "min_form": {"process_reward_transform": {"mode": "min_form", "temperature": 0.5}},
    "progress": {"process_reward_transform": {"mode": "progress", "gamma": 0.9}},
    "turn_gae": {"gae_timestep_unit": "turn", "gae_lambda": 0.9},
    "pure": {"credit_assignment": {"mode": "pure"}},
    "gigpo": {"credit_assignment": {"mode": "gigpo"}},
    "tree": {"credit_assignment": {"mode": "tree"}},
    "prime": {"credit_assignment": {"mode": "prime"}},
    "gdpo": {"reward_norm": {"mode": "decoupled"}},
}


class Stop(Exception):
    pass


def needed(config: AdvantageConfig) -> set[str]:
    """Every key a plan's stages read: the required ones, the plan's own (``AdvantagePlan.reads``) and the
    turns where a stage reads them."""
    plan = config.plan
    keys = set(REQUIRED_KEYS) | set(plan.estimator_spec.reads)  # (GDPO's reward_sources: read when present)
    if plan.reads_turns({"token_rewards": None}):
        keys.add("turn_ids")
    return keys


def refuses_naming_a_missing_key(batch, config, missing):
    with pytest.raises(ValueError) as info:
        compute_advantages(batch, config)
    assert any(f"batch[{key!r}]" in str(info.value) or key in str(info.value) for key in missing), str(info.value)


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_the_command_lines_batch_holds_every_key_its_stages_read(stage, tmp_path):
    demo = yaml.safe_load(open(cli.resources.files("prm_jax").joinpath("data/demo_config.yaml")))
    demo["actor"] = {**demo["actor"], **STAGES[stage]}
    demo["rollout"]["agent"]["prm"]["advantage_shaping"] = {"mode": "additive"}
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(demo))
    config = cli._load_config(str(path))
    packed = {}

    def capture(batch):
        packed.update(batch)
        raise Stop

    sessions = str(cli.resources.files("prm_jax").joinpath("data/demo_sessions.jsonl"))
    try:
        cli.run_score(config, sessions, on_arrays=capture)
    except Stop:
        pass
    except Exception as err:  # refused before packing: it names what the stage reads and the input lacks
        assert stage == "prime" and "prm_logprobs" in str(err), (stage, err)
        return
    assert needed(config.actor) <= set(packed), needed(config.actor) - set(packed)


def tunix_arrays(rng, rows=4):
    prompt_ids = rng.integers(1, 50, (rows, 3))
    prompt_mask = np.ones((rows, 3), bool)
    completion_mask = rng.random((rows, 6)) < 0.8
    completion_mask[:, 0] = completion_mask[:, -1] = True
    completion_ids = np.where(completion_mask, rng.integers(1, 50, (rows, 6)), 0)
    return prompt_ids, prompt_mask, completion_ids, completion_mask


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_a_tunix_rollouts_batch_holds_every_key_its_stages_read_or_is_refused_naming_it(stage):
    rng = np.random.default_rng(7)
    rollout = adapter.rollout_from_tunix(*tunix_arrays(rng), turns="runs")
    batch = rollout.batch(rng.normal(size=4).astype(np.float32), group_size=2,
                          token_rewards=np.where(rollout.loss_mask, 0.5, 0.0).astype(np.float32))
    config = AdvantageConfig(**STAGES[stage])
    missing = needed(config) - set(batch)
    assert "turn_ids" not in missing
    if missing:  # what a rollout cannot carry (the trainer adds it): refused, named
        refuses_naming_a_missing_key(batch, config, missing)
    else:
        assert np.isfinite(np.asarray(compute_advantages(batch, config).advantages)).all()


@pytest.mark.anyio
@pytest.mark.parametrize("stage", sorted(STAGES))
async def test_a_trainers_arrays_scored_by_score_arrays_hold_every_key_or_are_refused_naming_it(stage):
    from scorers_for_tests import ConstantScorer

    rng = np.random.default_rng(8)
    rollout = adapter.rollout_from_tunix(*tunix_arrays(rng), turns="runs")
    runner = PRMRunner(scorers=(ConstantScorer(0.25),))
    token_rewards = await score_arrays(runner, rollout.input_ids, rollout.turn_ids,
                                       attention_mask=rollout.attention_mask)
    batch = dict(attention_mask=rollout.attention_mask, loss_mask=rollout.loss_mask, turn_ids=rollout.turn_ids,
                 logprobs=np.zeros(rollout.input_ids.shape, np.float32), token_rewards=token_rewards,
                 rewards=rng.normal(size=4).astype(np.float32), group_sizes=np.array([2, 2]),
                 is_truncated=np.zeros(4, bool))
    config = AdvantageConfig(**STAGES[stage])
    missing = needed(config) - set(batch)
    if missing:
        refuses_naming_a_missing_key(batch, config, missing)
    else:
        assert np.isfinite(np.asarray(compute_advantages(batch, config).advantages)).all()
