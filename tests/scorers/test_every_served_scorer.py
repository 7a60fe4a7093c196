"""Issue 57.2: the judge suite runs over every served scorer ``prm_jax.scorers`` exports, in each of its
declared ways of reading an answer (``example_modes``), from its declarations alone: built from its settings'
declared examples, answered through its real transport (an ``httpx.MockTransport`` in place of the server)
with its declared example answer to the very request it sent, then with that answer broken every way
(issue 41's cases: booleans, null, strings, lists, non-finite numbers, values out of range, each field on the
way to the score missing or of the wrong shape, nesting past the bound, a 401 echoing the key). Each broken
answer fails the turn as a ``ServiceError`` naming the scorer and the turn, never a score; a new served
scorer without an example answer fails here by name (``test_every_exported_scorer_declares_what_the_suite_needs``)."""

import inspect
import json
import math

import httpx
import numpy as np
import pytest

import prm_jax.scorers
from prm_jax import Interaction, InteractionCache, PRMRunner
from prm_jax.errors import ServiceError
from prm_jax.runtime._runner import error_text
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.scorers._http import ServedScorer

pytestmark = pytest.mark.anyio
KEY = "sk-test-0123456789abcdef"
SENTINEL = "SENTINEL-VALUE"


def exported_scorers() -> list[type]:
    return [obj for name in prm_jax.scorers.__all__ for obj in [getattr(prm_jax.scorers, name)]
            if isinstance(obj, type) and issubclass(obj, BaseScorer)]


def served_modes() -> list:
    return [pytest.param(cls, mode, id=f"{cls.__name__}-{'-'.join(f'{k}={v}' for k, v in mode.items()) or 'default'}")
            for cls in exported_scorers() if issubclass(cls, ServedScorer) for mode in cls.example_modes]


SERVED = served_modes()


def test_every_exported_scorer_declares_what_the_suite_needs():
    # A served scorer without an example answer, or without an example of a required setting, is named here.
    missing = []
    for cls in exported_scorers():
        if not issubclass(cls, ServedScorer):
            continue
        if cls.example_answer is ServedScorer.example_answer:
            missing.append(f"{cls.__name__}: no example_answer")
        record = cls.settings_class
        required = [p.name for p in inspect.signature(cls).parameters.values() if p.default is p.empty]
        lacking = sorted(set(required) - set(record.examples() if record else {}))
        if record is None or lacking:
            missing.append(f"{cls.__name__}: no declared example of {lacking}")
    assert not missing, missing
    assert {p.values[0].__name__ for p in SERVED} >= {"OpenAIJudgeScorer", "ClassifyPRMScorer", "HTTPJudgeScorer",
                                                       "PoolingPRMScorer", "TeacherLogprobScorer"}


def build(cls, mode, monkeypatch):
    monkeypatch.setenv("JUDGE_KEY", KEY)
    extra = {"max_wait": 0.001} if "max_wait" in inspect.signature(cls).parameters else {}
    return cls(**cls.settings_class.examples(), **mode, api_key_env="JUDGE_KEY", **extra)


def answering(scorer, respond):
    """The scorer's transport answers each request with ``respond(request's JSON) -> (status, bytes)``."""
    def handler(request):
        status, body = respond(json.loads(request.content))
        return httpx.Response(status, content=body)

    scorer.service._client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return scorer


def branch():
    return InteractionCache([Interaction("t0", [100], [1, 2], messages=[{"role": "user", "content": "q0"}],
                                         output_messages=[{"role": "assistant", "content": "a0"}],
                                         output_logprobs=[-0.5, -0.5])])


def encoded(answer) -> bytes:
    return json.dumps(answer).encode()  # (json writes NaN and Infinity as Python reads them)


async def refused(scorer) -> str:
    """The turn's failure, as ``score_arrays`` reports a failed row."""
    with pytest.raises(ServiceError) as info:
        await PRMRunner(scorers=(scorer,)).run(branch())
    await scorer.aclose()
    text = error_text(info.value)
    assert f"'{scorer.name}'" in text and "'t0'" in text, text
    return text


async def scored(scorer) -> list:
    await PRMRunner(scorers=(scorer,)).run(cache := branch())
    await scorer.aclose()
    return [turn.token_rewards.tolist() for turn in cache]


GOOD = {"number": 0.25, "probability": 0.25, "logprob": -1.5, "text": "7"}


@pytest.mark.parametrize("cls, mode", SERVED)
async def test_the_example_answer_scores_the_turn(monkeypatch, cls, mode):
    scorer = build(cls, mode, monkeypatch)
    kind = scorer.reads()
    value = GOOD[kind]
    rewards = await scored(answering(scorer, lambda req: (200, encoded(scorer.example_answer(req, value)))))
    assert len(rewards) == 1 and len(rewards[0]) == 2 and np.isfinite(rewards[0]).all(), rewards


def malformed(kind):
    if kind == "text":  # the value stands in the answer's text: these hold no number
        return [(True, "no score in the answer"), (None, "no score in the answer"), (math.nan, "no score"),
                (math.inf, "no score"), ("11", "outside score_range")]
    beyond = {"probability": [(1.5, "must be a probability in [0, 1], got 1.5"), (-0.5, "must be a probability")],
              "logprob": [(5.0, "must be a log-probability (at most 0), got 5.0")], "number": []}[kind]
    return [(True, "must be a number, got True"), (None, "must be a number, got None"),
            ("7", "must be a number, got '7'"), ([1, 2], "must be a number, got [1, 2]"),
            (math.nan, "must be finite"), (math.inf, "must be finite"), (-math.inf, "must be finite"), *beyond]


@pytest.mark.parametrize("cls, mode", SERVED)
async def test_a_value_that_is_no_score_fails_the_turn_naming_it(monkeypatch, cls, mode):
    # 41.4: JSON true was read as 1; 41.2: a log-prob of +5 became P = 1.0 (clipped).
    kind = build(cls, mode, monkeypatch).reads()
    for value, needle in malformed(kind):
        scorer = build(cls, mode, monkeypatch)
        text = await refused(answering(scorer, lambda req, v=value, s=scorer: (200, encoded(s.example_answer(req, v)))))
        assert needle in text, (value, text)


def path_to(node, target, path=()):
    """The first path (keys and indices) at which ``target`` stands in a decoded answer (or in a string of it:
    a chat answer's content, which holds the score as text or as JSON)."""
    if isinstance(node, str) and target in node:
        return path
    children = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, child in children:
        found = path_to(child, target, (*path, key))
        if found is not None:
            return found
    return None


def broken(answer, path):
    """Each way the answer's containers on the way to the score can be wrong: a key missing, a list empty,
    a container of the other kind, a string in its place."""
    out = []
    for depth in range(len(path)):
        for how in ("missing", "other kind", "a string"):
            copy = json.loads(json.dumps(answer))
            parent = copy
            for key in path[:depth]:
                parent = parent[key]
            key = path[depth]
            node = parent[key]
            if how == "missing":
                if isinstance(node, list) and depth + 1 < len(path):
                    parent[key] = []
                else:
                    del parent[key]
            elif how == "other kind":
                parent[key] = {} if isinstance(node, list) else []
            else:
                parent[key] = "x"
            out.append((f"{how} at {list(path[:depth + 1])}", copy))
    for how, replacement in (("the answer a string", "x"), ("the answer a list", []), ("the answer null", None)):
        out.append((how, replacement))
    return out


@pytest.mark.parametrize("cls, mode", SERVED)
async def test_every_field_on_the_way_to_the_score_missing_or_misshapen_fails_the_turn(monkeypatch, cls, mode):
    scorer = build(cls, mode, monkeypatch)
    turn = next(iter(branch()))
    request = scorer.request([(turn, {})] if scorer.unit == "turn" else [((turn,), {})])
    await scorer.aclose()
    answer = scorer.example_answer(request, SENTINEL)
    path = path_to(answer, SENTINEL)
    assert path, f"{cls.__name__}: the example answer does not hold its value"
    for how, bad in broken(answer, path):
        scorer = build(cls, mode, monkeypatch)
        try:
            await refused(answering(scorer, lambda req, b=bad: (200, encoded(b))))
        except pytest.fail.Exception:
            raise AssertionError(f"{cls.__name__} {mode}: {how} was scored: {bad}") from None


@pytest.mark.parametrize("cls, mode", SERVED)
async def test_an_answer_nested_too_deeply_is_a_located_service_error(monkeypatch, cls, mode):
    # 41.19: a bare RecursionError.
    deep = b"[" * 100_000 + b"]" * 100_000
    text = await refused(answering(build(cls, mode, monkeypatch), lambda req: (200, deep)))
    assert "nested too deeply" in text


@pytest.mark.parametrize("cls, mode", SERVED)
async def test_a_key_echoed_by_the_server_never_reaches_a_message(monkeypatch, cls, mode):
    # 41.14: a 401 body quoting the Authorization header put the key in the error message and traceback.
    body = f'{{"error": "bad header Authorization: Bearer {KEY}", "key": "{KEY}", "other": "bearer abc.def"}}'
    text = await refused(answering(build(cls, mode, monkeypatch), lambda req: (401, body.encode())))
    assert "401" in text and KEY not in text and "abc.def" not in text and "[redacted]" in text, text


@pytest.mark.parametrize("cls, mode", SERVED)
async def test_the_probe_is_the_scorers_own_request_read_as_every_answer_is(monkeypatch, cls, mode):
    scorer = build(cls, mode, monkeypatch)
    sent = []
    answering(scorer, lambda req: (sent.append(req), (200, encoded(scorer.example_answer(req, GOOD[scorer.reads()]))))[1])
    probe = await scorer.probe()
    assert probe.ok and probe.status == "HTTP 200 OK", probe
    assert sent == [scorer.request(scorer.probe_items())]
    answering(scorer, lambda req: (200, encoded(scorer.example_answer(req, True))))
    probe = await scorer.probe()
    await scorer.aclose()
    assert not probe.ok and "HTTP 200 OK, but" in probe.status, probe


@pytest.mark.parametrize("cls, mode", SERVED)
async def test_a_call_derives_its_layout_once_for_the_request_and_the_answer(monkeypatch, cls, mode):
    # A review found the pooling PRM tagging each branch twice a call (once for the request, once to read the
    # rows; ~15 ms a batch of 64 long branches, on the event loop), and the teacher its token ids twice.
    scorer = build(cls, mode, monkeypatch)
    calls = []
    layout = scorer.layout

    def counted(items):
        calls.append(len(items))
        return layout(items)

    monkeypatch.setattr(scorer, "layout", counted)
    tagged = []
    if hasattr(scorer, "tagged"):  # (the pooling PRM's tagging: once, through its layout)
        tag = scorer.tagged
        monkeypatch.setattr(scorer, "tagged", lambda items: tagged.append(1) or tag(items))
    rewards = await scored(answering(scorer, lambda req: (200, encoded(scorer.example_answer(req, GOOD[scorer.reads()])))))
    assert calls == [1] and tagged in ([], [1]) and np.isfinite(rewards[0]).all(), (calls, tagged)
