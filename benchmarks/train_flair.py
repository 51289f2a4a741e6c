"""The flair side of :mod:`benchmarks.train`: flair's SequenceTagger built like neurocrf's BiLSTM-CRF, its
timed training step (run in flair's own interpreter, a JSON worker), and the data file it starts
from. The model settings both sides share are defined here (see :mod:`benchmarks.train`).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHAR_DIM = 25
CHAR_HIDDEN = 25
LR, MOMENTUM, CLIP, DROPOUT = 0.01, 0.9, 5.0, 0.5


def flair_model_setup(state: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    """In the flair worker: flair's SequenceTagger for each configuration of the data file that
    :func:`flair_data` wrote, its sentences and optimizers kept in ``state``; returns versions and sizes."""
    import flair
    from flair.data import Dictionary, Sentence
    from flair.embeddings import CharacterEmbeddings, StackedEmbeddings, WordEmbeddings
    from flair.models import SequenceTagger

    flair.device = torch.device("cpu")
    data = json.loads(Path(request["data"]).read_text(encoding="utf-8"))
    sentences = []
    for words, spans in zip(data["tokens"], data["spans"]):
        sentence = Sentence(words)
        for label, start, end in spans:
            sentence[start:end].add_label("ner", label)
        sentences.append(sentence)
    state["sentences"] = sentences
    types = Dictionary(add_unk=False)
    for label in data["types"]:
        types.add_item(label)
    types.span_labels = True

    state["models"], state["optimizers"] = {}, {}
    for chars, setup in data["configs"].items():
        torch.manual_seed(data["seed"])
        words = setup["words"]
        word_embeddings = WordEmbeddings(
            None,
            vocab={w: i for i, w in enumerate(words)},
            embedding_length=data["word_dim"],
            fine_tune=not data["freeze"],
            name="words",
        )
        with torch.no_grad():
            initial = torch.from_numpy(np.load(setup["embedding"]))
            word_embeddings.embedding.weight[: len(words)] = initial
        stack = [word_embeddings]
        if chars != "none":
            dictionary = Dictionary(add_unk=True)
            for char in setup["chars"][2:]:  # neurocrf's list starts with <pad>, <unk>
                dictionary.add_item(char)
            stack.append(CharacterEmbeddings(dictionary, char_embedding_dim=CHAR_DIM, hidden_size_char=CHAR_HIDDEN))
        embeddings = StackedEmbeddings(stack) if len(stack) > 1 else stack[0]
        model = SequenceTagger(
            hidden_size=data["hidden"],
            embeddings=embeddings,
            tag_dictionary=types,
            tag_type="ner",
            tag_format="BIOES",
            use_crf=True,
            use_rnn=True,
            rnn_layers=1,
            reproject_embeddings=False,
            dropout=DROPOUT,
            word_dropout=0.0,
            locked_dropout=0.0,
        )
        model.train()
        state["models"][chars] = model
        state["optimizers"][chars] = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    model = next(iter(state["models"].values()))
    return {
        "flair": flair.__version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "threads": torch.get_num_threads(),
        "tags": len(model.label_dictionary),
        "parameters": {c: sum(p.numel() for p in m.parameters()) for c, m in state["models"].items()},
    }


def flair_step(state: dict[str, Any], chars: str, batch: list[int]) -> float:
    """Seconds of one flair training step on the sentences ``batch`` indexes (configuration ``chars``)."""
    sentences = [state["sentences"][i] for i in batch]
    return flair_train_step(state["models"][chars], state["optimizers"][chars], sentences)


def flair_train_step(model: Any, optimizer: Any, sentences: list[Any]) -> float:
    """Seconds of one step of flair's ``ModelTrainer`` batch loop (see the module doc)."""
    from flair.training_utils import store_embeddings

    start = time.perf_counter()
    model.zero_grad()
    optimizer.zero_grad()
    loss, _ = model.forward_loss(sentences)
    loss.item()
    loss.backward()
    store_embeddings(sentences, "none")
    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    optimizer.step()
    return time.perf_counter() - start


def flair_data(args: argparse.Namespace, side: Any, tokens: list[list[str]], tags: list[list[str]],
               workdir: Path) -> dict[str, Any]:
    """The flair worker's setup request: the sentences, their BIOES spans and, per configuration, the
    neurocrf side's (``side``: :class:`benchmarks.train.NeurocrfSide`) vocabularies and initial word embeddings
    (so that both start from the same weights), written to ``workdir``."""
    from neurocrf.data.schemes import get_spans

    configs = {}
    for chars, model in side.models.items():
        embedding = workdir / f"embedding_{chars}.npy"
        np.save(embedding, model.encoder.embedding.weight.detach().numpy())
        configs[chars] = {
            "words": side.vocabularies[chars]["words"],
            "chars": side.vocabularies[chars]["chars"],
            "embedding": str(embedding),
        }
    types = sorted({t.split("-", 1)[1] for row in tags for t in row if t != "O"})
    data = {
        "tokens": tokens,
        "spans": [[[s.type, s.start, s.end] for s in get_spans(row, "BIOES")] for row in tags],
        "types": types,
        "configs": configs,
        "hidden": args.hidden,
        "word_dim": 50,
        "freeze": args.freeze,
        "seed": args.seed,
        "tags": tags,
        "options": {k: getattr(args, k) for k in ("hidden", "vectors", "freeze", "chars", "seed")},
    }
    path = workdir / "data.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return {"data": str(path)}
