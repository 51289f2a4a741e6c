"""SequenceDataModule: reading, tag lists, splits, batches, bucketing, Lightning integration."""

from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DistributedSampler

from neurocrf.data.conll import ConllFormatError, Sentence, write_conll
from neurocrf.data.datamodule import BucketBatchSampler, SequenceDataModule
from neurocrf.data.sample import ensure_sample_corpus
from neurocrf.data.schemes import convert_tags
from tests.helpers.ddp_shards import distributed_shards


@pytest.fixture(scope="module")
def sample_paths(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    directory = tmp_path_factory.mktemp("sample")
    return ensure_sample_corpus(directory, train_size=400, dev_size=50, test_size=50)


def _module(paths: dict[str, Path], **options) -> SequenceDataModule:
    module = SequenceDataModule(paths["train"], paths["dev"], paths["test"], **options)
    module.setup("fit")
    return module


def _write(path: Path, sentences: list[tuple[list[str], list[str]]], docs: bool = False) -> Path:
    items = [Sentence(tokens, tags, document=i if docs else 0) for i, (tokens, tags) in
             enumerate(sentences)]
    write_conll(path, items)
    return path


def test_tags_o_first_sorted_complete_and_converted(sample_paths: dict[str, Path]) -> None:
    module = _module(sample_paths, batch_size=8)
    types = ["LOC", "MISC", "ORG", "PER"]
    assert module.tags == ["O"] + sorted(f"{p}-{t}" for p in "BIES" for t in types)
    assert module.num_tags == 17 and module.tag_to_id["O"] == 0
    raw = SequenceDataModule(sample_paths["train"], scheme="IOB2")
    raw.setup()
    first_raw, first = raw.train_sentences[0], module.train_sentences[0]
    assert first.tags == convert_tags(first_raw.tags, "IOB2", "BIOES")
    assert len(module.dev_sentences) == 50 and len(module.test_sentences) == 50
    assert module.summary()["train_sentences"] == 400


def test_batches_shapes_padding_and_ids(sample_paths: dict[str, Path]) -> None:
    module = _module(sample_paths, batch_size=8, eval_batch_size=16)
    for batch in module.train_dataloader():
        size, width = batch["tags"].shape
        assert batch["mask"].shape == (size, width) and batch["mask"].dtype == torch.bool
        assert batch["tags"].dtype == torch.long and batch["index"].shape == (size,)
        lengths = batch["mask"].sum(1)
        assert lengths.max() == width
        assert (batch["tags"][~batch["mask"]] == -1).all()
        assert (batch["tags"][batch["mask"]] >= 0).all()
        for row, index in enumerate(batch["index"].tolist()):
            sentence = module.train_sentences[index]
            assert batch["tokens"][row] == sentence.tokens and lengths[row] == len(sentence)
            ids = batch["tags"][row, : len(sentence)].tolist()
            assert [module.tags[i] for i in ids] == sentence.tags
        assert batch["inputs"] == {}


def _epoch(loader) -> list[list[int]]:
    return [batch["index"].tolist() for batch in loader]


def test_bucketing_covers_every_sentence_once_per_epoch(sample_paths: dict[str, Path]) -> None:
    module = _module(sample_paths, batch_size=8, pool_batches=10)
    loader = module.train_dataloader()
    first, second = _epoch(loader), _epoch(loader)
    for epoch in (first, second):
        flat = [i for batch in epoch for i in batch]
        assert sorted(flat) == list(range(400))
        assert len(epoch) == len(loader) == 50
    assert first != second
    # Same seed, same order; sentences of a batch have similar lengths.
    assert _epoch(_module(sample_paths, batch_size=8, pool_batches=10).train_dataloader()) == first
    lengths = [len(s) for s in module.train_sentences]

    def spread(epoch: list[list[int]]) -> float:
        gaps = [max(lengths[i] for i in b) - min(lengths[i] for i in b) for b in epoch]
        return sum(gaps) / len(gaps)

    plain = _module(sample_paths, batch_size=8, bucket=False).train_dataloader()
    assert spread(first) < 0.5 * spread(_epoch(plain))


def test_bucket_sampler_drop_last_and_distributed_shards() -> None:
    lengths = [i % 7 + 1 for i in range(23)]
    sampler = BucketBatchSampler(range(23), 4, True, lengths=lengths, pool_batches=2)
    batches = list(sampler)
    assert all(len(b) == 4 for b in batches) and len(batches) == len(sampler) == 5
    shards = []
    for rank in range(2):
        inner = DistributedSampler(list(range(23)), num_replicas=2, rank=rank, shuffle=True, seed=1)
        shards.append([i for b in BucketBatchSampler(inner, 4, lengths=lengths) for i in b])
    assert set(shards[0]) | set(shards[1]) == set(range(23))
    assert len(shards[0]) == len(shards[1]) == 12


def test_lightning_can_inject_a_distributed_sampler(sample_paths: dict[str, Path]) -> None:
    loader, shards = distributed_shards(_module(sample_paths, batch_size=8).train_dataloader)
    assert isinstance(loader.batch_sampler, BucketBatchSampler)
    assert shards[0] | shards[1] == set(range(400)) and not shards[0] & shards[1]


def test_eval_order_is_the_file_order_and_builder_applies_late(
    sample_paths: dict[str, Path],
) -> None:
    module = _module(sample_paths, eval_batch_size=16)
    loader = module.val_dataloader()
    module.set_input_builder(lambda tokens: {"n": torch.tensor([len(t) for t in tokens])})
    batches = list(loader)
    assert [i for b in batches for i in b["index"].tolist()] == list(range(50))
    assert batches[0]["inputs"]["n"].tolist() == [len(t) for t in batches[0]["tokens"]]
    assert [b["index"].tolist() for b in module.test_dataloader()] == [
        b["index"].tolist() for b in module.predict_dataloader()
    ]


def test_loaders_take_the_encoders_preparer_not_a_bound_method(sample_paths: dict[str, Path]) -> None:
    """``encoder.prepare`` would drag the whole module (its weights) into every DataLoader worker:
    the data module warns, and takes the small picklable ``encoder.preparer`` silently."""
    import pickle
    import warnings

    from neurocrf.encoders import build_encoder, build_vocabularies

    module = _module(sample_paths)
    module.setup("fit")
    config = {"name": "bilstm", "word_dim": 8, "char_dim": 4, "char_hidden": 4, "hidden_size": 8}
    encoder = build_encoder(config, build_vocabularies(config, [s.tokens for s in module.train_sentences]), 3)
    with pytest.warns(UserWarning, match=r"bound method BiLSTMEncoder\.prepare.*model\.encoder\.preparer"):
        module.set_input_builder(encoder.prepare)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        module.set_input_builder(encoder.preparer)
    collate = module.train_dataloader().collate_fn
    assert len(pickle.dumps(collate)) < len(pickle.dumps(encoder)) / 2
    batch = next(iter(module.train_dataloader()))
    assert batch["inputs"]["words"].shape == batch["mask"].shape


def test_unlabeled_sentences_and_unknown_tags_in_dataloader(
    sample_paths: dict[str, Path],
) -> None:
    module = _module(sample_paths)
    batch = next(iter(module.dataloader([Sentence(["a", "b"]), Sentence(["c"])])))
    assert batch["tags"].tolist() == [[-1, -1], [-1, -1]]
    assert batch["mask"].tolist() == [[True, True], [True, False]]
    with pytest.raises(KeyError, match="'B-FOO' is not one of the model's tags"):
        module.dataloader([Sentence(["a"], ["B-FOO"])])


def test_unseen_dev_type_names_file_and_line(tmp_path: Path) -> None:
    train = _write(tmp_path / "train.conll", [(["a", "b"], ["B-PER", "O"])])
    dev = _write(tmp_path / "dev.conll", [(["a"], ["O"]), (["x", "y", "z"], ["O", "O", "B-LOC"])])
    module = SequenceDataModule(train, dev, None, scheme="IOB2")
    with pytest.raises(ConllFormatError, match=r"dev\.conll:5: dev tag 'B-LOC' \(IOB2\)"):
        module.setup()


def test_invalid_file_tags_name_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "train.conll"
    path.write_text("a\tO\nb\tI-PER\n")
    with pytest.raises(ConllFormatError, match=r"train\.conll:2: token 2: I-PER follows O"):
        SequenceDataModule(path, file_scheme="IOB2").setup()
    SequenceDataModule(path, file_scheme="IOB1").setup()  # fine as IOB1


def test_iob1_file_to_bioes_model(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("-DOCSTART- -X- O O\n\nEU NNP I-NP I-ORG\nGerman JJ I-NP I-MISC\n"
                    "UN NNP I-NP B-MISC\n")
    module = SequenceDataModule(path, file_scheme="IOB1", reader={"tag_column": 3})
    module.setup()
    assert module.train_sentences[0].tags == ["S-ORG", "S-MISC", "S-MISC"]
    assert module.train_sentences[0].columns[0] == ["EU", "NNP", "I-NP", "I-ORG"]


def test_dev_fraction_holds_out_last_documents_or_sentences(tmp_path: Path) -> None:
    sentences = [([f"w{i}"], ["O"]) for i in range(20)]
    with_docs = _write(tmp_path / "docs.conll", sentences, docs=True)
    module = SequenceDataModule(with_docs, None, None, dev_fraction=0.1)
    module.setup()
    assert [s.tokens[0] for s in module.dev_sentences] == ["w18", "w19"]
    assert len(module.train_sentences) == 18 and not module.has_split("test")
    grouped = tmp_path / "grouped.conll"  # documents of 1, 2 and 3 sentences
    grouped.write_text("".join(
        "-DOCSTART-\tO\n\n" + "".join(f"d{d}-{i}\tO\n\n" for i in range(d + 1)) for d in range(3)
    ))
    module = SequenceDataModule(grouped, dev_fraction=0.3)
    module.setup()
    assert [s.tokens[0] for s in module.dev_sentences] == ["d2-0", "d2-1", "d2-2"]
    flat = _write(tmp_path / "flat.conll", sentences)
    module = SequenceDataModule(flat, dev_fraction=0.25)
    module.setup()
    assert [s.tokens[0] for s in module.dev_sentences] == [f"w{i}" for i in range(15, 20)]


def test_split_fractions_by_sentence_index(tmp_path: Path) -> None:
    path = _write(tmp_path / "all.conll", [([f"w{i}"], ["B-X"]) for i in range(10)])
    module = SequenceDataModule(path, split_fractions=[0.8, 0.1, 0.1])
    module.setup()
    assert [s.tokens[0] for s in module.train_sentences] == [f"w{i}" for i in range(8)]
    assert [s.tokens[0] for s in module.dev_sentences] == ["w8"]
    assert [s.tokens[0] for s in module.test_sentences] == ["w9"]


@pytest.mark.parametrize(
    "options,message",
    [
        ({"split_fractions": [0.8, 0.1]}, "3 non-negative"),
        ({"split_fractions": [0.8, 0.1, 0.2]}, "sum to 1"),
        ({"split_fractions": [0.8, 0.1, 0.1], "dev_path": "d"}, "leave dev_path"),
        ({"dev_fraction": 1.5}, r"in \(0, 1\)"),
        ({"dev_fraction": 0.1, "dev_path": "d"}, "leave dev_path unset"),
        ({"scheme": "BILOU"}, "unknown tag scheme"),
        ({"batch_size": 0}, "batch_size"),
    ],
)
def test_bad_options(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SequenceDataModule("train.conll", **options)


def test_sample_dir_generates_missing_corpus(tmp_path: Path) -> None:
    module = SequenceDataModule(sample_dir=tmp_path / "gen", batch_size=4)
    with pytest.raises(RuntimeError, match="setup"):
        _ = module.train_sentences
    module.prepare_data()
    assert (tmp_path / "gen" / "train.conll").exists()
    module.setup()
    assert len(module.train_sentences) == 3000 and len(module.test_sentences) == 500
    with pytest.raises(ValueError, match="needs train_path"):
        SequenceDataModule().setup()


def test_from_sentences_and_hydra_style_configs() -> None:
    from omegaconf import OmegaConf

    train = [Sentence(["a", "b"], ["B-X", "I-X"]), Sentence(["c"], ["O"])]
    reader = OmegaConf.create({"tag_column": 1, "docstart": ["-DOCSTART-"]})
    module = SequenceDataModule.from_sentences(train, [Sentence(["d"], ["B-X"])], reader=reader)
    assert module.reader == {"tag_column": 1, "docstart": ["-DOCSTART-"]}
    assert module.train_sentences[0].tags == ["B-X", "E-X"]
    assert module.dev_sentences[0].tags == ["S-X"]
    assert module.tags == ["O", "B-X", "E-X", "I-X", "S-X"]


class _Probe(pl.LightningModule):
    """Checks what Lightning hands to training_step."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: list[int] = []

    def setup(self, stage: str) -> None:
        self.trainer.datamodule.set_input_builder(
            lambda tokens: {"lengths": torch.tensor([len(t) for t in tokens])}
        )

    def training_step(self, batch, batch_index):
        assert batch["inputs"]["lengths"].tolist() == batch["mask"].sum(1).tolist()
        self.seen.extend(batch["index"].tolist())
        return (self.weight * batch["mask"].sum()).sum()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_lightning_fit_consumes_every_sentence(
    sample_paths: dict[str, Path], tmp_path: Path
) -> None:
    module = SequenceDataModule(sample_paths["train"], sample_paths["dev"], batch_size=16)
    probe = _Probe()
    trainer = pl.Trainer(
        max_epochs=1, accelerator="cpu", logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
        limit_val_batches=0,
    )
    trainer.fit(probe, datamodule=module)
    assert sorted(probe.seen) == list(range(400))


def test_token_columns_join_extra_columns_for_the_encoder(tmp_path):
    from neurocrf.data.conll import ConllFormatError
    from neurocrf.data.datamodule import SequenceDataModule

    path = tmp_path / "chunks.txt"
    path.write_text("He PRP B-NP\nreckons VBZ B-VP\n\nIt PRP B-NP\n", encoding="utf-8")
    module = SequenceDataModule(path, path, path, file_scheme="IOB2", scheme="IOB2",
                                reader={"tag_column": 2}, token_columns=[0, 1])
    module.setup("fit")
    assert module.train_sentences[0].tokens == ["He\tPRP", "reckons\tVBZ"]
    assert module.tags == ["O", "B-NP", "B-VP", "I-NP", "I-VP"]
    bad = SequenceDataModule(path, path, path, file_scheme="IOB2", scheme="IOB2",
                             reader={"tag_column": 2}, token_columns=[0, 5])
    with pytest.raises(ConllFormatError, match=r"chunks.txt:1: token columns \[0, 5\] name column"):
        bad.setup("fit")


def test_keep_types_turns_the_other_spans_into_o(tmp_path):
    from neurocrf.data.datamodule import SequenceDataModule

    path = tmp_path / "chunks.txt"
    path.write_text("He B-NP\nreckons B-VP\nthe B-NP\ndeficit I-NP\nwill B-VP\nnarrow I-VP\n\n"
                    "to B-PP\nonly B-NP\n", encoding="utf-8")
    for scheme, expected in (("IOB2", ["B-NP", "O", "B-NP", "I-NP", "O", "O"]),
                             ("BIOES", ["S-NP", "O", "B-NP", "E-NP", "O", "O"])):
        module = SequenceDataModule(path, path, path, file_scheme="IOB2", scheme=scheme, keep_types=["NP"])
        module.setup("fit")
        assert module.tags == (["O", "B-NP", "I-NP"] if scheme == "IOB2" else ["O", "B-NP", "E-NP", "I-NP", "S-NP"])
        assert module.train_sentences[0].tags == expected
        assert module.test_sentences[1].tags == ["O", "B-NP" if scheme == "IOB2" else "S-NP"]
    with pytest.raises(ValueError, match=r"keep_types names \['ADJP'\], which never occur"):
        SequenceDataModule(path, path, path, file_scheme="IOB2", scheme="IOB2", keep_types=["NP", "ADJP"]).setup("fit")
    with pytest.raises(ValueError, match="keep_types is empty"):
        SequenceDataModule(path, keep_types=[])
