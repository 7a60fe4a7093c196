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

import inspect
from collections.abc import Mapping
from typing import Any

from prm_jax._validation import integer
from prm_jax.runtime._trajectory import Interaction
from prm_jax.scorers._http import Probe
from prm_jax.scorers._openai_judge import OpenAIJudgeScorer

DEFAULT_CLASSIFY_PROMPT = "{conversation}"
# OpenAIJudgeScorer's settings of a chat answer, which a classification has none of: refused, not ignored.
CHAT_ONLY = ("system", "score", "pattern", "json_field", "logprob_tokens", "top_logprobs", "score_range",
             "max_tokens", "extra_body")


class ClassifyPRMScorer(OpenAIJudgeScorer):
    """Scores each turn with a sequence classifier on SGLang's /v1/classify (see the module docstring)."""

    name = "classify_prm"

    def __init__(self, base_url: str, model: str, prompt: str = DEFAULT_CLASSIFY_PROMPT, good_index: int = 1,
                 **kwargs: Any):
        chat_only = sorted(set(kwargs) & set(CHAT_ONLY))
        if chat_only:
            raise ValueError(f"{chat_only} set how a chat answer is read; a classification has none")
        integer("good_index", good_index, minimum=0)
        super().__init__(base_url, model, prompt=prompt, score_range=None, **kwargs)
        self.good_index = good_index

    @classmethod
    def validate_kwargs(cls, base_url: Any = None, model: Any = None, prompt: Any = DEFAULT_CLASSIFY_PROMPT,  # type: ignore[override]
                        good_index: Any = 1, **kwargs: Any) -> None:
        integer("good_index", good_index, minimum=0)
        defaults = {p.name: p.default for p in inspect.signature(OpenAIJudgeScorer.__init__).parameters.values()}
        chat_only = sorted(key for key in CHAT_ONLY if key in kwargs and kwargs[key] != defaults[key]
                           and not (key == "score_range" and kwargs[key] is None))  # (ours: None)
        if chat_only:
            raise ValueError(f"{chat_only} set how a chat answer is read; a classification has none")
        super().validate_kwargs(base_url=base_url, model=model, prompt=prompt,
                                **{k: v for k, v in kwargs.items() if k not in CHAT_ONLY})

    async def probe(self) -> Probe:
        """One small classification (``prm-jax validate-config --probe``)."""
        def check(answer: Any) -> None:
            where = f"scorer {self.name!r} (probe)"
            read = self.service.reader
            read.probability(read.field(answer, ("data", 0, "probs", self.good_index), where), where,
                             f"data[0].probs[{self.good_index}]")

        return await self.service.probe(self.name, "/v1/classify", {"model": self.model, "input": self.PROBE_TEXT},
                                        check)

    async def evaluate(self, interaction: Interaction, ctx: Mapping[str, Any]) -> float:
        text = self.render(interaction, ctx)
        answer = await self.service.post("/v1/classify", {"model": self.model, "input": text})
        where = f"scorer {self.name!r} on interaction {interaction.interaction_id!r}"
        read = self.service.reader
        value = read.field(answer, ("data", 0, "probs", self.good_index), where)
        return read.probability(value, where, f"data[0].probs[{self.good_index}]")

