"""Knowledge distillation of the supertagger: a teacher's saved distributions become training
targets (ids mapped by name, renormalised), the loss mixes them with the gold cross-entropy, and
the options are checked."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from neurocrf.encoders import build_vocabularies
from neurocrf.parsing.treebank import write_sample_treebank
from neurocrf.supertagging.data import SupertagDataModule, teacher_distributions
from neurocrf.supertagging.saved_tags import tag_distributions, tag_file_header, write_tag_file
from neurocrf.supertagging.supertagger import Supertagger
from tests.helpers.tiny_models import TINY_ENCODER


@pytest.fixture(scope="module")
def treebank(tmp_path_factory: pytest.TempPathFactory) -> dict:
    path = write_sample_treebank(tmp_path_factory.mktemp("tb") / "tiny.discbracket", sentences=40, seed=3)
    return {"path": str(path), "format": "discbracket"}


def make_model(dm: SupertagDataModule, seed: int, **heads) -> Supertagger:
    torch.manual_seed(seed)
    vocabularies = build_vocabularies(TINY_ENCODER, [s.words for s in dm.corpora["train"]])
    model = Supertagger(TINY_ENCODER, vocabularies, dm.supertags, dm.preterminals, dm.roots, heads=heads)
    dm.set_input_builder(model.encoder.preparer)
    return model


def save_train_tags(dm: SupertagDataModule, model: Supertagger, path: Path, n: int) -> Path:
    corpus = dm.corpora["train"]
    distributions = tag_distributions(model.eval(), [s.id for s in corpus], [s.words for s in corpus], n=n)
    return write_tag_file(path, tag_file_header(model, distributions), distributions)


def test_teacher_distributions_are_the_teachers_renormalised_kbest(tmp_path: Path, treebank: dict) -> None:
    dm = SupertagDataModule(treebank)
    dm.setup()
    teacher = make_model(dm, 0)
    path = save_train_tags(dm, teacher, tmp_path / "t.jsonl", n=4)
    corpus = dm.corpora["train"]
    targets = teacher_distributions([str(path)], corpus, dm.supertags)
    kbest = teacher.predict_kbest([s.words for s in corpus[:3]], k=4)
    for (ids, probs), tags in zip(targets, kbest):
        assert ids.shape == probs.shape == (len(tags.tokens), 4)
        for token, candidates in enumerate(tags.candidates):
            assert [dm.supertags[i] for i in ids[token].tolist()] == [t for t, _ in candidates]
            assert probs[token].tolist() == pytest.approx([math.exp(-w) for _, w in candidates], abs=1e-6)
            assert float(probs[token].sum()) == pytest.approx(1.0, abs=1e-6)
    # a student without the teacher's best tag of token 0: the tag is dropped, the rest renormalised
    best = kbest[0].candidates[0][0][0]
    student_tags = [t for t in dm.supertags if t != best]
    ids, probs = teacher_distributions([str(path)], corpus, student_tags)[0]
    kept = [(t, math.exp(-w)) for t, w in kbest[0].candidates[0] if t != best]
    assert [student_tags[i] for i in ids[0, :3].tolist()] == [t for t, _ in kept] and int(ids[0, 3]) == -1
    assert probs[0].tolist() == pytest.approx([p / sum(q for _, q in kept) for _, p in kept] + [0.0], abs=1e-6)
    # the teacher must have tagged every training sentence
    short = tmp_path / "short.jsonl"
    distributions = tag_distributions(teacher, ["0"], [corpus[0].words], n=4)
    write_tag_file(short, tag_file_header(teacher, distributions), distributions)
    with pytest.raises(ValueError, match=r"teacher tags \(data.teacher\): .*short.jsonl holds no tags"):
        teacher_distributions([str(short)], corpus, dm.supertags)


def test_training_batches_carry_the_teacher_and_the_loss_mixes_it(tmp_path: Path, treebank: dict) -> None:
    plain = SupertagDataModule(treebank, batch_size=8)
    plain.setup()
    path = save_train_tags(plain, make_model(plain, 0), tmp_path / "t.jsonl.gz", n=5)
    dm = SupertagDataModule(treebank, batch_size=8, teacher=str(path))
    dm.setup()
    student = make_model(dm, 1, distill=0.25)
    batch = next(iter(dm.train_dataloader()))
    assert batch["teacher_ids"].shape == (*batch["mask"].shape, 5)
    assert "teacher_ids" not in next(iter(dm.val_dataloader()))  # validation keeps the gold loss only
    padding = ~batch["mask"]
    assert bool((batch["teacher_ids"][padding] == -1).all()) and float(batch["teacher_probs"][padding].sum()) == 0
    student.train()
    torch.manual_seed(5)
    supertag_scores, pt_scores, _ = student._scores(batch)
    loss = student.loss(supertag_scores, pt_scores, batch).detach()
    supertag_scores, pt_scores = supertag_scores.detach(), pt_scores.detach()
    mask = batch["mask"]
    log_probs = supertag_scores.log_softmax(-1)[mask]  # [N, S]
    gold = F.nll_loss(log_probs, batch["supertags"][mask])
    ids, probs = batch["teacher_ids"][mask], batch["teacher_probs"][mask]
    soft = -(probs * log_probs.gather(-1, ids.clamp(min=0))).sum(-1).mean()
    pos = F.cross_entropy(pt_scores[mask], batch["preterminals"][mask])
    assert float(loss) == pytest.approx(float(0.75 * gold + 0.25 * soft + pos), rel=1e-5)
    # a teacher that puts all its mass on the gold supertag is the gold loss
    one_hot = dict(batch, teacher_ids=batch["supertags"].clamp(min=0).unsqueeze(-1),
                   teacher_probs=mask.float().unsqueeze(-1))
    assert float(student.loss(supertag_scores, pt_scores, one_hot)) == pytest.approx(float(gold + pos), rel=1e-5)
    # steps on the mixed loss move the student towards the teacher's distribution
    def teacher_cross_entropy() -> float:
        student.eval()
        with torch.no_grad():
            lp = student._scores(batch)[0].log_softmax(-1)[mask]
        student.train()
        return float(-(probs * lp.gather(-1, ids.clamp(min=0))).sum(-1).mean())

    optimizer = torch.optim.Adam(student.parameters(), lr=0.01)
    before = teacher_cross_entropy()
    for _ in range(5):
        scores, pts, _ = student._scores(batch)
        optimizer.zero_grad()
        student.loss(scores, pts, batch).backward()
        optimizer.step()
    assert teacher_cross_entropy() < before


def test_distill_options_are_checked(treebank: dict) -> None:
    dm = SupertagDataModule(treebank, batch_size=8)
    dm.setup()
    with pytest.raises(ValueError, match=r"heads.distill must be in \[0, 1\]"):
        make_model(dm, 0, distill=1.5)
    student = make_model(dm, 0, distill=0.5)
    batch = next(iter(dm.train_dataloader()))
    student.train()
    scores, pts, _ = student._scores(batch)
    with pytest.raises(ValueError, match="set data.teacher="):
        student.loss(scores, pts, batch)
    student.eval()  # evaluation needs no teacher
    assert torch.isfinite(student.loss(*student._scores(batch)[:2], batch))
