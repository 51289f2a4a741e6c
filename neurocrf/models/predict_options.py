"""How a :class:`~neurocrf.models.tagger.Tagger` predicts: one typed, checked set of options, the
same for :meth:`~neurocrf.models.tagger.Tagger.predict`, ``predict_iter``, Lightning's
``predict_step`` (``tagger.predict_options``) and ``neurocrf-predict`` (whose config keys of the
same names fill it).

>>> PredictOptions()
PredictOptions(batch_size=32, max_tokens=None, window=4096, nbest=0, confidences=True, precision='32')
>>> PredictOptions(nbest=3, max_tokens=4096).nbest
3
>>> PredictOptions(batch_size=0)
Traceback (most recent call last):
ValueError: prediction option batch_size must be an integer of at least 1, got 0
"""

from __future__ import annotations

from dataclasses import dataclass

from neurocrf.models.batching import DEFAULT_WINDOW

PREDICT_PRECISIONS = ("32", "bf16")
"""The encoder's precisions at prediction time (the CRF always computes in float32 or float64)."""


@dataclass(frozen=True)
class PredictOptions:
    """The options of a prediction, each with its default.

    Attributes:
        batch_size: at most this many sentences per model call (32).
        max_tokens: at most this many padded tokens (sentences x longest) per model call; a
            longer sentence is a call of its own (None: no token budget).
        window: sentences read ahead and sorted by length together, so that a batch holds
            sentences of similar length; memory is bounded by it whatever the input's size (4096).
        nbest: also the ``nbest`` most probable tag sequences with their probabilities (0: off).
        confidences: each token's marginal confidence and each span's confidence (True);
            False gives the Viterbi tags only, faster.
        precision: ``"32"``, or ``"bf16"`` to run the encoder's matrix products in bfloat16
            (under autocast; the BiLSTM on CPU: its recurrent product only,
            :mod:`neurocrf.encoders.lstm_inference`): faster on CPUs with AVX512-BF16 or AMX and
            on GPUs, tags may differ slightly from float32 ones.
    """

    batch_size: int = 32
    max_tokens: int | None = None
    window: int = DEFAULT_WINDOW
    nbest: int = 0
    confidences: bool = True
    precision: str = "32"

    def __post_init__(self) -> None:
        for name, least in (("batch_size", 1), ("window", 1), ("nbest", 0)):
            _check_count(name, getattr(self, name), least)
        if self.max_tokens is not None:
            _check_count("max_tokens", self.max_tokens, 1, " (or None)")
        if not isinstance(self.confidences, bool):
            raise ValueError(f"prediction option confidences must be true or false, got {self.confidences!r}")
        if self.precision not in PREDICT_PRECISIONS:
            raise ValueError(f"prediction option precision must be one of {PREDICT_PRECISIONS}, got {self.precision!r}")


def _check_count(name: str, value: object, least: int, alternative: str = "") -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"prediction option {name} must be an integer of at least {least}{alternative}, got {value!r}")
