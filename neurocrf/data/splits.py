"""Cutting dev and test splits out of a training file (``SequenceDataModule``'s ``split_fractions``
and ``dev_fraction``).

>>> from neurocrf.data.conll import Sentence
>>> sentences = [Sentence([str(i)], ["O"]) for i in range(10)]
>>> {split: len(part) for split, part in split_by_fractions(sentences, [0.8, 0.1, 0.1]).items()}
{'train': 8, 'dev': 1, 'test': 1}
"""

from __future__ import annotations

from collections.abc import Sequence

from neurocrf.data.conll import Sentence


def split_by_fractions(
    sentences: list[Sentence], fractions: Sequence[float]
) -> dict[str, list[Sentence] | None]:
    """The first ``fractions[0]`` of the sentences -> train, the next ``fractions[1]`` -> dev,
    the rest -> test."""
    n = len(sentences)
    first = round(n * fractions[0])
    second = first + round(n * fractions[1])
    return {"train": sentences[:first], "dev": sentences[first:second], "test": sentences[second:]}


def hold_out(sentences: list[Sentence], fraction: float) -> dict[str, list[Sentence] | None]:
    """The last ``fraction`` of the documents (or of the sentences, with one document) -> dev."""
    documents = sorted({s.document for s in sentences if s.document is not None})
    if len(documents) > 1:
        held = set(documents[len(documents) - max(1, round(len(documents) * fraction)) :])
        return {
            "train": [s for s in sentences if s.document not in held],
            "dev": [s for s in sentences if s.document in held],
        }
    cut = len(sentences) - max(1, round(len(sentences) * fraction))
    return {"train": sentences[:cut], "dev": sentences[cut:]}
