"""neurocrf.models: the Lightning tagger, its heads, metrics, optimizers and prediction objects.

>>> from neurocrf.models import Tagger                                      # doctest: +SKIP
>>> Tagger.load("last.ckpt").predict(["Peter lives in Berlin"])[0].spans    # doctest: +SKIP
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "Tagger": "neurocrf.models.tagger",
    "PredictOptions": "neurocrf.models.predict_options",
    "CheckpointError": "neurocrf.models.checkpoints",
    "read_checkpoint": "neurocrf.models.checkpoints",
    "SoftmaxHead": "neurocrf.models.heads",
    "TaggingHead": "neurocrf.models.heads",
    "build_head": "neurocrf.models.heads",
    "LBFGSNotConvergedWarning": "neurocrf.models.full_batch",
    "Prediction": "neurocrf.models.prediction",
    "PredictedSpan": "neurocrf.models.prediction",
    "NBestPath": "neurocrf.models.prediction",
    "build_predictions": "neurocrf.models.prediction",
    "SpanScores": "neurocrf.models.metrics",
    "span_scores": "neurocrf.models.metrics",
    "format_report": "neurocrf.models.metrics",
    "write_report": "neurocrf.models.metrics",
    "build_optimizer": "neurocrf.models.optim",
    "build_scheduler": "neurocrf.models.optim",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    # Lazy: importing the metrics should not pull in the encoders (and transformers).
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'neurocrf.models' has no attribute {name!r}")
