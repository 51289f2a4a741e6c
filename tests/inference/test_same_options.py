"""The same options give the same predictions through every way in: the API
(``Tagger.predict`` with a :class:`PredictOptions`), ``neurocrf-predict`` in one process, and its
resumable (sharded) run through Lightning's prediction loop."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from neurocrf.cli.predict import predict
from neurocrf.cli.utils import compose_task_config
from neurocrf.inference.run import FilePrediction
from neurocrf.models.predict_options import PredictOptions
from neurocrf.models.tagger import Tagger
from tests.helpers.sample_data import sample_data_dir, sample_test_text, tiny_tagger_checkpoint

OPTIONS = PredictOptions(batch_size=3, max_tokens=40, window=7, nbest=2)
OVERRIDES = ["batch_size=3", "max_tokens=40", "window=7", "nbest=2", "format=jsonl"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=5, train_size=60, dev_size=10, test_size=20)


@pytest.fixture(scope="module")
def ckpt(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_tagger_checkpoint(tmp_path_factory, data_dir)


@pytest.fixture(scope="module")
def source(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_test_text(tmp_path_factory, data_dir, empty_after=5, empty=2)


def cli_records(tmp_path: Path, ckpt: Path, source: Path, *overrides: str) -> list[dict]:
    output = tmp_path / "out.jsonl"
    predict(compose_task_config("predict", tmp_path, [f"ckpt_path={ckpt}", f"input={source}", f"output={output}",
                                                      *OVERRIDES, *overrides]))
    return [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]


def test_cli_sharded_and_api_agree_for_the_same_options(tmp_path: Path, ckpt: Path, source: Path) -> None:
    sentences = source.read_text(encoding="utf-8").splitlines()
    api = [p.to_dict() for p in Tagger.load(ckpt).predict(sentences, OPTIONS)]
    assert len(api) == len(sentences) == 22 and all(len(record["nbest"]) >= 1 for record in api)
    one = cli_records(tmp_path / "one", ckpt, source)
    sharded = cli_records(tmp_path / "sharded", ckpt, source, "resumable=true")
    assert sharded == one
    assert len(one) == len(api)
    for written, predicted in zip(one, api):
        assert written["tokens"] == predicted["tokens"] and written["tags"] == predicted["tags"]
        assert written["confidences"] == pytest.approx(predicted["confidences"], abs=1e-6)
        assert [p["tags"] for p in written["nbest"]] == [p["tags"] for p in predicted["nbest"]]


def test_the_cli_refuses_a_bad_option_before_loading_the_model(tmp_path: Path, source: Path) -> None:
    with pytest.raises(ValueError, match="^prediction option batch_size must be an integer of at least 1, got 0$"):
        predict(compose_task_config("predict", tmp_path, [f"ckpt_path={tmp_path / 'absent.ckpt'}", f"input={source}",
                                                          "batch_size=0"]))


def test_a_file_job_computes_confidences_only_where_its_output_shows_them(tmp_path: Path, source: Path) -> None:
    def job(output_format: str, confidence: bool) -> FilePrediction:
        return FilePrediction(source, tmp_path / f"out.{output_format}", output_format=output_format,
                              confidence=confidence, options=OPTIONS)

    assert job("conll", False).options == PredictOptions(batch_size=3, max_tokens=40, window=7, nbest=2,
                                                         confidences=False)
    assert job("conll", True).options.confidences and job("jsonl", False).options.confidences
