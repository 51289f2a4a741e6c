"""neurocrf.supertagging: supertags for LCFRS parsing (Ruprecht & Mörbitz 2021).

- :mod:`~neurocrf.supertagging.supertagger`: the :class:`Supertagger` LightningModule (encoder,
  supertag head, preterminal head, optional auxiliary heads);
- :mod:`~neurocrf.supertagging.heads`: plain and factored supertag output layers;
- :mod:`~neurocrf.supertagging.data`: supertag corpora and the :class:`SupertagDataModule`;
- :mod:`~neurocrf.supertagging.ensemble`: several supertaggers read as one;
- :mod:`~neurocrf.supertagging.saved_tags`: a tagger's output saved once, parsed many times;
- :mod:`~neurocrf.supertagging.pipeline`: tag -> parse (with a wider retry) -> summary -> report.

>>> from neurocrf.supertagging import Supertagger                                  # doctest: +SKIP
>>> Supertagger.load("best.ckpt").predict_kbest([["Het", "regent", "."]], k=10)    # doctest: +SKIP
"""

from importlib import import_module
from typing import Any

_LAZY = {
    "Supertagger": "neurocrf.supertagging.supertagger",
    "KBestTags": "neurocrf.supertagging.source",
    "SupertagDataModule": "neurocrf.supertagging.data",
    "SupertaggerEnsemble": "neurocrf.supertagging.ensemble",
    "SavedSupertags": "neurocrf.supertagging.saved_tags",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    # Lazy: reading saved tags should not pull in the encoders (and transformers).
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'neurocrf.supertagging' has no attribute {name!r}")
