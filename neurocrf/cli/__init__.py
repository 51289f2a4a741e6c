"""neurocrf.cli: thin Hydra entry points.

- ``neurocrf-train`` / ``python -m neurocrf.cli.train``: fit a tagger, test the best checkpoint;
- ``neurocrf-evaluate`` / ``python -m neurocrf.cli.evaluate``: score a checkpoint on a corpus;
- ``neurocrf-predict`` / ``python -m neurocrf.cli.predict``: tag a CoNLL or plain-text file.

Configs live in ``configs/`` (override the location with ``NEUROCRF_CONFIGS``). Every tool starts
and ends the same way (:mod:`neurocrf.cli.tool`): ``--help`` lists its options with their
documentation (:mod:`neurocrf.cli.help`), a user error is one line and exit status 2, SIGINT and
SIGTERM end it with 130 and 143.
"""
