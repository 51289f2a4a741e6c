"""Several trained supertaggers read as one: per token, the mean of their probability distributions.

::

    ensemble = SupertaggerEnsemble.load(["seed1/best.ckpt", "seed2/best.ckpt"])
    kbest = ensemble.predict_kbest([["Het", "regent", "."]], k=10)   # same output as one model

Each member scores the batch with its own encoder and vocabularies; its supertag and preterminal
probabilities are placed in the union of the members' label lists (a label a member never saw
gets probability 0 from it) and averaged. The k best of the mean distribution, renormalised over
the k, go to the parser exactly as a single model's would. Members must have prepared their
training trees the same way (punctuation moves, binarization ``h`` / ``v``): their supertags
would mean different rules otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from neurocrf.supertagging.source import KBestTags, predict_kbest
from neurocrf.supertagging.supertagger import Supertagger


class SupertaggerEnsemble:
    """Mean of the distributions of ``members`` (at least one :class:`Supertagger`).

    ``supertags`` / ``preterminals``: the first member's lists followed by the labels only later
    members know; ``roots``: the union of the members' root labels."""

    def __init__(self, members: Sequence[Supertagger]) -> None:
        if not members:
            raise ValueError("an ensemble needs at least one supertagger")
        transforms = [member.transform for member in members]
        for position, transform in enumerate(transforms[1:], start=2):
            if transform != transforms[0]:
                raise ValueError(f"ensemble member {position} prepared its trees with {transform}, member 1 with "
                                 f"{transforms[0]}: their supertags are not comparable")
        self.members = list(members)
        self.supertags = union_labels(member.supertags for member in members)
        self.preterminals = union_labels(member.preterminals for member in members)
        self.roots = sorted(set().union(*(member.roots for member in members)))
        supertag_ids = {tag: i for i, tag in enumerate(self.supertags)}
        preterminal_ids = {tag: i for i, tag in enumerate(self.preterminals)}
        # member label id -> ensemble label id
        self._supertag_maps = [torch.tensor([supertag_ids[t] for t in m.supertags]) for m in members]
        self._preterminal_maps = [torch.tensor([preterminal_ids[t] for t in m.preterminals]) for m in members]

    @classmethod
    def load(cls, paths: Sequence[str | Path], map_location: Any = "cpu") -> SupertaggerEnsemble:
        """An ensemble of the checkpoints at ``paths`` (each loaded with ``weights_only=True``)."""
        return cls([Supertagger.load(path, map_location=map_location) for path in paths])

    @property
    def transform(self) -> dict[str, Any]:
        return self.members[0].transform

    def to(self, device: torch.device | str) -> SupertaggerEnsemble:
        self.members = [member.to(device) for member in self.members]
        return self

    @torch.no_grad()
    def batch_log_probs(self, tokens: Sequence[Sequence[str]]) -> tuple[Tensor, Tensor]:
        """Log of the members' mean supertag ``[B, T, S]`` and preterminal ``[B, T, P]`` probabilities."""
        supertag_sum: Tensor | None = None
        preterminal_sum: Tensor | None = None
        for member, supertag_map, preterminal_map in zip(self.members, self._supertag_maps, self._preterminal_maps):
            log_probs, pt_log_probs = member.batch_log_probs(tokens)
            if supertag_sum is None or preterminal_sum is None:
                supertag_sum = log_probs.new_zeros(*log_probs.shape[:-1], len(self.supertags))
                preterminal_sum = pt_log_probs.new_zeros(*pt_log_probs.shape[:-1], len(self.preterminals))
            supertag_sum.index_add_(-1, supertag_map.to(log_probs.device), log_probs.exp())
            preterminal_sum.index_add_(-1, preterminal_map.to(pt_log_probs.device), pt_log_probs.exp())
        assert supertag_sum is not None and preterminal_sum is not None
        count = len(self.members)
        return (supertag_sum / count).log(), (preterminal_sum / count).log()

    def predict_kbest(self, sentences: Sequence[Sequence[str] | str], k: int = 10,
                      batch_size: int = 64) -> list[KBestTags]:
        """As :meth:`Supertagger.predict_kbest`, from the mean distribution."""
        return predict_kbest(self, sentences, k, batch_size)


def load_supertagger(paths: str | Path | Sequence[str | Path],
                     map_location: Any = "cpu") -> Supertagger | SupertaggerEnsemble:
    """One checkpoint -> a :class:`Supertagger`; a list of several -> a :class:`SupertaggerEnsemble`."""
    if isinstance(paths, (str, Path)):
        return Supertagger.load(paths, map_location=map_location)
    paths = list(paths)
    if len(paths) == 1:
        return Supertagger.load(paths[0], map_location=map_location)
    return SupertaggerEnsemble.load(paths, map_location=map_location)


def union_labels(label_lists: Iterable[Sequence[str]]) -> list[str]:
    """The labels of all lists, in order of first appearance."""
    seen: dict[str, None] = {}
    for labels in label_lists:
        seen.update(dict.fromkeys(labels))
    return list(seen)
