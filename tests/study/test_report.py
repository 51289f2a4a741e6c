"""The sweep report (neurocrf.study, neurocrf-report): aggregation over seeds, the paired
approximate randomisation test against an exact permutation test, missing cells, and the entry
point end to end on a tiny real sweep over the generated sample."""

from __future__ import annotations

import itertools
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from neurocrf.cli.report import main as report_main
from neurocrf.data.sample import ensure_sample_corpus
from neurocrf.models.metrics import read_tag_rows, span_scores, write_tag_rows
from neurocrf.study.report import build_report, format_markdown, write_report
from neurocrf.study.runs import find_cells
from neurocrf.study.significance import UnitCounts, approximate_randomization, micro_f1, sentence_counts

ROOT = Path(__file__).resolve().parents[2]
CPU = "cpu (Test CPU)"
GPU = "NVIDIA Test GPU"

# ------------------------------------------------------------------------- hand-made cells


def write_cell(root: Path, corpus: str, kind: str, seed: int, *, memory: str | None = None, f1: float = 0.5,
               precision: float = 0.5, recall: float = 0.5, per_type: dict[str, float] | None = None,
               seconds: tuple[float, ...] = (1.0,), best_epoch: int = 0, device: str = CPU,
               rows: list[tuple[list[str], list[str]]] | None = None, scheme: str = "IOB2") -> Path:
    """A finished run directory as neurocrf-train leaves it (summary.json, test_tags.jsonl)."""
    crf = {"kind": kind, "constrained": True, **({"memory": memory} if kind == "precursor" else {})}
    folder = root / corpus / f"{kind}-memory-{memory or 'none'}-seed-{seed}"
    if rows is not None:
        scores = span_scores([g for g, _ in rows], [p for _, p in rows], scheme).to_dict()
        write_tag_rows([(i, g, p) for i, (g, p) in enumerate(rows)], folder)
    else:
        scores = {"precision": precision, "recall": recall, "f1": f1, "support": 10, "scheme": scheme,
                  "per_type": {t: {"precision": v, "recall": v, "f1": v, "support": 5}
                               for t, v in (per_type or {}).items()},
                  "sentences": 3}
    summary = {
        "metrics": {"test/f1": scores["f1"]}, "test": scores, "checkpoint": None,
        "epochs": [{"epoch": i, "seconds": s, "val/f1": 0.1} for i, s in enumerate(seconds)],
        "best_epoch": best_epoch, "seed": seed, "crf": crf, "corpus": corpus, "data": {}, "overrides": [],
        "device": device, "torch_threads": 1 if device.startswith("cpu") else 16,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    return folder


def test_aggregation_over_seeds_is_exact(tmp_path: Path) -> None:
    for seed, f1, p, r, types, seconds, best, device in [
        (1, 0.60, 0.50, 0.70, {"A": 0.2, "B": 0.9}, (1.0, 2.0, 3.0), 2, CPU),
        (2, 0.70, 0.60, 0.80, {"A": 0.4, "B": 0.8}, (2.0, 4.0), 1, CPU),
        (3, 0.80, 0.70, 0.90, {"A": 0.9}, (0.5,), 0, GPU),
    ]:
        write_cell(tmp_path, "corpus", "second_order", seed, f1=f1, precision=p, recall=r, per_type=types,
                   seconds=seconds, best_epoch=best, device=device)
    report = build_report(tmp_path, baseline="second_order")
    entry = report["corpora"]["corpus"]["variants"]["second_order"]
    assert entry["seeds"] == [1, 2, 3] and entry["missing"] == []
    assert entry["f1"]["mean"] == pytest.approx(0.7) and entry["f1"]["sd"] == pytest.approx(0.1)  # sqrt(0.02 / 2)
    assert entry["precision"]["mean"] == pytest.approx(0.6) and entry["recall"]["mean"] == pytest.approx(0.8)
    assert entry["per_type"]["A"]["mean"] == pytest.approx(0.5)
    assert entry["per_type"]["A"]["sd"] == pytest.approx(math.sqrt((0.09 + 0.01 + 0.16) / 2))
    assert entry["per_type"]["B"] == {"mean": pytest.approx(0.85), "sd": pytest.approx(math.sqrt(0.005)), "n": 2}
    # never a CPU and a GPU epoch in one mean; the CPU mean is over all its epochs (12 s / 5)
    assert entry["seconds_per_epoch"] == {
        "cpu (Test CPU), 1 thread": {"mean": pytest.approx(2.4), "epochs": 5, "runs": 2},
        GPU: {"mean": pytest.approx(0.5), "epochs": 1, "runs": 1},
    }
    assert entry["epochs_to_best"] == {"mean": 2.0, "min": 1, "max": 3, "n": 3}
    assert report["corpora"]["corpus"]["devices"] == sorted(["cpu (Test CPU), 1 thread", GPU])
    markdown = format_markdown(report)
    # the device columns in sorted order: the GPU first
    assert "| `second_order` | 3 (1, 2, 3) | – | 70.00 ± 10.00 | 60.00 | 80.00 | 0.5 | 2.4 | 2.0 (1-3) |" in markdown
    assert "| `second_order` | 50.00 ± 36.06 | 85.00 ± 7.07 |" in markdown  # per type


def test_one_seed_has_no_standard_deviation(tmp_path: Path) -> None:
    write_cell(tmp_path, "c", "softmax", 4, f1=0.25)
    report = build_report(tmp_path, baseline="softmax")
    assert report["corpora"]["c"]["variants"]["softmax"]["f1"] == {"mean": 0.25, "sd": None, "n": 1}
    assert "| `softmax` | 1 (4) | – | 25.00 |" in format_markdown(report)
    with pytest.raises(ValueError, match="no runs of the baseline 'first-order'; the variants are softmax"):
        build_report(tmp_path, baseline="first-order")


def test_unfinished_cells_are_reported_missing(tmp_path: Path) -> None:
    write_cell(tmp_path, "ncbi", "precursor", 1, memory="tag", f1=0.5)
    cut = tmp_path / "ncbi" / "precursor-memory-tag-seed-2" / "checkpoints"
    cut.mkdir(parents=True)
    (cut / "last.ckpt").write_bytes(b"")
    (tmp_path / "ncbi" / "precursor-memory-tag-seed-3").mkdir()
    (tmp_path / "ncbi" / "first_order-memory-none-seed-1").mkdir()
    (tmp_path / "ncbi" / "precursor-memory-type-seed-1").mkdir()
    report = build_report(tmp_path)
    variants = report["corpora"]["ncbi"]["variants"]
    assert list(variants) == ["first_order", "precursor (type)", "precursor (tag)"]
    assert variants["first_order"]["seeds"] == [] and variants["first_order"]["f1"]["mean"] is None
    assert variants["precursor (tag)"]["seeds"] == [1]
    assert variants["precursor (tag)"]["missing"] == [
        {"seed": 2, "path": "ncbi/precursor-memory-tag-seed-2", "state": "running or cut off, has last.ckpt"},
        {"seed": 3, "path": "ncbi/precursor-memory-tag-seed-3", "state": "started, no checkpoint yet"},
    ]
    # nothing to pair with: the baseline has no finished seed
    assert variants["precursor (tag)"]["vs_baseline"]["test"] is None
    markdown = format_markdown(report)
    assert "| `precursor (tag)` | 1 (1) | 2, 3 | 50.00 |" in markdown
    assert "- `precursor (tag)` seed 3: ncbi/precursor-memory-tag-seed-3 (started, no checkpoint yet)" in markdown
    assert "| `first_order` | 0 (–) | 1 |" in markdown


def test_bad_inputs_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no runs found"):
        build_report(tmp_path)
    bad = tmp_path / "c" / "softmax-memory-none-seed-1"
    bad.mkdir(parents=True)
    (bad / "summary.json").write_text("{not json", encoding="utf-8")
    with pytest.raises(ValueError, match=r"softmax-memory-none-seed-1/summary.json: not a run summary"):
        find_cells(tmp_path)
    twice = tmp_path / "twice"
    write_cell(twice / "one", "c", "softmax", 1)
    write_cell(twice / "two", "c", "softmax", 1)
    with pytest.raises(ValueError, match="two runs of corpus c, softmax, seed 1: .*one/c/softmax-memory-none-seed-1"):
        find_cells(twice)


# ------------------------------------------------------------------------- significance


def random_tags(rng: random.Random, length: int, scheme: str) -> list[str]:
    """Tags of random prefixes and types: well-formed or not (strict matching drops the bad ones)."""
    prefixes = ["B", "I", "E", "S"] if scheme == "BIOES" else ["B", "I"]
    return ["O" if rng.random() < 0.4 else f"{rng.choice(prefixes)}-{rng.choice('XY')}" for _ in range(length)]


@pytest.mark.parametrize("scheme", ["IOB1", "IOB2", "BIOES"])
def test_sentence_counts_reproduce_span_scores(scheme: str) -> None:
    rng = random.Random(5)
    gold = [random_tags(rng, rng.randint(1, 9), scheme) for _ in range(60)]
    pred = [random_tags(rng, len(g), scheme) for g in gold]
    counts = sentence_counts(gold, pred, scheme)
    scores = span_scores(gold, pred, scheme)
    assert counts.f1() == pytest.approx(scores.f1, abs=1e-12)
    assert int(counts.gold.sum()) == scores.support
    assert counts.f1() != 0.0 and len(counts) == 60


def exact_permutation_p(a: UnitCounts, b: UnitCounts) -> float:
    """The exact two-sided p-value: every one of the 2^n swap patterns."""
    def stat(x: tuple[int, int], y: tuple[int, int], gold: int) -> float:
        return micro_f1(x[0], x[1], gold) - micro_f1(y[0], y[1], gold)

    gold = int(a.gold.sum())
    observed = stat((int(a.tp.sum()), int(a.pred.sum())), (int(b.tp.sum()), int(b.pred.sum())), gold)
    hits = 0
    patterns = list(itertools.product([False, True], repeat=len(a)))
    for swaps in patterns:
        x = [int(sum(b.tp[i] if s else a.tp[i] for i, s in enumerate(swaps))),
             int(sum(b.pred[i] if s else a.pred[i] for i, s in enumerate(swaps)))]
        y = [int(sum(a.tp[i] if s else b.tp[i] for i, s in enumerate(swaps))),
             int(sum(a.pred[i] if s else b.pred[i] for i, s in enumerate(swaps)))]
        hits += abs(stat(tuple(x), tuple(y), gold)) >= abs(observed) - 1e-12
    return hits / len(patterns)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_approximate_randomization_matches_the_exact_permutation_test(seed: int) -> None:
    rng = np.random.default_rng(seed)
    gold = rng.integers(1, 5, size=11)

    def system(best: int) -> UnitCounts:
        pred = rng.integers(1, 6, size=11)
        return UnitCounts(np.minimum(rng.integers(0, best, size=11), np.minimum(gold, pred)), pred, gold)

    a, b = system(5), system(3)
    exact = exact_permutation_p(a, b)
    result = approximate_randomization(a, b, shuffles=20_000, seed=seed)
    assert result.statistic == pytest.approx(a.f1() - b.f1())
    assert result.p_value == (result.extreme + 1) / 20_001
    assert abs(result.p_value - exact) < 0.015, (result.p_value, exact)  # 4 sd of a 20,000-draw estimate
    assert 0.0 < exact < 1.0
    again = approximate_randomization(a, b, shuffles=20_000, seed=seed, chunk_elements=1_000)
    assert again == result  # a fixed seed: the same draws, whatever the chunking


def test_identical_systems_give_p_one_and_a_clear_difference_a_small_p() -> None:
    rng = random.Random(3)
    gold = [random_tags(rng, 8, "IOB2") for _ in range(40)]
    pred = [random_tags(rng, 8, "IOB2") for _ in gold]
    same = sentence_counts(gold, pred, "IOB2")
    result = approximate_randomization(same, same, shuffles=999)
    assert (result.statistic, result.p_value, result.extreme) == (0.0, 1.0, 999)
    perfect = sentence_counts(gold, gold, "IOB2")
    assert approximate_randomization(perfect, same, shuffles=999).p_value == 1 / 1000
    with pytest.raises(ValueError, match="gold spans"):
        approximate_randomization(perfect, sentence_counts(pred, pred, "IOB2"))


def test_report_pairs_seeds_and_pools_sentences(tmp_path: Path) -> None:
    rng = random.Random(11)
    gold = [random_tags(rng, 7, "BIOES") for _ in range(12)]
    outputs = {}
    for kind in ("first_order", "precursor"):
        for seed in (1, 2, 3):
            if (kind, seed) == ("first_order", 3):
                continue  # seed 3 of the baseline is missing: seed 3 of precursor stays unpaired
            pred = [random_tags(rng, 7, "BIOES") if rng.random() < 0.5 else list(g) for g in gold]
            outputs[kind, seed] = pred
            write_cell(tmp_path, "c", kind, seed, memory="type" if kind == "precursor" else None,
                       rows=list(zip(gold, pred)), scheme="BIOES")
    report = build_report(tmp_path, shuffles=300)
    comparison = report["corpora"]["c"]["variants"]["precursor (type)"]["vs_baseline"]
    assert comparison["paired_seeds"] == [1, 2] and comparison["unpaired_seeds"] == [3]
    f1 = {key: span_scores(gold, pred, "BIOES").f1 for key, pred in outputs.items()}
    assert comparison["differences"] == {
        "1": pytest.approx(f1["precursor", 1] - f1["first_order", 1]),
        "2": pytest.approx(f1["precursor", 2] - f1["first_order", 2]),
    }
    pooled = {kind: span_scores(gold + gold, outputs[kind, 1] + outputs[kind, 2], "BIOES").f1
              for kind in ("first_order", "precursor")}
    test = comparison["test"]
    assert test["units"] == 24 and test["shuffles"] == 300
    assert test["statistic"] == pytest.approx(pooled["precursor"] - pooled["first_order"])
    assert test["pooled_f1"] == pytest.approx(pooled["precursor"])
    assert "approximate randomisation" in format_markdown(report)
    # the tag rows are paired by sentence index, not by file order
    path = tmp_path / "c" / "precursor-memory-type-seed-1" / "test_tags.jsonl"
    write_tag_rows(list(reversed(read_tag_rows(path))), path.parent)
    again = build_report(tmp_path, shuffles=300)["corpora"]["c"]["variants"]["precursor (type)"]
    assert again["vs_baseline"] == comparison
    write_tag_rows(read_tag_rows(path)[1:], path.parent)
    with pytest.raises(ValueError, match="hold different test sentences"):
        build_report(tmp_path, shuffles=10)


# ------------------------------------------------------------------------- end to end


def test_entry_point_on_a_tiny_sweep(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = tmp_path / "data"
    ensure_sample_corpus(data / "sample", seed=13, train_size=120, dev_size=30, test_size=30)
    logs = tmp_path / "logs"
    command = [
        sys.executable, "-m", "neurocrf.cli.train", "hparams_search=crf_study", "experiment=crf_study", "data=sample",
        "crf=first_order,precursor", "seed=1,2", f"paths.data_dir={data}", f"paths.log_dir={logs}",
        "hydra.launcher.n_jobs=1", "encoder.vectors=null", "encoder.add_pretrained_words=false",
        "encoder.word_dim=8", "encoder.char_dim=8", "encoder.char_hidden=8", "encoder.hidden_size=8",
        "trainer.max_epochs=2", "optimizer.lr=0.05", "trainer.num_sanity_val_steps=0", "~logger",
    ]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=420)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    sweep = logs / "crf_study"
    (sweep / "sample" / "precursor-memory-type-seed-3").mkdir()  # a cell that never finished

    report = subprocess.run(
        [sys.executable, "-m", "neurocrf.cli.report", str(sweep), "--output", str(tmp_path / "out"),
         "--shuffles", "200"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert report.returncode == 0, report.stderr
    assert "## sample" in report.stdout and "wrote" in report.stdout
    markdown = (tmp_path / "out" / "report.md").read_text(encoding="utf-8")
    data_json = json.loads((tmp_path / "out" / "report.json").read_text(encoding="utf-8"))
    assert (tmp_path / "out" / "f1_per_seed.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    variants = data_json["corpora"]["sample"]["variants"]
    assert list(variants) == ["first_order", "precursor (type)"]
    for name, kind, memory in [("first_order", "first_order", "none"), ("precursor (type)", "precursor", "type")]:
        summaries = [json.loads((sweep / "sample" / f"{kind}-memory-{memory}-seed-{s}" / "summary.json").read_text())
                     for s in (1, 2)]
        f1s = [s["test"]["f1"] for s in summaries]
        assert variants[name]["seeds"] == [1, 2]
        assert variants[name]["f1"]["mean"] == pytest.approx(sum(f1s) / 2)
        assert variants[name]["f1"]["sd"] == pytest.approx(abs(f1s[0] - f1s[1]) / math.sqrt(2))
        assert variants[name]["epochs_to_best"]["n"] == 2
        assert all(run["device"].startswith("cpu") for run in variants[name]["runs"])
    assert variants["precursor (type)"]["missing"] == [
        {"seed": 3, "path": "sample/precursor-memory-type-seed-3", "state": "started, no checkpoint yet"}]
    test = variants["precursor (type)"]["vs_baseline"]["test"]
    assert test["units"] == 60 and 0 < test["p_value"] <= 1
    assert "| `precursor (type)` | 2 (1, 2) | 3 |" in markdown

    # the same report in-process, to another folder, without the plot; errors exit non-zero
    out2 = tmp_path / "out2"
    assert report_main([str(sweep / "sample"), "--output", str(out2), "--shuffles", "200", "--no-plot"]) == 0
    again = json.loads((out2 / "report.json").read_text())["corpora"]["sample"]["variants"]
    assert {name: v["f1"] for name, v in again.items()} == {name: v["f1"] for name, v in variants.items()}
    assert not (out2 / "f1_per_seed.png").exists()
    capsys.readouterr()
    assert report_main([str(tmp_path / "nowhere")]) == 1
    assert "no sweep directory" in capsys.readouterr().err
    written = write_report(sweep, shuffles=50)
    assert written["plot"].parent == sweep / "report"
