"""The conventions every floor of the package shares, each defined once: the outside tag, the
names of the span tag schemes and of the corpus splits, the file a finished run leaves. Below
every floor: imports nothing.

>>> OUTSIDE, SCHEMES, SPLITS, SUMMARY_FILE
('O', ('IOB1', 'IOB2', 'BIOES'), ('train', 'dev', 'test'), 'summary.json')
"""

from __future__ import annotations

OUTSIDE = "O"
"""The tag of a token outside every span (its prefix is ``O`` too: ``split_tag("O") == ("O", None)``)."""

SCHEMES: tuple[str, ...] = ("IOB1", "IOB2", "BIOES")
"""The span tag schemes (``IOBES`` is read as ``BIOES`` where a scheme name is parsed)."""

SPLITS: tuple[str, ...] = ("train", "dev", "test")
"""The corpus splits, in the order they are read and reported."""

SUMMARY_FILE = "summary.json"
"""The file a finished training run leaves in its run directory (written by
:func:`neurocrf.models.runs.write_summary`; a rerun skips the run, sweep reports read it)."""
