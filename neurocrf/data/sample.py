"""The built-in sample corpus: a seeded, generated NER data set (IOB2; PER, ORG, LOC, MISC).

Names are made from small generated lexicons (syllable words, so no real data is shipped).
Sentences string 1-4 entities together with outside (O) words, and the type of each entity
depends on the type of the previous one across those O words (a Markov chain: PER is mostly
followed by ORG, ORG by LOC, LOC by MISC, MISC by PER), which a precursor-induced CRF can exploit.
Some names are ambiguous (the same word is a person's surname and a place, or a company and a
place); most often a cue (``in``, ``Mr.``, ``shares of`` ...) settles their type, otherwise only
the type of the previous entity hints at it. One name in eight never occurs in the training
split, so dev/test contain unseen words.

>>> corpus = generate_sample_corpus(seed=1, sizes={"train": 5, "dev": 2, "test": 2})
>>> [len(corpus[split]) for split in ("train", "dev", "test")]
[5, 2, 2]
"""

from __future__ import annotations

import os
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from neurocrf.conventions import OUTSIDE
from neurocrf.data.conll import Sentence, write_conll

TYPES: tuple[str, ...] = ("PER", "ORG", "LOC", "MISC")

# P(next type | previous type); rows in TYPES order, columns too.
TRANSITIONS: dict[str, tuple[float, ...]] = {
    "PER": (0.15, 0.60, 0.15, 0.10),
    "ORG": (0.15, 0.10, 0.60, 0.15),
    "LOC": (0.25, 0.15, 0.10, 0.50),
    "MISC": (0.60, 0.15, 0.15, 0.10),
}

DEFAULT_SIZES: dict[str, int] = {"train": 3000, "dev": 500, "test": 500}

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr",
           "gr", "kr", "st", "tr", "sh", "ch", "th")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou", "ea")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rt")

_OPENERS = (("The", "report", "says"), ("Yesterday", ","), ("According", "to", "officials", ","),
            ("On", "Monday", ","), ("Sources", "said"), ("In", "a", "statement", ","),
            ("Last", "week", ","), ("It", "emerged", "that"), ("Meanwhile", ","))
_CLOSERS = ((), (), ("last", "year"), ("on", "Tuesday"), ("again",), ("this", "week"),
            ("for", "the", "first", "time"), ("according", "to", "the", "report"))
_GENERIC = (("and",), (",",), ("with",), ("after",), ("while",), ("then",), ("also", "met"),
            ("as", "well", "as"), ("before",), ("and", "later"), (",", "not", "far", "from"))
# Words right after an entity that reveal nothing about the next one.
_AFTER = ((), (), ("said",), ("told", "reporters"), ("announced",), ("confirmed",))
# Cues before an entity that settle its type (always used before an ambiguous name).
_CUES: dict[str, tuple[tuple[str, ...], ...]] = {
    "PER": (("Mr.",), ("Ms.",), ("coach",), ("minister",), ("spokesman",)),
    "ORG": (("works", "for"), ("shares", "of"), ("a", "unit", "of"), ("joined",)),
    "LOC": (("in",), ("based", "in"), ("flew", "to"), ("near",)),
    "MISC": (("won", "the"), ("attended", "the"), ("the", "annual")),
}
_ORG_SUFFIXES = ("Corp", "Group", "Bank", "Holdings", "Union", "Institute")
_EMPTY = ((), (), ("in", "the", "end", "nothing", "changed"), ("prices", "rose", "slightly"),
          ("the", "talks", "ended", "without", "a", "deal"))


@dataclass
class _Lexicon:
    first: list[str]
    last: list[str]
    org: list[str]
    loc: list[str]
    nation: list[str]
    ambiguous_per_loc: list[str]
    ambiguous_org_loc: list[str]
    held_out: set[str]


def _word(rng: random.Random, syllables: int) -> str:
    parts = [rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables)]
    return ("".join(parts) + rng.choice(_CODAS)).capitalize()


def _words(
    rng: random.Random, count: int, taken: set[str], low: int = 2, high: int = 3
) -> list[str]:
    words: list[str] = []
    while len(words) < count:
        word = _word(rng, rng.randint(low, high))
        if word not in taken:
            taken.add(word)
            words.append(word)
    return words


def _build_lexicon(seed: int) -> _Lexicon:
    rng = random.Random(f"neurocrf-sample-lexicon-{seed}")
    taken = {w for phrase in _OPENERS + _CLOSERS + _GENERIC for w in phrase}
    first = _words(rng, 50, taken, 2, 2)
    last = _words(rng, 70, taken)
    org = _words(rng, 50, taken)
    loc = _words(rng, 50, taken)
    nation = [stem + rng.choice(("ian", "ese", "ish")) for stem in _words(rng, 25, taken, 1, 2)]
    ambiguous_per_loc = _words(rng, 8, taken)
    ambiguous_org_loc = _words(rng, 6, taken)
    groups = (first, last, org, loc, nation)
    held_out = {word for group in groups for word in group[: len(group) // 8]}
    return _Lexicon(first, last, org, loc, nation, ambiguous_per_loc, ambiguous_org_loc, held_out)


class _Generator:
    def __init__(self, lexicon: _Lexicon, rng: random.Random, allow_held_out: bool) -> None:
        self.lex = lexicon
        self.rng = rng
        self.allow_held_out = allow_held_out

    def pick(self, words: list[str]) -> str:
        while True:
            word = self.rng.choice(words)
            if self.allow_held_out or word not in self.lex.held_out:
                return word

    def entity(self, type_: str) -> tuple[list[str], bool]:
        """Tokens of one entity of ``type_`` and whether it is an ambiguous name."""
        r, lex = self.rng.random(), self.lex
        if type_ == "PER":
            if r < 0.1:
                return [self.rng.choice(lex.ambiguous_per_loc)], True
            if r < 0.5:
                return [self.pick(lex.first), self.pick(lex.last)], False
            if r < 0.75:
                return [self.pick(lex.last)], False
            if r < 0.85:
                initial = self.pick(lex.first)[0] + "."
                return [self.pick(lex.first), initial, self.pick(lex.last)], False
            return [self.pick(lex.first)], False
        if type_ == "ORG":
            if r < 0.1:
                return [self.rng.choice(lex.ambiguous_org_loc)], True
            if r < 0.55:
                suffix = self.rng.choice(_ORG_SUFFIXES)
                return [self.pick(lex.org), suffix], False
            if r < 0.7:
                return [self.pick(lex.org)], False
            if r < 0.85:
                return [self.pick(lex.org)[:3].upper()], False
            head = self.rng.choice(("University", "Bank", "Council"))
            return [head, "of", self.pick(lex.loc)], False
        if type_ == "LOC":
            if r < 0.15:
                pool = lex.ambiguous_per_loc if self.rng.random() < 0.6 else lex.ambiguous_org_loc
                return [self.rng.choice(pool)], True
            if r < 0.65:
                return [self.pick(lex.loc)], False
            if r < 0.75:
                return [self.pick(lex.loc), "City"], False
            if r < 0.9:
                side = self.rng.choice(("North", "South", "East", "West"))
                return [side, self.pick(lex.loc)], False
            return ["Port", self.pick(lex.loc)], False
        if r < 0.5:
            return [self.pick(lex.nation)], False
        if r < 0.85:
            return [self.pick(lex.org), self.rng.choice(("Cup", "Open", "Games", "Prize"))], False
        return [self.pick(lex.nation), self.rng.choice(("Open", "Festival"))], False

    def next_type(self, previous: str | None) -> str:
        if previous is None:
            return self.rng.choice(TYPES)
        return self.rng.choices(TYPES, weights=TRANSITIONS[previous])[0]

    def sentence(self) -> tuple[list[str], list[str]]:
        rng = self.rng
        tokens: list[str] = []
        tags: list[str] = []

        def outside(words: tuple[str, ...] | list[str]) -> None:
            tokens.extend(words)
            tags.extend([OUTSIDE] * len(words))

        if rng.random() < 0.08:
            outside(rng.choice(_OPENERS))
            outside(rng.choice(_EMPTY) or ("nothing", "happened"))
            outside(["."])
            return tokens, tags
        if rng.random() < 0.5:
            outside(rng.choice(_OPENERS))
        count = rng.choices((1, 2, 3, 4), weights=(0.3, 0.35, 0.25, 0.1))[0]
        previous: str | None = None
        for position in range(count):
            type_ = self.next_type(previous)
            words, ambiguous = self.entity(type_)
            before = len(tokens)
            if position > 0:
                outside(rng.choice(_AFTER))
                if rng.random() < 0.6:
                    outside(rng.choice(_GENERIC))
            if rng.random() < (0.7 if ambiguous else 0.25):
                outside(rng.choice(_CUES[type_]))
            if position > 0 and len(tokens) == before:
                outside(rng.choice(_GENERIC))  # entities are always separated by O words
            tokens.extend(words)
            tags.extend([f"B-{type_}"] + [f"I-{type_}"] * (len(words) - 1))
            previous = type_
        outside(rng.choice(_CLOSERS))
        outside(["."])
        return tokens, tags


def generate_sample_corpus(
    seed: int = 13, sizes: Mapping[str, int] | None = None
) -> dict[str, list[Sentence]]:
    """Generate the sample corpus: ``{split: sentences}`` with IOB2 tags.

    Deterministic for a given ``seed``; each split has its own random stream, so changing one
    split's size does not change the others. Names in the lexicon's held-out set occur only in
    splits other than ``train``.
    """
    lexicon = _build_lexicon(seed)
    corpus: dict[str, list[Sentence]] = {}
    for split, size in (sizes or DEFAULT_SIZES).items():
        rng = random.Random(f"neurocrf-sample-{seed}-{split}")
        generator = _Generator(lexicon, rng, allow_held_out=split != "train")
        sentences = []
        for _ in range(size):
            tokens, tags = generator.sentence()
            sentences.append(Sentence(tokens=tokens, tags=tags))
        corpus[split] = sentences
    return corpus


def ensure_sample_corpus(
    directory: str | os.PathLike[str],
    seed: int = 13,
    *,
    train_size: int = DEFAULT_SIZES["train"],
    dev_size: int = DEFAULT_SIZES["dev"],
    test_size: int = DEFAULT_SIZES["test"],
) -> dict[str, Path]:
    """Write ``train.conll``, ``dev.conll``, ``test.conll`` (``token<TAB>tag``) into ``directory``
    unless they exist; return ``{"train": path, "dev": path, "test": path}``.

    Existing files are left untouched (whatever seed made them). Each file is written to a temp
    file and renamed, so two processes racing here both end with the same complete files.
    """
    folder = Path(directory)
    sizes = {"train": train_size, "dev": dev_size, "test": test_size}
    paths = {split: folder / f"{split}.conll" for split in sizes}
    missing = [split for split, path in paths.items() if not path.exists()]
    if missing:
        corpus = generate_sample_corpus(seed, {split: sizes[split] for split in missing})
        for split in missing:
            write_conll(paths[split], corpus[split])
    return paths
