"""Checkpoint reading in one place: weights-only loading, the model kind checked, and an error
naming the file and the problem for every file that is not a usable checkpoint (never torch's
advice to load with ``weights_only=False``)."""

from __future__ import annotations

import io
import re
import zipfile
from pathlib import Path

import pytest
import torch

from neurocrf.encoders import build_vocabularies
from neurocrf.models.checkpoints import (
    SUPERTAGGER,
    TAGGER,
    CheckpointError,
    checkpoint_kind,
    load_module,
    read_checkpoint,
)
from neurocrf.models.tagger import Tagger
from neurocrf.supertagging.supertagger import Supertagger
from tests.helpers.checkpoints import save_checkpoint

ENCODER = {"name": "bilstm", "word_dim": 8, "char": None, "hidden_size": 8}
WORDS = [["Peter", "lives", "in", "Berlin"], ["EU", "rejects", "it"]]


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("ckpt")
    vocabularies = build_vocabularies(ENCODER, WORDS)
    tagger = Tagger(ENCODER, {"kind": "first_order"}, ["O", "B-PER", "I-PER"], "IOB2", vocabularies)
    supertagger = Supertagger(ENCODER, vocabularies, ["a", "b"], ["N", "V"], ["ROOT"])
    return {"tagger": save_checkpoint(tagger, folder / "tagger.ckpt"),
            "supertagger": save_checkpoint(supertagger, folder / "st.ckpt")}


def _bad(folder: Path, name: str, content: bytes) -> Path:
    path = folder / name
    path.write_bytes(content)
    return path


def _torch_bytes(value: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(value, buffer)
    return buffer.getvalue()


def test_both_kinds_load_and_tell_their_kind(files: dict[str, Path]) -> None:
    tagger = Tagger.load(files["tagger"])
    assert isinstance(tagger, Tagger) and not tagger.training and tagger.tags == ["O", "B-PER", "I-PER"]
    assert len(tagger.predict(["Peter lives in Berlin"])[0].tags) == 4
    supertagger = Supertagger.load(files["supertagger"])
    assert isinstance(supertagger, Supertagger) and not supertagger.training
    assert checkpoint_kind(read_checkpoint(files["tagger"])) == TAGGER
    assert checkpoint_kind(read_checkpoint(files["supertagger"], SUPERTAGGER)) == SUPERTAGGER
    reloaded = load_module(Tagger, files["tagger"], TAGGER)
    for name, value in tagger.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], value), name


def test_a_checkpoint_of_the_other_kind_is_named(files: dict[str, Path]) -> None:
    with pytest.raises(CheckpointError, match=r"st\.ckpt: a supertagger checkpoint \(written by neurocrf-supertag\),"
                                              r" but a tagger checkpoint \(written by neurocrf-train\) is needed"):
        Tagger.load(files["supertagger"])
    with pytest.raises(CheckpointError, match=r"tagger\.ckpt: a tagger checkpoint .* but a supertagger checkpoint"):
        Supertagger.load(files["tagger"])


def _truncated(files: dict[str, Path], tmp_path: Path) -> list[tuple[Path, str]]:
    data = files["tagger"].read_bytes()
    return [(_bad(tmp_path, f"cut{n}.ckpt", data[:n]), "truncated or damaged checkpoint")
            for n in (4, 100, len(data) // 2, len(data) - 10)]


def test_every_broken_file_is_named_with_its_problem(files: dict[str, Path], tmp_path: Path) -> None:
    zipped = io.BytesIO()
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.writestr("notes.txt", "hello")
    bare = {key: value for key, value in read_checkpoint(files["tagger"]).items() if key != "hyper_parameters"}
    cases = [
        (_bad(tmp_path, "empty.ckpt", b""), r"empty file \(0 bytes\), not a checkpoint"),
        (_bad(tmp_path, "garbage.ckpt", b"\x00garbage" * 50), r"not a checkpoint \(not a PyTorch zip archive"),
        (_bad(tmp_path, "text.ckpt", b"epoch: 3\n"), "not a PyTorch zip archive; it starts with b'epoc'"),
        (_bad(tmp_path, "other.zip", zipped.getvalue()), "damaged or not a PyTorch checkpoint"),
        (_bad(tmp_path, "module.ckpt", _torch_bytes(torch.nn.Linear(2, 2))),
         r"pickled Python object \(torch\.nn\.modules\.linear\.Linear\) instead of plain values"),
        (_bad(tmp_path, "tensor.ckpt", _torch_bytes(torch.zeros(2))), "it holds a Tensor, not a dict"),
        (_bad(tmp_path, "bare.ckpt", _torch_bytes(bare)), "not a neurocrf checkpoint: no hyper_parameters"),
        (_bad(tmp_path, "state.ckpt", _torch_bytes({"w": torch.zeros(1)})),
         r"no state_dict and no hyper_parameters \(a bare state dict\?\)"),
        (_bad(tmp_path, "foreign.ckpt", _torch_bytes({"state_dict": {}, "hyper_parameters": {"lr": 0.1}})),
         r"its hyper_parameters \(lr\) describe neither a tagger nor a supertagger"),
        *_truncated(files, tmp_path),
    ]
    for path, problem in cases:
        for load in (Tagger.load, Supertagger.load, read_checkpoint):
            with pytest.raises(CheckpointError) as caught:
                load(path)
            message = str(caught.value)
            assert message.startswith(f"{path}: ") and re.search(problem, message), (path.name, message)
            assert "weights_only" not in message, message
    with pytest.raises(FileNotFoundError, match="checkpoint file not found: .*missing.ckpt"):
        Tagger.load(tmp_path / "missing.ckpt")
    with pytest.raises(CheckpointError, match="a folder, not a checkpoint file"):
        read_checkpoint(tmp_path)


def test_weights_and_hyperparameters_that_do_not_build_the_model_are_named(files: dict[str, Path],
                                                                           tmp_path: Path) -> None:
    checkpoint = read_checkpoint(files["tagger"])
    checkpoint["state_dict"]["projection.weight"] = torch.zeros(5, 5)
    with pytest.raises(CheckpointError,
                       match=r"shape\.ckpt: its weights do not fit the model it describes: .*projection"):
        Tagger.load(_bad(tmp_path, "shape.ckpt", _torch_bytes(checkpoint)))
    checkpoint = read_checkpoint(files["tagger"])
    checkpoint["hyper_parameters"]["tags"] = ["O", "O"]
    with pytest.raises(CheckpointError, match=r"tags\.ckpt: its hyperparameters do not build a Tagger: tags must be"):
        Tagger.load(_bad(tmp_path, "tags.ckpt", _torch_bytes(checkpoint)))
