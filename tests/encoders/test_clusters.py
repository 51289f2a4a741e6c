"""Word representations in the feature CRF: cluster paths (Brown files, bisecting 2-means over
vectors) as indicator features, and real-valued word-vector features."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from neurocrf.encoders import build_encoder, build_vocabularies, extract_features
from neurocrf.encoders.clusters import (
    UNKNOWN,
    bisecting_paths,
    cluster_of,
    load_clusters,
    read_paths_file,
    write_paths_file,
)
from neurocrf.encoders.templates import FEATURE_SETS

CLUSTERS = {"paris": "0101", "london": "0100", "is": "11", "Is": "10"}


def test_paths_file_reads_two_and_three_columns_and_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "paths"
    path.write_text("0101\tparis\t12\n0100\tlondon\n\n11\tis\t3\n0\tparis\t1\n", encoding="utf-8")
    assert read_paths_file(path) == {"paris": "0101", "london": "0100", "is": "11"}  # first path wins
    copy = tmp_path / "copy"
    write_paths_file(CLUSTERS, copy)
    assert read_paths_file(copy) == CLUSTERS
    lines = copy.read_text(encoding="utf-8").splitlines()
    assert lines == sorted(lines, key=lambda line: line.split("\t")[0])  # sorted by path, like Brown output


@pytest.mark.parametrize(
    ("text", "problem"),
    [("0101 paris\n", "expected 'bits<TAB>word"), ("01\tx\n012\ty\n", "not a bit string"),
     ("\t\n\n", "no word clusters")],
)
def test_bad_paths_files_name_file_and_line(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad.paths"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=problem) as error:
        read_paths_file(path)
    if "line" in str(error.value):
        assert str(path) in str(error.value) and f"line {text.count(chr(10))}" in str(error.value)
    with pytest.raises(FileNotFoundError, match="word clusters file not found"):
        load_clusters(tmp_path / "missing")


def _four_groups(per_group: int = 30, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Two far-apart pairs of near groups: [4 * per_group, 8] points and each point's group
    (0 and 1 near each other, 2 and 3 near each other, the pairs orthogonal)."""
    rng = np.random.default_rng(seed)
    groups = np.repeat(np.arange(4), per_group)
    centres = np.zeros((4, 8))
    centres[[0, 1], 0] = centres[[2, 3], 1] = 1.0
    centres[np.arange(4), np.arange(2, 6)] = 0.6
    points = centres[groups] + rng.normal(scale=0.05, size=(groups.size, 8))
    return points, groups


def test_bisecting_paths_follow_the_hierarchy() -> None:
    """The first bit separates the two pairs, the second the groups inside each pair."""
    points, groups = _four_groups()
    paths = bisecting_paths(points, depth=6, seed=3)
    assert all(len(path) >= 2 for path in paths) and max(len(path) for path in paths) <= 6
    for bits, group_of in ((1, groups // 2), (2, groups)):
        prefixes = np.array([path[:bits] for path in paths])
        for group in np.unique(group_of):  # each group has one prefix, and no two groups share one
            assert len(set(prefixes[group_of == group])) == 1
        assert len(set(prefixes)) == len(np.unique(group_of))
    assert paths == bisecting_paths(points, depth=6, seed=3)  # deterministic for a seed


def test_bisecting_paths_stop_on_small_or_inseparable_clusters() -> None:
    assert bisecting_paths(np.ones((10, 3)), depth=5) == [""] * 10  # identical vectors: no split
    paths = bisecting_paths(np.array([[1.0, 0.0], [0.9, 0.1], [0.0, 1.0], [0.1, 0.9]]), depth=5, min_size=2)
    assert sorted(paths) == ["0", "0", "1", "1"]  # halves of two: too small to split again
    assert paths[0] == paths[1] != paths[2] == paths[3]
    with pytest.raises(ValueError, match="expected a matrix"):
        bisecting_paths(np.ones(4))


def test_clusters_from_a_vectors_file(tmp_path: Path) -> None:
    points, groups = _four_groups(per_group=5)
    lines = [f"w{i} " + " ".join(f"{v:.4f}" for v in row) for i, row in enumerate(points)]
    (tmp_path / "vectors.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    clusters = load_clusters(f"vectors:{tmp_path / 'vectors.txt'}", words=15, depth=4)
    assert sorted(clusters) == sorted(f"w{i}" for i in range(15))  # the first 15 words only
    prefixes = [{clusters[f"w{i}"][:2] for i in np.flatnonzero(groups[:15] == group)} for group in range(3)]
    assert len(prefixes[0]) == len(prefixes[1]) == 1 and prefixes[0] != prefixes[1]  # the near pair, split
    pair_bit = next(iter(prefixes[0]))[0]
    assert next(iter(prefixes[1]))[0] == pair_bit and {p[0] for p in prefixes[2]} == {"01"[pair_bit == "0"]}


def test_lookup_falls_back_to_lowercase_then_unknown() -> None:
    assert cluster_of(CLUSTERS, "Paris") == "0101"
    assert cluster_of(CLUSTERS, "Is") == "10"  # an exact entry wins over the lowercase one
    assert cluster_of(CLUSTERS, "Berlin") == UNKNOWN


def test_cluster_templates() -> None:
    tokens = ["Paris\tNNP", "is\tVBZ", "Berlin\tNNP"]
    features = extract_features(tokens, ["cluster2[-1,0]", "cluster[0]", "cluster3[0]|col1[0]"], clusters=CLUSTERS)
    assert features[0] == ["bias", "cluster2[-1]=__BOS__", "cluster2[0]=01", "cluster[0]=0101",
                           "cluster3[0]|col1[0]=010|NNP"]
    assert features[1][1:3] == ["cluster2[-1]=01", "cluster2[0]=11"]  # a path shorter than the prefix: whole
    assert features[2][2:] == ["cluster2[0]=?", "cluster[0]=?", "cluster3[0]|col1[0]=?|NNP"]
    with pytest.raises(ValueError, match="reads word clusters, but encoder.clusters is not set"):
        extract_features(tokens, ["cluster4[0]"])
    with pytest.raises(ValueError, match="at least 1 bit"):
        extract_features(tokens, ["cluster0[0]"], clusters=CLUSTERS)
    assert FEATURE_SETS["chunking_clusters"][: len(FEATURE_SETS["chunking"])] == FEATURE_SETS["chunking"]


def test_vocabularies_carry_the_clusters_and_a_rebuild_needs_no_file(tmp_path: Path) -> None:
    path = tmp_path / "paths"
    write_paths_file(CLUSTERS, path)
    config = {"name": "features", "templates": ["token", "cluster2[0]"], "clusters": str(path)}
    train = [["Paris", "is"], ["London", "is", "Rome"]]
    vocabularies = json.loads(json.dumps(build_vocabularies(config, train)))
    assert vocabularies["clusters"] == CLUSTERS
    assert {"cluster2[0]=01", "cluster2[0]=11", "cluster2[0]=?"} <= set(vocabularies["features"])
    encoder = build_encoder(config, vocabularies, num_tags=3)
    with torch.no_grad():
        encoder.weights.weight.normal_()
    path.unlink()  # restoring reads the clusters from the vocabularies
    rebuilt = build_encoder(config, vocabularies, num_tags=3, restore=True)
    rebuilt.load_state_dict(encoder.state_dict())
    batch = [["London", "Oslo", "LONDON"]]
    emissions = rebuilt(rebuilt.prepare(batch))
    torch.testing.assert_close(emissions, encoder(encoder.prepare(batch)), rtol=0, atol=0)
    weights = encoder.weights.weight
    index = {name: i for i, name in enumerate(vocabularies["features"])}
    # unseen words: one without a cluster, one whose lowercase form has one (its cluster's weights)
    torch.testing.assert_close(emissions[0, 1], weights[index["bias"]] + weights[index["cluster2[0]=?"]])
    torch.testing.assert_close(emissions[0, 2], weights[index["bias"]] + weights[index["cluster2[0]=01"]])
    without = {key: value for key, value in vocabularies.items() if key != "clusters"}
    with pytest.raises(ValueError, match="vocabularies\\['clusters'\\] is missing"):
        build_encoder(config, without, num_tags=3)


def test_cluster_and_vector_features_train_checkpoint_and_predict(tmp_path: Path) -> None:
    """End to end: a feature CRF with cluster templates and word-vector features trains with
    L-BFGS, its checkpoint loads weights-only after the clusters and vectors files are gone, and
    predicts what the trained model predicted."""
    import pytorch_lightning as pl

    from neurocrf.data.datamodule import SequenceDataModule
    from neurocrf.data.sample import generate_sample_corpus
    from neurocrf.models.full_batch import LBFGSNotConvergedWarning
    from neurocrf.models.tagger import Tagger

    corpus = generate_sample_corpus(seed=3, sizes={"train": 30, "dev": 10, "test": 10})
    dm = SequenceDataModule.from_sentences(corpus["train"], corpus["dev"], corpus["test"], file_scheme="IOB2",
                                           scheme="IOB2", batch_size=8, eval_batch_size=32)
    words = sorted({token for sentence in dm.train_sentences for token in sentence.tokens})
    rng = np.random.default_rng(0)
    path = tmp_path / "clusters.paths"
    write_paths_file({word: "".join(rng.choice(["0", "1"], size=6)) for word in words}, path)
    vectors = tmp_path / "vectors.txt"
    _write_vectors(vectors, words[::2], rng.normal(size=(len(words[::2]), 4)))
    encoder = {"name": "features", "templates": ["token", "cluster3[-1,0,1]"], "clusters": str(path),
               "vectors": str(vectors), "vector_offsets": [-1, 0]}
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    model = Tagger(encoder, {"kind": "first_order"}, dm.tags, dm.scheme, vocabularies,
                   {"name": "lbfgs", "l2_sigma2": 10.0})
    dm.set_input_builder(model.encoder.preparer)
    trainer = pl.Trainer(max_epochs=30, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         limit_train_batches=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LBFGSNotConvergedWarning)
        trainer.fit(model, datamodule=dm)
    assert model.encoder.vectors.weights.weight.abs().sum() > 0
    checkpoint = tmp_path / "clusters.ckpt"
    trainer.save_checkpoint(checkpoint)
    path.unlink(), vectors.unlink()
    torch.load(checkpoint, weights_only=True)
    loaded = Tagger.load(checkpoint)
    sentences = [s.tokens for s in dm.test_sentences]
    expected = model.eval().predict(sentences)
    got = loaded.predict(sentences)
    assert [p.tags for p in got] == [p.tags for p in expected]
    assert all(len(p.tags) == len(s) for p, s in zip(got, sentences))


def _write_vectors(path: Path, words: list[str], matrix: np.ndarray) -> None:
    lines = [word + " " + " ".join(f"{v:.6f}" for v in row) for word, row in zip(words, matrix)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.mark.parametrize("offsets", [[-1, 0, 1], [2, -3]])
def test_vector_features_add_a_linear_map_of_the_neighbours_vectors(tmp_path: Path, offsets: list[int]) -> None:
    """Emissions = indicator scores + W [v(t + o1); v(t + o2); ...], with v = 0 outside the sentence and
    for words without a vector; vectors scaled to the configured standard deviation; the first
    ``vector_words`` words of the file only."""
    rng = np.random.default_rng(1)
    matrix = rng.normal(scale=3.0, size=(4, 3))
    path = tmp_path / "vectors.txt"
    _write_vectors(path, ["paris", "is", "big", "never"], matrix)
    config = {"name": "features", "templates": ["token"], "vectors": str(path), "vector_words": 3,
              "vector_offsets": offsets, "vector_scale": 0.5}
    vocabularies = json.loads(json.dumps(build_vocabularies(config, [["Paris", "is"]])))
    assert vocabularies["vector_words"] == ["paris", "is", "big"] and vocabularies["vector_dim"] == 3
    encoder = build_encoder(config, vocabularies, num_tags=2)
    table = encoder.vectors.table
    assert float(table[1:].std()) == pytest.approx(0.5, rel=1e-5) and not table[0].any()
    with torch.no_grad():
        encoder.weights.weight.normal_()
        encoder.vectors.weights.weight.normal_()
    batch = [["Paris", "Big", "never", "is"], ["is"]]  # "never" is past vector_words: no vector
    inputs = encoder.prepare(batch)
    assert inputs["vector_ids"].tolist() == [[1, 3, 0, 2], [2, 0, 0, 0]]
    emissions = encoder(inputs)
    scaled = torch.from_numpy(matrix[:3]).float() * (0.5 / float(torch.from_numpy(matrix[:3]).float().std()))
    vector = {"Paris": scaled[0], "Big": scaled[2], "is": scaled[1]}
    index = {name: i for i, name in enumerate(vocabularies["features"])}
    weights, dense = encoder.weights.weight, encoder.vectors.weights.weight
    for b, sentence in enumerate(batch):
        for t, word in enumerate(sentence):
            around = [vector.get(sentence[j], torch.zeros(3)) if 0 <= j < len(sentence) else torch.zeros(3)
                      for j in (t + offset for offset in offsets)]
            expected = weights[index["bias"]] + dense @ torch.cat(around)
            if f"w[0]={word}" in index:
                expected = expected + weights[index[f"w[0]={word}"]]
            torch.testing.assert_close(emissions[b, t], expected, rtol=1e-5, atol=1e-5)
    assert not emissions[1, 1:].any()  # padding
    path.unlink()  # restoring takes the table from the state dict
    rebuilt = build_encoder(config, vocabularies, num_tags=2, restore=True)
    rebuilt.load_state_dict(encoder.state_dict())
    torch.testing.assert_close(rebuilt(rebuilt.prepare(batch)), emissions, rtol=0, atol=0)


def test_vector_feature_errors(tmp_path: Path) -> None:
    path = tmp_path / "vectors.txt"
    _write_vectors(path, ["a", "b"], np.eye(2))
    config = {"name": "features", "templates": ["token"], "vectors": str(path)}
    vocabularies = build_vocabularies(config, [["a"]])
    with pytest.raises(ValueError, match="vocabularies\\['vector_words'\\] is missing"):
        build_encoder(config, {"features": vocabularies["features"]}, num_tags=2)
    with pytest.raises(ValueError, match="vector_scale must be positive"):
        build_encoder({**config, "vector_scale": 0.0}, vocabularies, num_tags=2)
    with pytest.raises(ValueError, match="at least one relative position"):
        build_encoder({**config, "vector_offsets": []}, vocabularies, num_tags=2)
    _write_vectors(path, ["a"], np.eye(2)[:1])  # the file changed since the vocabularies were built
    with pytest.raises(ValueError, match="no vector for 1 of the model's words, e.g. 'b'"):
        build_encoder(config, vocabularies, num_tags=2)
