"""The Hydra data configs (configs/data/*.yaml): they instantiate, and read the real corpora."""

import os
from collections import Counter
from pathlib import Path

import pytest
from hydra.utils import instantiate
from omegaconf import OmegaConf

from neurocrf.data.datamodule import SequenceDataModule
from neurocrf.data.schemes import get_spans

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "data"
SHARED = Path(os.environ.get("NEUROCRF_DATA", ROOT.parent / "shared" / "data"))
REAL = ["bc5cdr", "conll2000", "conll2003", "jnlpba", "ncbi_disease", "wikigold", "wnut17"]


def _instantiate(name: str, data_dir: Path, shared: Path = SHARED) -> SequenceDataModule:
    config = OmegaConf.create(
        {
            "paths": {"data_dir": str(data_dir), "shared_data": str(shared)},
            "data": OmegaConf.load(CONFIGS / f"{name}.yaml"),
        }
    )
    return instantiate(config.data)


def test_every_corpus_has_a_config() -> None:
    assert sorted(p.stem for p in CONFIGS.glob("*.yaml")) == sorted(REAL + ["sample"])


@pytest.mark.parametrize("name", REAL + ["sample"])
def test_configs_instantiate(name: str, tmp_path: Path) -> None:
    module = _instantiate(name, tmp_path, shared=tmp_path / "shared")
    assert isinstance(module, SequenceDataModule)
    assert module.scheme == "BIOES"
    train = module.paths["train"]
    assert train is not None
    if name == "sample":
        assert train == str(tmp_path / "sample" / "train.conll")
    else:
        assert train.startswith(str(tmp_path / "shared" / name))


def test_sample_config_generates_and_reads_the_corpus(tmp_path: Path) -> None:
    module = _instantiate("sample", tmp_path)
    module.prepare_data()
    module.setup("fit")
    assert (len(module.train_sentences), len(module.dev_sentences)) == (3000, 500)
    assert (tmp_path / "sample" / "test.conll").exists()


# Sentences per split (train, dev, test) from shared/data/README.md; dev held out of train where
# the corpus has none (jnlpba: 200 of 2,000 documents; conll2000: 10% of sentences; wikigold:
# 80/10/10 of one file).
EXPECTED = {
    "conll2003": (14_041, 3_250, 3_453),
    "jnlpba": (None, None, 3_856),
    "ncbi_disease": (5_424, 923, 940),
    "bc5cdr": (4_560, 4_581, 4_797),
    "wnut17": (3_394, 1_009, 1_287),
    "wikigold": (1_357, 170, 169),
    "conll2000": (8_936 - 894, 894, 2_012),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", REAL)
def test_real_corpus_configs_read_their_files(name: str, tmp_path: Path) -> None:
    if not SHARED.is_dir():
        pytest.skip(f"no corpora at {SHARED}")
    module = _instantiate(name, tmp_path)
    module.setup("fit")
    counts = (len(module.train_sentences), len(module.dev_sentences), len(module.test_sentences))
    expected = EXPECTED[name]
    assert all(e is None or c == e for c, e in zip(counts, expected)), counts
    entities = Counter(
        span.type
        for sentences in (module.train_sentences, module.dev_sentences)
        for s in sentences
        for span in get_spans(s.tags, module.scheme)
    )
    if name == "conll2003":
        assert sum(len(s) for s in module.train_sentences) == 203_621
        train = Counter(
            span.type for s in module.train_sentences for span in get_spans(s.tags, "BIOES")
        )
        assert train == {"LOC": 7_140, "PER": 6_600, "ORG": 6_321, "MISC": 3_438}
        assert module.train_sentences[0].document == 0
    if name == "jnlpba":
        assert counts[0] + counts[1] == 18_569
        assert len({s.document for s in module.dev_sentences}) == 200
        assert sum(entities.values()) == 51_301
        assert set(entities) == {"protein", "DNA", "RNA", "cell_line", "cell_type"}
    if name == "wikigold":
        assert sum(counts) == 1_696
    if name == "conll2000":
        assert "NP" in entities and "VP" in entities
