"""CRF layers over tag sequences, and the chain engine under them.

Layers, constraints, the distribution object and the exportable decoder live here; the engine
(:mod:`neurocrf.structs.engine`: the backend chooser, the reference implementation and the torch,
compiled and triton backends) sits below them. Nothing here imports a backend: the layers reach
the engine through :class:`~neurocrf.structs.engine.chain.Chain`; the distribution object computes
its edge marginals, expectations and samples on the engine's torch-only reference
(:mod:`neurocrf.structs.engine.reference`: differentiable to any order, which no backend's fast
scan is) and its paths through ``Chain``; the exportable decoder has its own Viterbi over the
``scan`` operator (see :mod:`neurocrf.structs.export` for why).
"""

from __future__ import annotations

from neurocrf.structs.base import ChainCRF
from neurocrf.structs.constraints import SCHEMES, Constraints, allowed_transitions
from neurocrf.structs.distribution import ChainDistribution
from neurocrf.structs.linear_chain import LinearChainCRF, pair_emissions
from neurocrf.structs.precursor import PrecursorInducedCRF
from neurocrf.structs.second_order import SecondOrderCRF

CRF_KINDS = ("first_order", "second_order", "precursor")


def build_crf(kind: str, tags: list[str], scheme: str | None, constrained: bool = True, **options) -> ChainCRF:
    """Build a CRF layer over ``tags`` by name.

    Args:
        kind: ``"first_order"``, ``"second_order"`` or ``"precursor"``.
        tags: the tag list; ids are positions in it.
        scheme: the tag scheme (needed for constraints and for the precursor layer).
        constrained: forbid transitions that are invalid in ``scheme``.
        options: passed to the layer (``memory``, ``state_bias``, ``outside`` for the precursor
            layer; ``backend``, ``scan``, ``parallel_threshold`` for all).
    """
    if kind == "precursor":
        if scheme is None:
            raise ValueError("the precursor-induced CRF needs a tag scheme to read entity types")
        return PrecursorInducedCRF(tags, scheme, constrained=constrained, **options)
    constraints = allowed_transitions(tags, scheme) if constrained and scheme is not None else None
    if constrained and scheme is None:
        raise ValueError("constrained=True needs a tag scheme")
    if kind == "first_order":
        return LinearChainCRF(len(tags), constraints, **options)
    if kind == "second_order":
        return SecondOrderCRF(len(tags), constraints, **options)
    raise ValueError(f"unknown CRF kind {kind!r}; expected one of {CRF_KINDS}")


__all__ = [
    "CRF_KINDS",
    "SCHEMES",
    "ChainCRF",
    "ChainDistribution",
    "Constraints",
    "LinearChainCRF",
    "PrecursorInducedCRF",
    "SecondOrderCRF",
    "allowed_transitions",
    "build_crf",
    "pair_emissions",
]
