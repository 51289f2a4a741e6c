"""Train flair's SequenceTagger over a transformer folder as neurocrf's transformer-CRF recipe does,
and score its test predictions with neurocrf's own strict span F1 (run in flair's venv).

The model: ``TransformerWordEmbeddings`` over the local model folder (``fine_tune=True``, first
subword pooling, last layer, no document context), dropout 0.1 on the word vectors, a linear layer
and flair's CRF (``use_rnn=False``, ``use_crf=True``, no reprojection, no word or locked dropout).
The recipe: flair's ``ModelTrainer.fine_tune`` (AdamW, linear warmup over the first 10% of steps
then linear decay, gradient norm clipped at 5.0), learning rate 5e-5, batches of 32, ``--epochs``
epochs; the epoch with the best dev F1 is scored on test (flair's ``best-model.pt``).

    /path/to/flair-venv/bin/python -m benchmarks.flair_transformer_tagger --model-dir DIR \\
        --data $NEUROCRF_DATA/ncbi_disease --epochs 3 --seed 1 --out flair_ncbi_seed1.json

Reading the corpus, the F1 (entity-level, exact type and boundaries) and the result file are plain
Python, so that the script needs nothing of neurocrf (flair pins transformers<5).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path


def read_columns(path: Path) -> list[tuple[list[str], list[str]]]:
    """``token<TAB>tag`` sentences separated by blank lines (IOB2)."""
    sentences, words, tags = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            if words:
                sentences.append((words, tags))
            words, tags = [], []
            continue
        token, tag = line.split("\t")[:2]
        words.append(token)
        tags.append(tag)
    if words:
        sentences.append((words, tags))
    return sentences


def iob2_spans(tags: list[str]) -> set[tuple[int, int, str]]:
    spans, start, kind = set(), None, None
    for i, tag in enumerate([*tags, "O"]):
        if start is not None and not (tag.startswith("I-") and tag[2:] == kind):
            spans.add((start, i, kind))
            start = None
        if tag.startswith("B-") or (tag.startswith("I-") and start is None):
            start, kind = i, tag[2:]
    return spans


def f1(gold: list[set], pred: list[set]) -> dict[str, float]:
    hits = sum(len(g & p) for g, p in zip(gold, pred))
    predicted, support = sum(map(len, pred)), sum(map(len, gold))
    precision = hits / predicted if predicted else 0.0
    recall = hits / support if support else 0.0
    score = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": precision, "recall": recall, "f1": score, "support": support}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", required=True, help="Hugging Face model folder")
    parser.add_argument("--data", required=True, type=Path, help="folder with train.tsv, devel.tsv, test.tsv")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--work", type=Path, default=Path("flair_run"), help="flair's base path (models, logs)")
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    args = parser.parse_args()

    import flair
    import torch
    from flair.datasets import ColumnCorpus
    from flair.embeddings import TransformerWordEmbeddings
    from flair.models import SequenceTagger
    from flair.trainers import ModelTrainer

    flair.set_seed(args.seed)
    flair.device = torch.device("cpu")
    corpus = ColumnCorpus(args.data, {0: "text", 1: "ner"}, train_file="train.tsv", dev_file="devel.tsv",
                          test_file="test.tsv", column_delimiter="\t", document_separator_token=None)
    dictionary = corpus.make_label_dictionary("ner", add_unk=False)
    embeddings = TransformerWordEmbeddings(args.model_dir, layers="-1", subtoken_pooling="first", fine_tune=True,
                                           use_context=False, allow_long_sentences=True)
    tagger = SequenceTagger(hidden_size=256, embeddings=embeddings, tag_dictionary=dictionary, tag_type="ner",
                            use_crf=True, use_rnn=False, reproject_embeddings=False, dropout=0.1,
                            word_dropout=0.0, locked_dropout=0.0)
    start = time.perf_counter()
    ModelTrainer(tagger, corpus).fine_tune(
        args.work, learning_rate=args.lr, mini_batch_size=args.batch_size, eval_batch_size=64,
        max_epochs=args.epochs, use_final_model_for_eval=False, max_grad_norm=5.0,
        create_file_logs=True, create_loss_file=True, save_final_model=False,
    )
    train_seconds = time.perf_counter() - start

    best = SequenceTagger.load(args.work / "best-model.pt")
    test = read_columns(args.data / "test.tsv")
    sentences = [flair.data.Sentence(words) for words, _ in test]
    start = time.perf_counter()
    best.predict(sentences, mini_batch_size=64, label_name="predicted")
    predict_seconds = time.perf_counter() - start
    predicted = [{(span.tokens[0].idx - 1, span.tokens[-1].idx, span.get_label("predicted").value)
                  for span in s.get_spans("predicted")} for s in sentences]  # Token.idx counts from 1
    scores = f1([iob2_spans(tags) for _, tags in test], predicted)
    result = {
        "tool": f"flair {flair.__version__}", "torch": torch.__version__, "threads": torch.get_num_threads(),
        "python": platform.python_version(), "seed": args.seed, "epochs": args.epochs, "lr": args.lr,
        "batch_size": args.batch_size, "train_seconds": train_seconds, "predict_seconds": predict_seconds,
        "test_sentences": len(test), "test": scores,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
