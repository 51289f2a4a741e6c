"""A transformer tagger whose CRF runs on the Triton backend: its training step (loss and the
gradients of every parameter, encoder included) and ``Tagger.predict`` (Viterbi tags, token and
span confidences, n-best) go through the fused kernels and equal the same tagger on the torch
backend. On CPU the kernels run on Triton's interpreter; on a GPU the same calls run compiled."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")
pytest.importorskip("transformers")

from neurocrf.data.conll import Sentence  # noqa: E402
from neurocrf.data.datamodule import SequenceDataModule  # noqa: E402
from neurocrf.encoders import build_vocabularies  # noqa: E402
from neurocrf.models.tagger import Tagger  # noqa: E402
from neurocrf.structs.engine.triton import runtime  # noqa: E402
from tests.helpers.tiny_models import save_tiny_bert  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:divide by zero encountered in log:RuntimeWarning")
WORDS = ["Peter", "lives", "in", "Berlin", "and", "Mary", "works", "for", "Acme", "Corp", "."]
TAGS = {"Peter": "B-PER", "Mary": "B-PER", "Berlin": "B-LOC", "Acme": "B-ORG", "Corp": "I-ORG"}


def _sentences(count: int, seed: int) -> list[Sentence]:
    rng = random.Random(seed)
    sentences = []
    for _ in range(count):
        words = [rng.choice(WORDS) for _ in range(rng.randint(1, 7))]
        tags = [TAGS.get(word, "O") for word in words]
        tags = ["B-ORG" if tag == "I-ORG" and (i == 0 or tags[i - 1] == "O") else tag for i, tag in enumerate(tags)]
        sentences.append(Sentence(tokens=words, tags=tags))
    return sentences


@pytest.mark.parametrize("kind", ["first_order", "precursor"])
def test_a_transformer_tagger_trains_and_predicts_through_the_triton_kernels(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    encoder = {"name": "transformer", "model_path": str(save_tiny_bert(tmp_path / "bert", tuple(WORDS))),
               "fine_tune": True}
    dm = SequenceDataModule.from_sentences(_sentences(8, seed=1), file_scheme="IOB2", scheme="IOB2", batch_size=8)
    vocabularies = build_vocabularies(encoder, [s.tokens for s in dm.train_sentences])
    taggers = {}
    for backend in ("torch", "triton"):
        torch.manual_seed(0)
        taggers[backend] = Tagger(encoder, {"kind": kind, "backend": backend, "dropout": 0.0}, dm.tags,
                                  dm.scheme, vocabularies)
    with torch.no_grad():  # transitions away from their initial values, the same in both
        for parameter in taggers["torch"].head.parameters():
            parameter.normal_()
    taggers["triton"].load_state_dict(taggers["torch"].state_dict())
    dm.set_input_builder(taggers["torch"].encoder.preparer)
    dm.setup("fit")
    batch = next(iter(dm.train_dataloader()))

    runtime.LAUNCHES.clear()
    losses, gradients = {}, {}
    for backend, tagger in taggers.items():
        tagger.train()
        losses[backend] = tagger.training_objective(batch)
        names, parameters = zip(*[(n, p) for n, p in tagger.named_parameters() if p.requires_grad])
        gradients[backend] = dict(zip(names, torch.autograd.grad(losses[backend], parameters, allow_unused=True)))
    assert runtime.LAUNCHES["forward_kernel"] >= 1 and runtime.LAUNCHES["backward_kernel"] >= 1
    torch.testing.assert_close(losses["triton"], losses["torch"])
    assert any(name.startswith("encoder.") for name in gradients["torch"])
    for name, expected in gradients["torch"].items():
        if expected is None:
            assert gradients["triton"][name] is None, name
        else:
            torch.testing.assert_close(gradients["triton"][name], expected, atol=1e-5, rtol=1e-4, msg=name)

    sentences = [s.tokens for s in _sentences(5, seed=2)] + [[]]
    runtime.LAUNCHES.clear()
    predictions = {backend: tagger.eval().predict(sentences, nbest=2) for backend, tagger in taggers.items()}
    assert runtime.LAUNCHES["search_kernel"] >= 1 and runtime.LAUNCHES["backward_kernel"] >= 1
    for ours, theirs in zip(predictions["triton"], predictions["torch"], strict=True):
        assert ours.tokens == theirs.tokens and ours.tags == theirs.tags
        assert len(ours.confidences) == len(ours.tokens)
        assert ours.confidences == pytest.approx(theirs.confidences, abs=1e-5)
        assert [(s.type, s.start, s.end) for s in ours.spans] == [(s.type, s.start, s.end) for s in theirs.spans]
        assert [s.confidence for s in ours.spans] == pytest.approx([s.confidence for s in theirs.spans], abs=1e-5)
        assert [n.tags for n in ours.nbest] == [n.tags for n in theirs.nbest]
