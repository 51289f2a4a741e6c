"""Supertag output layers: a plain linear head and a factored one.

A supertag ``'<lhs> <attach> <composition> <first> <second>'``
(:class:`~neurocrf.parsing.grammar.Supertag`) is a combination of a few parts. The factored head
gives each supertag ``s`` the output vector and bias

    w[s] = v[s] + sum_f u_f[part_f(s)]        b[s] = c[s] + sum_f d_f[part_f(s)]

so a rare supertag shares most of its score with the frequent tags that have its left-hand side,
its composition or its children, and is still a class of its own (``v[s]``). The output is one
softmax over the supertag inventory, as with the plain head: the parser, the k-best lists and
ensembles see no difference.

Parts (``factors``): ``lhs`` (left-hand side label, e.g. ``NP|<>``), ``label`` (its base label,
without binarization and fanout marks: ``NP``), ``attach`` (1 / 2), ``composition`` (``x0ty0``),
``first``, ``second`` (child labels, ``-`` when absent) and ``shape`` (attach + composition).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from neurocrf.parsing.grammar import Supertag

_FANOUT_MARK = re.compile(r"_\d+$")


def _fields(tag: str) -> list[str]:
    Supertag.parse(tag)  # a malformed supertag raises, naming the problem
    return tag.split(" ")


def _base_label(lhs: str) -> str:
    base = lhs.split("|", 1)[0]  # 'INF|<>_2' -> 'INF', 'VP_2' -> 'VP'
    return _FANOUT_MARK.sub("", base) or base


FACTORS: dict[str, Callable[[list[str]], str]] = {
    "lhs": lambda f: f[0],
    "label": lambda f: _base_label(f[0]),
    "attach": lambda f: f[1],
    "composition": lambda f: f[2],
    "first": lambda f: f[3],
    "second": lambda f: f[4],
    "shape": lambda f: f"{f[1]} {f[2]}",
}
"""Part extractors, from the five fields of a supertag string."""


def supertag_parts(supertags: Sequence[str],
                   factors: Sequence[str]) -> dict[str, tuple[list[str], list[int]]]:
    """Per factor: its distinct values (sorted) and the value id of each supertag (``[S]``)."""
    unknown = sorted(set(factors) - set(FACTORS))
    if unknown:
        raise ValueError(f"unknown supertag factor(s) {unknown}; expected some of {sorted(FACTORS)}")
    fields = [_fields(tag) for tag in supertags]
    parts: dict[str, tuple[list[str], list[int]]] = {}
    for name in factors:
        values = [FACTORS[name](f) for f in fields]
        vocabulary = sorted(set(values))
        index = {value: i for i, value in enumerate(vocabulary)}
        parts[name] = (vocabulary, [index[value] for value in values])
    return parts


class FactoredSupertagHead(nn.Module):
    """``[B, T, H] -> [B, T, S]`` supertag scores with output vectors summed from parts.

    Args:
        input_dim: ``H``.
        supertags: the supertag strings (score ``s`` is ``supertags[s]``).
        factors: names from :data:`FACTORS`.
    """

    def __init__(self, input_dim: int, supertags: Sequence[str], factors: Sequence[str]) -> None:
        super().__init__()
        if not factors:
            raise ValueError("a factored head needs at least one factor")
        self.factors = list(factors)
        self.own = nn.Linear(input_dim, len(supertags))
        self.parts = nn.ModuleDict()
        for name, (vocabulary, ids) in supertag_parts(supertags, self.factors).items():
            part = nn.Linear(input_dim, len(vocabulary))
            self.parts[name] = part
            self.register_buffer(f"{name}_ids", torch.tensor(ids, dtype=torch.long), persistent=False)

    def output_weights(self) -> tuple[Tensor, Tensor]:
        """The summed output matrix ``[S, H]`` and bias ``[S]``."""
        weight, bias = self.own.weight, self.own.bias
        for name, part in self.parts.items():
            ids = getattr(self, f"{name}_ids")
            weight = weight + part.weight.index_select(0, ids)
            bias = bias + part.bias.index_select(0, ids)
        return weight, bias

    def forward(self, hidden: Tensor) -> Tensor:
        weight, bias = self.output_weights()
        return F.linear(hidden, weight, bias)


def build_supertag_head(input_dim: int, supertags: Sequence[str], factors: Sequence[str] | None) -> nn.Module:
    """A plain ``nn.Linear`` head without factors, else a :class:`FactoredSupertagHead`."""
    if not factors:
        return nn.Linear(input_dim, len(supertags))
    return FactoredSupertagHead(input_dim, supertags, factors)
