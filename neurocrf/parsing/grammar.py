"""Lexical LCFRS rules ("supertags") and their canonical string form.

A supertag is the lexical rule of one token with the token replaced by a wildcard ``t``::

    A(α_1, ..., α_f) -> B C

with an attachment mark ``a`` in {1, 2}, where ``B`` is the rule's *first* child, ``C`` its *second* child
(either may be absent) and each
``α_i`` is a string over the variables ``x0, x1, ...`` (the blocks of ``B``, left to right),
``y0, y1, ...`` (the blocks of ``C``) and exactly one ``t`` in the whole rule. ``f`` is the fanout
of the left-hand side; components are separated by a gap in the sentence.

``a`` says which child of its parent the rule's node is (1: first, 2: second child or root): an
item built by the rule may only fill that slot. Without it the tag sequence would not determine
the tree: ``X(h, X(X(..), D))`` and ``X(X(h, X(..)), D)`` (``h`` a token handed down) lexicalize
to the same rules.

The roles *first* / *second* are the markers that undo terminal transport (see
:mod:`neurocrf.parsing.supertags`): the token ``t`` belongs to the constituent built from ``C``
(it fills the hole at the bottom of ``C``'s chain of first children, so it lies left of all of
``C``'s blocks) or, when ``C`` is absent, it
is a preterminal child of ``A`` of its own. When ``B`` is absent, ``A``'s first child is a hole
filled by a token coming from above. The special nonterminal ``@pt`` stands for the one
preterminal that keeps its token (the sentence's first token): the rule ``@pt 1 t - -``.

String form (one line, fields separated by single spaces)::

    <lhs> <attach> <composition> <first> <second>

``<composition>``: components joined by ``,``, each the concatenation of its symbols, e.g.
``x0t,x1y0``. Absent children are ``-``. Labels are percent-escaped (``%``, whitespace and a
leading ``@``; a label that is exactly ``-`` is written ``%2D``), so every label round-trips.

>>> tag = Supertag.parse("VP_2 2 x0t,y0 NP V")
>>> tag.fanout, tag.fanout_first, tag.fanout_second, tag.attach, str(tag)
(2, 1, 1, 2, 'VP_2 2 x0t,y0 NP V')
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from itertools import pairwise

__all__ = ["PT", "TERMINAL", "Supertag", "escape_label", "unescape_label"]

PT = "@pt"
"""Nonterminal of the preterminal that keeps its token (always the sentence's first token)."""

TERMINAL = "t"
"""The wildcard symbol: the token the supertag is assigned to."""

_ABSENT = "-"
_SYMBOL = re.compile(r"t|x\d+|y\d+")
_COMPONENT = re.compile(r"(?:t|x\d+|y\d+)+")
_NEEDS_ESCAPE = re.compile(r"[%\s]")


def escape_label(label: str) -> str:
    """Label -> a space-free token that cannot be confused with ``-`` or ``@pt``."""
    if not label:
        raise ValueError("empty nonterminal label cannot be written in a supertag")
    out = _NEEDS_ESCAPE.sub(lambda m: f"%{ord(m.group()):02X}", label)
    if out == _ABSENT:
        return "%2D"
    if out.startswith("@"):
        out = "%40" + out[1:]
    return out


def unescape_label(token: str) -> str:
    """Inverse of :func:`escape_label`."""
    if "%" not in token:
        return token
    return re.sub(r"%([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), token)


@dataclass(frozen=True)
class Supertag:
    """One lexical LCFRS rule with the token replaced by :data:`TERMINAL`.

    Args:
        lhs: left-hand side label (``PT`` for the first token's preterminal).
        composition: the components of the left-hand side, each a tuple of symbols
            (``"t"``, ``"x<i>"``, ``"y<j>"``).
        first: label of the first child (``PT`` allowed) or None.
        second: label of the second child or None.
        attach: 1 if the rule's node is its parent's first child, 2 if it is the second child
            or the root.

    Raises ValueError if the rule is not linear, non-erasing and canonical (each child's blocks
    used once, left to right, no two neighbouring symbols of the same child, exactly one ``t``).
    """

    lhs: str
    composition: tuple[tuple[str, ...], ...]
    first: str | None = None
    second: str | None = None
    attach: int = 2
    fanout_first: int = field(init=False, compare=False, repr=False)
    fanout_second: int = field(init=False, compare=False, repr=False)
    _hash: int = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        comp = tuple(tuple(c) for c in self.composition)
        object.__setattr__(self, "composition", comp)
        if not comp or any(not c for c in comp):
            raise ValueError(f"empty composition or component in {comp!r}")
        seq = [s for c in comp for s in c]
        for s in seq:
            if not _SYMBOL.fullmatch(s):
                raise ValueError(f"bad symbol {s!r} in composition {comp!r}")
        if seq.count(TERMINAL) != 1:
            raise ValueError(f"composition {comp!r} must hold exactly one {TERMINAL!r}")
        fanouts = []
        for var, child in (("x", self.first), ("y", self.second)):
            idx = [int(s[1:]) for s in seq if s[0] == var]
            if idx != list(range(len(idx))):
                raise ValueError(f"variables {var}* of {comp!r} must be {var}0, {var}1, ... in order")
            if (child is None) != (not idx):
                role = "first" if var == "x" else "second"
                raise ValueError(f"{role} child {child!r} does not match the variables of {comp!r}")
            fanouts.append(len(idx))
        if fanouts[1] and seq.index("y0") < seq.index(TERMINAL):
            raise ValueError(f"y0 precedes {TERMINAL!r} in {comp!r}: the token must be left of "
                             "its second child")
        for c in comp:
            for a, b in pairwise(c):
                if a[0] == b[0]:
                    raise ValueError(f"neighbouring blocks {a}{b} of one child in {comp!r}")
        if self.attach not in (1, 2):
            raise ValueError(f"attachment must be 1 or 2, got {self.attach!r}")
        if self.lhs == PT and (comp != ((TERMINAL,),) or self.first or self.second
                               or self.attach != 1):
            raise ValueError(f"{PT} rule must be '{PT} 1 t - -'")
        if not self.lhs or self.second == PT or self.first == "" or self.second == "":
            raise ValueError(f"bad labels lhs={self.lhs!r} first={self.first!r} second={self.second!r}")
        object.__setattr__(self, "fanout_first", fanouts[0])
        object.__setattr__(self, "fanout_second", fanouts[1])
        object.__setattr__(self, "_hash", hash((self.lhs, comp, self.first, self.second,
                                                self.attach)))

    def __hash__(self) -> int:
        return self._hash

    @property
    def fanout(self) -> int:
        """Fanout of the left-hand side (number of components)."""
        return len(self.composition)

    @property
    def rank(self) -> int:
        """Number of nonterminal children (0, 1 or 2)."""
        return (self.first is not None) + (self.second is not None)

    @property
    def is_discontinuous(self) -> bool:
        """True if the left-hand side or a child has fanout > 1."""
        return max(self.fanout, self.fanout_first, self.fanout_second) > 1

    def runs(self) -> tuple[tuple[str, bool], ...]:
        """``(source, starts_component)`` per symbol, left to right; source in ``x``/``y``/``t``.

        This is what the parser checks against the block structure of combined spans."""
        return tuple((s[0], i == 0) for c in self.composition for i, s in enumerate(c))

    def __str__(self) -> str:
        lhs = PT if self.lhs == PT else escape_label(self.lhs)
        comp = ",".join("".join(c) for c in self.composition)

        def child(label: str | None) -> str:
            if label is None:
                return _ABSENT
            return PT if label == PT else escape_label(label)

        return f"{lhs} {self.attach} {comp} {child(self.first)} {child(self.second)}"

    @classmethod
    def parse(cls, text: str) -> Supertag:
        """Inverse of ``str``; raises ValueError naming the problem for malformed text."""
        fields = text.split(" ")
        if len(fields) != 5 or not all(fields):
            raise ValueError(f"supertag {text!r} must have 5 space-separated fields "
                             "'<lhs> <attach> <composition> <first> <second>'")
        lhs_t, attach_t, comp_t, first_t, second_t = fields
        if attach_t not in ("1", "2"):
            raise ValueError(f"bad attachment {attach_t!r} (1 or 2) in supertag {text!r}")
        components = comp_t.split(",")
        for c in components:
            if not _COMPONENT.fullmatch(c):
                raise ValueError(f"bad composition {comp_t!r} in supertag {text!r}")
        comp = tuple(tuple(_SYMBOL.findall(c)) for c in components)

        def label(token: str, allow_absent: bool) -> str | None:
            if token == _ABSENT and allow_absent:
                return None
            if token == PT:
                return PT
            if token.startswith("@") or token == _ABSENT:
                raise ValueError(f"bad label {token!r} in supertag {text!r}")
            return unescape_label(token)

        try:
            tag = cls(label(lhs_t, False), comp, label(first_t, True),  # type: ignore[arg-type]
                      label(second_t, True), int(attach_t))
        except ValueError as err:
            raise ValueError(f"invalid supertag {text!r}: {err}") from None
        if str(tag) != text:
            raise ValueError(f"supertag {text!r} is not in canonical form {str(tag)!r}")
        return tag


PT_TAG = Supertag(PT, ((TERMINAL,),), attach=1)
"""The supertag of the sentence's first token: its preterminal keeps the token."""
