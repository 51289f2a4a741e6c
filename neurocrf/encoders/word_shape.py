"""What the word lookup of the BiLSTM encoder sees of a word: folded forms and casing classes.

* :func:`word_folder`: lowercase and/or every digit mapped to ``0`` before the vocabulary lookup
  (Lample et al. 2016 map digits to zero), so that ``1996`` and ``2003`` share one row.
* :func:`casing_class`: the casing feature of Chiu & Nichols (2016) and Lample et al.: one class
  per word, embedded next to a lower-cased word vector so that the case the lookup dropped comes
  back as a feature.

>>> fold = word_folder(lowercase=True, zero_digits=True)
>>> fold("Route66"), fold("1,996.5")
('route00', '0,000.0')
>>> [CASING_CLASSES[casing_class(w)] for w in ["the", "EU", "Peter", "1996", "12.5%", "F-16", "iPod", "."]]
['all_lower', 'all_upper', 'initial_upper', 'numeric', 'mostly_numeric', 'contains_digit', 'other', 'other']
"""

from __future__ import annotations

import re
from collections.abc import Callable

import torch
from torch import Tensor

# index 0 is the padding class (positions past the end of a sentence)
CASING_CLASSES = (
    "padding",
    "all_lower",
    "all_upper",
    "initial_upper",
    "numeric",
    "mostly_numeric",
    "contains_digit",
    "other",
)
_CLASS_ID = {name: i for i, name in enumerate(CASING_CLASSES)}
_DIGIT = re.compile(r"\d")


def word_folder(lowercase: bool, zero_digits: bool) -> Callable[[str], str]:
    """The function applied to every word before the vocabulary lookup."""
    if lowercase and zero_digits:
        return lambda word: _DIGIT.sub("0", word.lower())
    if lowercase:
        return str.lower
    if zero_digits:
        return lambda word: _DIGIT.sub("0", word)
    return lambda word: word


def casing_class(word: str) -> int:
    """The casing class id of ``word`` (an index into :data:`CASING_CLASSES`, never 0).

    Digits are counted first: ``numeric`` (digits only), ``mostly_numeric`` (more than half of the
    characters are digits), ``contains_digit``; then the letters: ``all_lower``, ``all_upper``
    (every cased character upper case, e.g. ``U.S.``), ``initial_upper`` (the first character upper
    case, the rest not all upper case); anything else (punctuation, ``iPod``) is ``other``.
    """
    digits = sum(character.isdigit() for character in word)
    if digits and digits == len(word):
        return _CLASS_ID["numeric"]
    if digits * 2 > len(word):
        return _CLASS_ID["mostly_numeric"]
    if digits:
        return _CLASS_ID["contains_digit"]
    if word.islower():
        return _CLASS_ID["all_lower"]
    if word.isupper():
        return _CLASS_ID["all_upper"]
    if word[:1].isupper():
        return _CLASS_ID["initial_upper"]
    return _CLASS_ID["other"]


def casing_ids(tokens: list[list[str]], mask: Tensor) -> Tensor:
    """``[batch, seq_len]`` casing class ids of a batch; padding positions hold 0."""
    ids = torch.zeros(mask.shape, dtype=torch.long)
    flat = [casing_class(word) for sentence in tokens for word in sentence]
    ids[mask] = torch.tensor(flat, dtype=torch.long)
    return ids
