"""``TEIClassifierScorer``: a sequence classifier (a reward model, a judge fine-tuned to classify) served by
Hugging Face's text-embeddings-inference (TEI), ``POST {base_url}/predict``.

The turns of a batch (``max_batch_size``, ``max_wait``: see ``BatchScorer``) go in one request, ``{"inputs":
[[text], ...], "truncate": ..., "raw_scores": false}``, each ``text`` the turn's ``prompt`` template filled
(``OpenAIJudgeScorer``'s template: ``{conversation}``, ``{prompt}``, ``{response}``, ``{ctx[...]}``; by
default the conversation through the turn). TEI answers one list of ``{"score", "label"}`` per input
(``PredictResponse``; ``raw_scores: false``: the model's softmax or sigmoid, probabilities), and a turn's
score is the ``score`` of the label named ``good_label``, read as a probability by the judges' one answer
reader. An answer without that label, or with it twice, fails the batch naming the label.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from prm_jax._validation import boolean, short_repr
from prm_jax.runtime._scoring import BatchScorer
from prm_jax.runtime._settings import setting
from prm_jax.scorers._http import (
    Item,
    Reads,
    ServedScorer,
    ServedSettings,
    Transport,
    transport_setting,
)
from prm_jax.scorers._openai_judge import PROMPT_DOC, Templated, check_template


@dataclasses.dataclass(frozen=True, kw_only=True)
class TEIClassifierSettings(ServedSettings):
    scorer: ClassVar[str] = "TEIClassifierScorer"
    base_url: str = setting(doc="The TEI server's URL (http or https): the scorer POSTs to ``/predict`` under "
                            "it.", example="http://127.0.0.1:8080")
    good_label: str = setting("LABEL_1", doc="The label whose score is the turn's score, as the model's "
                              "config names it (``id2label``; ``LABEL_1`` for an unnamed second class).")
    prompt: str = setting("{conversation}", doc=PROMPT_DOC + " The default classifies the conversation "
                          "through the turn.")
    truncate: bool = setting(False, doc="Whether TEI truncates an input longer than the model's context "
                             "(``False``: such an input fails its batch).")
    transport: Transport = transport_setting()

    def check(self) -> None:
        super().check()
        if not isinstance(self.good_label, str) or not self.good_label:
            raise ValueError(f"good_label must be a label name, got {short_repr(self.good_label)}")
        check_template(self.prompt)
        boolean("truncate", self.truncate, config=False)


class TEIClassifierScorer(Templated, ServedScorer, BatchScorer):
    """Scores each turn with a sequence classifier on text-embeddings-inference's /predict (see the module
    docstring).

    Example:
        >>> rm = prm_jax.scorers.TEIClassifierScorer("http://127.0.0.1:8080", good_label="helpful")
        >>> rm.name, rm.endpoint()
        ('tei_classifier', '/predict')
    """

    name = "tei_classifier"
    settings_class = TEIClassifierSettings
    route = "/predict"

    def request(self, items: Sequence[Item], layout: Any = None) -> dict[str, Any]:
        return {"inputs": [[self.render(turn, ctx)] for turn, ctx in items], "truncate": self.settings.truncate,
                "raw_scores": False}

    def read(self, answer: Any, items: Sequence[Item], where: str, layout: Any = None) -> list[Any]:
        read, label = self.service.reader, self.settings.good_label
        if not isinstance(answer, list) or len(answer) != len(items):
            raise read.error(where, f"expected one list of predictions per input ({len(items)}), got "
                                    f"{short_repr(answer)}")
        out = []
        for i, predictions in enumerate(answer):
            if not isinstance(predictions, list):
                raise read.error(where, f"input {i}'s predictions must be a list, got {short_repr(predictions)}")
            found = [p for p in predictions if isinstance(p, Mapping) and p.get("label") == label]
            if len(found) != 1:
                raise read.error(where, f"input {i}'s predictions hold the label {label!r} {len(found)} times, "
                                        f"not once: {short_repr(predictions)}")
            out.append(read.probability(read.field(found[0], ("score",), where), where,
                                        f"input {i}'s score of {label!r}"))
        return out

    def reads(self) -> Reads:
        return "probability"

    def example_answer(self, request: Mapping[str, Any], value: Any) -> Any:
        """TEI's ``PredictResponse`` for a batch: per input, its labels' ``{"score", "label"}``.

        Args:
            value: The value standing where the score is read (a number, or anything a malformed answer could hold).
        """
        return [[{"score": value, "label": self.settings.good_label}, {"score": 0.0, "label": "other"}]
                for _ in request["inputs"]]
