"""``ClassifyPRMScorer``: a reward model served by SGLang's ``POST {base_url}/v1/classify`` (the vLLM 0.7
classification API it follows), scoring each turn from the conversation up to and including it.

SGLang serves reward models as sequence classifiers (``--is-embedding``): one label distribution per
input, not one per step, so a turn is scored by classifying its prefix: the request is ``{"model",
"input": text}`` with ``text`` the branch's conversation through the turn (``prompt``, a ``str.format``
template over ``{conversation}``, ``{prompt}``, ``{response}`` and ``{ctx[...]}``, as ``OpenAIJudgeScorer``'s),
and the turn's score is ``data[0].probs[good_index]``. One request per turn (the documented ``input`` is
one string), under the judges' limiter and retry rules; a turn without text is an error naming it. For a
step-tag PRM that scores every step of a branch in one forward, serve it with vLLM and use
``PoolingPRMScorer``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from prm_jax._validation import integer
from prm_jax.runtime._scoring import BaseScorer
from prm_jax.runtime._settings import setting
from prm_jax.scorers._http import (
    Item,
    Reads,
    ServedScorer,
    ServedSettings,
    Transport,
    transport_setting,
)
from prm_jax.scorers._openai_judge import MODEL_DOC, PROMPT_DOC, Templated, check_served_model, check_template

DEFAULT_CLASSIFY_PROMPT = "{conversation}"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClassifyPRMSettings(ServedSettings):
    scorer: ClassVar[str] = "ClassifyPRMScorer"
    base_url: str = setting(doc="The SGLang server's URL (http or https, without ``/v1``: the scorer POSTs to "
                            "``/v1/classify`` under it).", example="http://127.0.0.1:30000")
    model: str = setting(doc=MODEL_DOC, example="Skywork/Skywork-Reward-V2-Llama-3.1-8B")
    prompt: str = setting(DEFAULT_CLASSIFY_PROMPT, doc=PROMPT_DOC + " The default classifies the conversation "
                          "through the turn.")
    good_index: int = setting(1, doc="The label whose probability is the turn's score (``data[0].probs[i]``), "
                              ">= 0.")
    transport: Transport = transport_setting()

    # OpenAIJudgeScorer's settings of a chat answer, which a classification has none of: refused, not ignored.
    refused: ClassVar[Mapping[tuple[str, ...], str]] = {
        ("system", "score", "pattern", "json_field", "logprob_tokens", "top_logprobs", "score_range", "max_tokens",
         "extra_body"): "set how a chat answer is read; a classification has none"}

    def check(self) -> None:
        super().check()
        check_served_model(self.model)
        check_template(self.prompt)
        integer("good_index", self.good_index, minimum=0)


class ClassifyPRMScorer(Templated, ServedScorer, BaseScorer):
    """Scores each turn with a sequence classifier on SGLang's /v1/classify (see the module docstring).

    Example:
        >>> prm = prm_jax.scorers.ClassifyPRMScorer("http://127.0.0.1:30000", "Skywork/Skywork-Reward-V2-Llama-3.1-8B")
        >>> prm.name, prm.endpoint()
        ('classify_prm', '/v1/classify')
    """

    name = "classify_prm"
    settings_class = ClassifyPRMSettings
    route = "/v1/classify"

    def request(self, items: Sequence[Item], layout: Any = None) -> dict[str, Any]:
        (interaction, ctx), = items
        return {"model": self.settings.model, "input": self.render(interaction, ctx)}

    def read(self, answer: Any, items: Sequence[Item], where: str, layout: Any = None) -> list[Any]:
        read, good = self.service.reader, self.settings.good_index
        value = read.field(answer, ("data", 0, "probs", good), where)
        return [read.probability(value, where, f"data[0].probs[{good}]")]

    def reads(self) -> Reads:
        return "probability"

    def example_answer(self, request: Mapping[str, Any], value: Any) -> Any:
        """SGLang's /v1/classify answer (vLLM 0.7's classification API, as its documentation shows it).

        Args:
            value: The value standing where the score is read (a number, or anything a malformed answer could hold).
        """
        probs: list[Any] = [0.0] * max(2, self.settings.good_index + 1)
        probs[self.settings.good_index] = value
        return {"id": "classify-9bf17f2847b046c99f5d8c3f5bc7e3a8", "object": "list", "created": 1745383213,
                "model": self.settings.model,
                "data": [{"index": 0, "label": "Default", "probs": probs, "num_classes": len(probs)}],
                "usage": {"prompt_tokens": 10, "total_tokens": 10, "completion_tokens": 0,
                          "prompt_tokens_details": None}}
