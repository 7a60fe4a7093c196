"""The documentation's blocks run as written (the README's and the guides', ``tests/documentation.py``): every
one as a user would run it, and some checked in detail."""

import math
import os
import re
import subprocess
import sys
from pathlib import Path

import documentation
import jax.numpy as jnp
import numpy as np
import pytest

from prm_jax import BaseScorer, Interaction, InteractionCache, pack_branches


def readme_block(heading: str) -> str:
    """The first Python block after ``heading`` in the documentation."""
    text = documentation.text()
    section = text[text.index(heading):]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_train_step_example_runs_and_learns():
    namespace: dict = {}
    exec(compile(readme_block("# Calling it from a jitted train step"), "train-step.md", "exec"), namespace)
    vocab = 16
    cache = InteractionCache([
        Interaction("a", [1, 2], [3, 4, 5], output_logprobs=[-2.8] * 3, token_rewards=[1.0, 1.0, 1.0]),
        Interaction("b", [1, 2, 3, 4, 5, 6], [7, 8], parent_id="a", output_logprobs=[-2.8] * 2,
                    token_rewards=[0.5, 0.5], reward=1.0),
    ])
    other = InteractionCache([Interaction("c", [1, 2], [9, 10], output_logprobs=[-2.8] * 2,
                                          token_rewards=[0.0, 0.0], reward=0.0)])
    batch = {k: jnp.asarray(v) for k, v in pack_branches([cache.to_sequence("b"), other.to_sequence("c")],
                                                         bucket=16).items()}
    params = jnp.zeros((vocab, vocab), jnp.float32)
    params, first = namespace["train_step"](params, batch)
    for _ in range(20):
        params, loss = namespace["train_step"](params, batch)
    assert np.isfinite(float(loss)) and float(loss) < float(first)


def test_runtime_example_runs():
    import anyio

    namespace: dict = {}
    exec(compile(readme_block("# The runtime in code"), "runtime.md", "exec"), namespace)
    sessions = []
    for k, out_len in enumerate((4, 300)):
        cache = InteractionCache([Interaction(f"s{k}", [1, 2], [3] * out_len, reward=float(k))])
        sessions.append((cache, f"s{k}"))
    config = Path(__file__).resolve().parents[1] / "examples" / "prm_config.yaml"
    class Judge(BaseScorer):
        name = "judge"
        closed = False

        async def evaluate(self, interaction, ctx):
            return 0.0  # keeps process_weighted's P in [0, 1] next to the length budget

        async def aclose(self):
            self.closed = True

    judge = Judge()
    out = anyio.run(namespace["main"], config, sessions, judge)
    assert not judge.closed  # borrowed: the caller closes it
    assert out.advantages.shape == (2, 384)
    # The short turn is within the 128-token budget, the long one is not: process_weighted zeroes its
    # non-negative advantages.
    assert np.all(np.asarray(out.advantages)[1][np.asarray(out.loss_mask)[1] > 0] == 0.0)
    assert all(i.token_rewards is None for cache, _ in sessions for i in cache)


def test_session_example_is_valid_input(tmp_path):
    import json

    from prm_jax.app.sessions import read_sessions

    text = documentation.text()
    example = json.loads(re.search(r"```json\n(.*?)```", text, re.S).group(1))
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps(example) + "\n")
    (record,) = read_sessions(path)
    sequence = record.cache.to_sequence(record.ready[0])
    assert sequence.is_truncated and sequence.loss_mask.tolist() == [0, 0, 1, 1, 0, 1]


def test_credit_example_runs_and_its_numbers_are_the_loops(capsys):
    import reference

    namespace: dict = {}
    exec(compile(readme_block("# Credit assignment beyond GAE"), "credit-assignment.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0] == "[0.405, 0.9, 0.0, 1.0]"  # no leak: B1 gets 0 (AReaL's discount: 0.9)
    assert reference.areal_linear_discount([0.0, 0.0, 0.0, 1.0], 0.9)[2] == 0.9
    tree = namespace["tree"]
    np.testing.assert_allclose(tree.values, reference.tree_advantages([-1, 0, 1, 1, 0], [0.0, 0.0, 1.0, 0.0, 1.0]),
                               atol=1e-6)
    to_go = np.cumsum(np.asarray(namespace["r"])[0, ::-1])[::-1]
    np.testing.assert_allclose(to_go, [-0.9, 4.5e-7, 3.3e-8], rtol=0.03)
    assert "[[-0.5 -1.   0. ]]" in printed[3]
    got = np.array(printed[4].strip("[]").split(), float)
    np.testing.assert_allclose(got, reference.decoupled(namespace["rewards"], [1.0, 0.5], [0, 0, 1, 1]), rtol=1e-4,
                               atol=1e-4)


def test_progress_example_runs_and_its_numbers_are_the_loops(capsys):
    # Issue 33.3: the guide's worked row (turns scored 0.2, unscored, 0.9; initial 0.1; outcome 1).
    import reference

    namespace: dict = {}
    exec(compile(readme_block("## Progress shaping"), "credit-assignment.md", "exec"), namespace)
    printed = capsys.readouterr().out.splitlines()
    batch = namespace["batch"]
    m = reference.shift(batch["loss_mask"], False).astype(bool)
    tids = reference.shift(batch["turn_ids"], -1)
    process = np.where(m, reference.shift(batch["token_rewards"].astype(np.float64)), 0.0)
    scored = reference.shift(batch["token_reward_mask"], False) & m
    shaped = reference.progress(process, m, tids, scored, batch["rewards"], initial=0.1)
    want = shaped[0, [1, 4, 7]] + np.array([0.0, 0.0, 1.0])  # the outcome on the last turn's end
    np.testing.assert_allclose(np.array(printed[0].strip("[]").split(), float), want, atol=1e-4)
    np.testing.assert_allclose(want, [0.1, 0.0, 0.8], atol=1e-12)
    assert printed[1] == "0.9"  # 1 - initial: the telescoping sum


def test_on_error_mask_example_runs(capsys):
    namespace: dict = {}
    block = readme_block("When a scorer call fails")
    exec(compile(block, "trainers.md", "exec"), namespace)
    # Issue 41.22: the row's error keeps the notes naming the scorer and the turn.
    assert capsys.readouterr().out.strip() == ("[False  True] {1: \"ConnectionError: judge unreachable [raised by "
                                               "scorer 'judge' on interaction 'row1/t0']\"}")
    assert namespace["keep"].tolist() == [True, False]
    assert np.isfinite(namespace["token_rewards"]).all() and namespace["token_rewards"][0, 2:].tolist() == [1.0, 1.0]


# Issue 23.10: every shell and Python block runs as written, in a temporary folder; a block preceded by
# `<!-- not run: reason -->` is a fragment on purpose and is skipped with that reason.
BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```(?P<lang>python|bash)\n(?P<body>.*?)```", re.S)


def readme_blocks():
    """``(lang, body, why, id)`` of every block of every page."""
    return [(m.group("lang"), m.group("body"), m.group("why"), f"{page.stem}-{m.group('lang')}-{i}")
            for page in documentation.PAGES for i, m in enumerate(BLOCK.finditer(page.read_text()))]


@pytest.mark.e2e  # (each block in a process of its own, as a reader runs it, ~60 s of CPU: the end-to-end step)
@pytest.mark.parametrize("lang,body,why", [block[:3] for block in readme_blocks()],
                         ids=[block[3] for block in readme_blocks()])
def test_every_readme_block_runs_as_written(lang, body, why, tmp_path):
    if why:
        pytest.skip(why)
    env = dict(os.environ, JAX_PLATFORMS="cpu", PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    command = [sys.executable, "-c", body] if lang == "python" else ["bash", "-e", "-c", body]
    proc = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{lang} block failed:\n{body}\n{proc.stderr[-3000:]}"


def test_reinforce_pp_example_runs_and_its_numbers_are_the_loops(capsys):
    # Issue 44.2: the guide's worked example (verl's issue #7278) and the baseline variant, against the loop.
    import reference

    namespace: dict = {}
    exec(compile(readme_block("## REINFORCE++ across tool outputs"), "credit-assignment.md", "exec"), namespace)
    printed = capsys.readouterr().out
    mask = namespace["mask"]
    advantages, returns = reference.reinforce_pp(np.array([[0, 0, 0, 0, 0, 1.0]]), mask, 0.9, [0], [True])
    np.testing.assert_allclose(returns, [[0.729, 0.81, 0, 0, 0.9, 1]], atol=1e-12)
    shown = [float(v) for v in re.findall(r"-?\d+\.\d*", printed)]
    np.testing.assert_allclose(shown[:6], returns[0], atol=5e-4)
    np.testing.assert_allclose(shown[6:12], advantages[0], atol=5e-5)
    base, _ = reference.reinforce_pp(namespace["rewards"], np.ones((4, 2), bool), 1.0, [0, 0, 1, 1], [True] * 4,
                                     baseline=True)
    np.testing.assert_allclose(shown[12:], base.reshape(-1), atol=5e-5)


def test_the_global_batch_example_gives_the_whole_batchs_loss(capsys):
    # Issue 44.4: the guide's two ranks of two micro-batches give the mini-batch's loss.
    namespace: dict = {}
    exec(compile(readme_block("## Micro-batches and data-parallel ranks"), "train-step.md", "exec"), namespace)
    split, whole = (float(v) for v in capsys.readouterr().out.split())
    assert split == whole and namespace["split"] == pytest.approx(namespace["whole"], rel=1e-5)


def test_the_otb_example_is_the_worked_example_and_the_float64_loop(capsys):
    # Issue 44.1: verl's multi-turn OTB (verl-project/verl @ 1dda039b, core_algos.py
    # compute_multi_turn_optimal_token_baseline_advantage; arXiv 2602.07078): its numbers, A_0 = (.4444, .5882, 1.0), A_1 =
    # (-.5556, -.4118).
    import reference

    namespace: dict = {}
    exec(compile(readme_block("## The optimal token baseline (OTB)"), "credit-assignment.md", "exec"), namespace)
    shown = [float(v) for v in re.findall(r"-?\d+\.\d*", capsys.readouterr().out)]
    want, _ = reference.optimal_token_baseline(np.array([[0, 0, 1.0], [0, 0, 0]]), namespace["mask"],
                                               np.log(np.full((2, 3), 0.5)), namespace["w"].astype(np.float64), [0, 0])
    np.testing.assert_allclose(shown[:6], want.reshape(-1), atol=5e-5)
    np.testing.assert_allclose(shown[:5], [0.4444, 0.5882, 1.0, -0.5556, -0.4118], atol=1e-4)


def test_the_distillation_example_gives_credit2s_numbers(capsys):
    # Issue 44.3: on-policy distillation as verl computes it (verl-project/verl @ 1dda039b, verl/trainer/distillation/losses.py)
    # and AReaL's MOPD (areal/trainer/mopd/loss.py): R = -1.55 + 1.0 = -0.55, rho = e^0.2, loss = -rho R = 0.6718; k3 of the two
    # tokens (e^x - x - 1 with x = l_T - l) averaged: 0.6787.
    exec(compile(readme_block("## On-policy distillation"), "credit-assignment.md", "exec"), {})
    r, loss, k3 = (float(v) for v in capsys.readouterr().out.split())
    reward = 0.3 * -0.5 + 0.7 * -2.0 - 1.0 * -1.0
    assert r == round(reward, 4) == -0.55 and loss == round(-math.exp(0.2) * reward, 4) == 0.6718
    x = [(-0.4) - (-1.0), (-2.5) - (-0.5)]
    assert k3 == round(sum(math.exp(v) - v - 1 for v in x) / 2, 4) == 0.6787


def test_the_global_batch_section_counts_the_minibatch():
    namespace: dict = {}
    exec(compile(readme_block("## Loss normalization over the global batch"), "credit-assignment.md", "exec"),
         namespace)
    mask = namespace["mask"]
    assert namespace["losses"].global_batch_info(mask, dp_size=2) == {
        "dp_size": 2, "batch_num_tokens": int(mask.sum()), "global_batch_size": mask.shape[0]}


# Issue 55.16: every YAML block of every page loads as the configuration it shows (the serving guide's
# PoolingPRMScorer entry said `name: pooling_prm`, an unknown key), each built-in scorer entry's kwargs pass
# its validate_kwargs, and every JSON block is a session line the reader takes.
DATA_BLOCK = re.compile(r"(?:<!-- not run: (?P<why>[^>]*) -->\n)?```(?P<lang>yaml|json)\n(?P<body>.*?)```", re.S)
DATA_BLOCKS = [(m.group("lang"), m.group("body"), f"{page.stem}-{m.group('lang')}-{i}")
               for page in documentation.PAGES for i, m in enumerate(DATA_BLOCK.finditer(page.read_text()))]


@pytest.mark.parametrize("lang,body", [b[:2] for b in DATA_BLOCKS], ids=[b[2] for b in DATA_BLOCKS])
def test_every_yaml_and_json_block_loads(lang, body, tmp_path):
    import json

    from prm_jax.app.sessions import read_sessions
    from prm_jax.config import load_config
    from prm_jax.runtime import check_scorer_specs

    if lang == "json":
        path = tmp_path / "one.jsonl"
        path.write_text(json.dumps(json.loads(body)) + "\n")
        assert len(read_sessions(str(path))) == 1
        return
    path = tmp_path / "config.yaml"
    path.write_text(body)
    config = load_config(path)
    built_in = [spec for spec in config.prm.scorers if spec.path.startswith("prm_jax.")]
    if built_in and len(built_in) == len(config.prm.scorers):  # (a user's own module is not here to import)
        check_scorer_specs(config)


def test_a_scorer_entry_with_name_instead_of_path_says_did_you_mean_path():
    from prm_jax.config import ConfigError, ExperimentConfig

    with pytest.raises(ConfigError, match=r"scorers\[0\] has unknown key 'name': did you mean path:\?"):
        ExperimentConfig.from_mapping({"rollout": {"agent": {"prm": {"scorers": [{"name": "pooling_prm"}]}}}})


def test_the_first_screens_own_environment_line_names_extras_that_exist():
    # Issue 57.11: the first screen says how to install prm-jax into a user's own environment; every extra it
    # names (in the command and in the list after it) is one pyproject.toml declares, and the line is there.
    import tomllib

    root = Path(__file__).parent.parent
    first_screen = (root / "README.md").read_text().split("## Your own scorer")[0]
    declared = set(tomllib.loads((root / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    command = re.search(r"`pip install -e '\.\[([\w,]+)\]'`", first_screen)
    assert command, "the first screen has no `pip install -e '.[...]'` line"
    listed = set(re.findall(r"`(\w+)`", first_screen.split(command.group(0))[1].split("\n\n")[0]))
    assert set(command.group(1).split(",")) <= declared and listed and listed <= declared, (listed, declared)
