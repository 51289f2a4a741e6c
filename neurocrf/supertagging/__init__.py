"""neurocrf.supertagging: supertags for LCFRS parsing (Ruprecht & Mörbitz 2021).

- :mod:`~neurocrf.supertagging.supertagger`: the ``Supertagger`` LightningModule (encoder,
  supertag head, preterminal head, optional auxiliary heads);
- :mod:`~neurocrf.supertagging.heads`: plain and factored supertag output layers;
- :mod:`~neurocrf.supertagging.data`: supertag corpora and the ``SupertagDataModule``;
- :mod:`~neurocrf.supertagging.source`: ``KBestTags`` and the ``SupertagSource`` protocol of
  what the parse code takes (a model, an ensemble, saved tags);
- :mod:`~neurocrf.supertagging.ensemble`: several supertaggers read as one;
- :mod:`~neurocrf.supertagging.saved_tags`: a tagger's output saved once, parsed many times;
- :mod:`~neurocrf.supertagging.pipeline`: tag -> parse (with a wider retry) -> summary -> report.

>>> from neurocrf.supertagging.supertagger import Supertagger                      # doctest: +SKIP
>>> Supertagger.load("best.ckpt").predict_kbest([["Het", "regent", "."]], k=10)    # doctest: +SKIP
"""
