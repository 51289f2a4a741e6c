"""One public way to predict: ``Tagger.predict`` (a list), ``Tagger.predict_iter`` (a stream) and
Lightning's ``predict_step``, all with one typed options object, :class:`PredictOptions`, whose
bad values are refused with one line naming the option."""

from __future__ import annotations

import dataclasses
import inspect
import typing

import pytest
import pytorch_lightning as pl

from neurocrf.models.predict_options import PredictOptions
from neurocrf.models.tagger import Tagger


def test_the_public_prediction_methods_are_predict_predict_iter_and_predict_step() -> None:
    ours = {name for name in dir(Tagger) if "predict" in name and not name.startswith("_")}
    lightning = {name for name in dir(pl.LightningModule) if "predict" in name}
    assert ours - lightning == {"predict", "predict_iter"}
    assert Tagger.predict_step is not pl.LightningModule.predict_step  # the Lightning hook is ours too


@pytest.mark.parametrize("method", [Tagger.predict, Tagger.predict_iter])
def test_predict_takes_sentences_and_one_typed_options_object(method: typing.Callable) -> None:
    parameters = inspect.signature(method).parameters
    assert list(parameters) == ["self", "sentences", "options"]
    assert parameters["options"].default is None
    hints = typing.get_type_hints(method)
    assert hints["options"] == PredictOptions | None


def test_every_option_has_a_default_and_is_documented() -> None:
    documented = inspect.getdoc(PredictOptions)
    for field in dataclasses.fields(PredictOptions):
        assert field.default is not dataclasses.MISSING
        assert f"    {field.name}: " in documented, f"{field.name} is not documented"
    with pytest.raises(dataclasses.FrozenInstanceError):
        PredictOptions().nbest = 2  # type: ignore[misc]


@pytest.mark.parametrize(("options", "message"), [
    ({"batch_size": 0}, "prediction option batch_size must be an integer of at least 1, got 0"),
    ({"batch_size": 2.5}, "prediction option batch_size must be an integer of at least 1, got 2.5"),
    ({"max_tokens": 0}, "prediction option max_tokens must be an integer of at least 1 (or None), got 0"),
    ({"window": -1}, "prediction option window must be an integer of at least 1, got -1"),
    ({"nbest": -2}, "prediction option nbest must be an integer of at least 0, got -2"),
    ({"nbest": True}, "prediction option nbest must be an integer of at least 0, got True"),
    ({"confidences": "yes"}, "prediction option confidences must be true or false, got 'yes'"),
    ({"precision": "fp8"}, "prediction option precision must be one of ('32', 'bf16'), got 'fp8'"),
])
def test_a_bad_option_is_refused_with_one_line_naming_it(options: dict, message: str) -> None:
    with pytest.raises(ValueError) as error:
        PredictOptions(**options)
    assert str(error.value) == message


def test_options_other_than_a_predict_options_are_refused() -> None:
    """Keywords of the old signature and plain dicts fail at the call, in one line."""
    tagger = object.__new__(Tagger)  # no model needed: the options are checked before any
    with pytest.raises(TypeError, match="unexpected keyword argument 'nbest'"):
        tagger.predict(["a b"], nbest=2)  # type: ignore[call-arg]
    with pytest.raises(TypeError) as error:
        tagger.predict(["a b"], {"nbest": 2})  # type: ignore[arg-type]
    assert str(error.value) == (
        "options must be a PredictOptions (neurocrf.models.predict_options), got {'nbest': 2}")
