"""The conventions every floor of the package shares, each defined once: the outside tag, the
names of the span tag schemes and of the corpus splits. Below every floor: imports nothing.

>>> OUTSIDE, SCHEMES, SPLITS
('O', ('IOB1', 'IOB2', 'BIOES'), ('train', 'dev', 'test'))
"""

from __future__ import annotations

OUTSIDE = "O"
"""The tag of a token outside every span (its prefix is ``O`` too: ``split_tag("O") == ("O", None)``)."""

SCHEMES: tuple[str, ...] = ("IOB1", "IOB2", "BIOES")
"""The span tag schemes (``IOBES`` is read as ``BIOES`` where a scheme name is parsed)."""

SPLITS: tuple[str, ...] = ("train", "dev", "test")
"""The corpus splits, in the order they are read and reported."""
