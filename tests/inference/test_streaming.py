"""The streaming prediction path: lazy reading (text, CoNLL, JSON lines, gzip, standard input),
format choice from a bounded prefix, batches by count and token budget, predictions in input
order with bounded read-ahead, outputs whole or absent (errors, SIGTERM), every token back."""

from __future__ import annotations

import gzip
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from omegaconf import DictConfig

from neurocrf.cli.predict import predict
from neurocrf.cli.utils import compose_task_config
from neurocrf.data.conll import ConllFormatError, read_conll
from neurocrf.data.inputs import PREFIX_TOKEN_LINES, InputReader, detect_input_format
from neurocrf.inference.batching import plan_batches
from neurocrf.inference.output import Terminated
from neurocrf.models.tagger import Tagger
from tests.helpers.sample_data import sample_data_dir, tiny_tagger_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return sample_data_dir(tmp_path_factory, seed=13, train_size=150, dev_size=20, test_size=61)


@pytest.fixture(scope="module")
def ckpt(data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_tagger_checkpoint(tmp_path_factory, data_dir)


@pytest.fixture(scope="module")
def text(data_dir: Path) -> list[str]:
    """The test split as text lines, with empty lines and a long line among them."""
    lines = [" ".join(s.tokens) for s in read_conll(data_dir / "sample" / "test.conll", tag_column=1)]
    return [*lines[:10], "", *lines[10:30], "", "", " ".join(lines[:12]), *lines[30:]]


def config(tmp_path: Path, overrides: list[str]) -> DictConfig:
    return compose_task_config("predict", tmp_path, overrides)


def run(tmp_path: Path, ckpt: Path, source: Path, output: Path, *options: str) -> dict:
    return predict(config(tmp_path, [f"ckpt_path={ckpt}", f"input={source}", f"output={output}", *options]))


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------ batching and the Python API


@pytest.mark.parametrize("batch_size,max_tokens", [(1, None), (4, None), (64, 40), (3, 1)])
def test_batches_hold_every_sentence_once_sorted_and_within_budget(batch_size: int, max_tokens: int | None) -> None:
    lengths = [5, 0, 17, 3, 3, 9, 0, 1, 40, 2, 8, 8]
    batches = plan_batches(lengths, batch_size, max_tokens)
    flat = [i for batch in batches for i in batch]
    assert sorted(flat) == [i for i, n in enumerate(lengths) if n]  # every non-empty sentence once
    assert [lengths[i] for i in flat] == sorted(lengths[i] for i in flat)
    for batch in batches:
        assert len(batch) <= batch_size
        if max_tokens is not None and len(batch) > 1:
            assert len(batch) * max(lengths[i] for i in batch) <= max_tokens


def test_predict_iter_reads_a_window_ahead_and_keeps_the_input_order(ckpt: Path, text: list[str]) -> None:
    tagger = Tagger.load(ckpt)
    expected = tagger.predict(text)
    pulled = []

    def lines():
        for line in text:
            pulled.append(line)
            yield line

    stream = tagger.predict_iter(lines(), batch_size=4, max_tokens=60, window=7)
    first = next(stream)
    assert len(pulled) == 7  # one window read, not the input
    got = [first, *stream]
    assert [p.tokens for p in got] == [line.split() for line in text]
    assert [p.tags for p in got] == [p.tags for p in expected]
    for a, b in zip(got, expected):
        assert a.confidences == pytest.approx(b.confidences, abs=1e-5)
        assert [s[:3] for s in a.spans] == [s[:3] for s in b.spans]
    fast = tagger.predict(text, confidences=False)
    assert [p.tags for p in fast] == [p.tags for p in expected]
    assert all(p.confidences == [] and p.spans == [] for p in fast)


# ------------------------------------------------------------------ formats and streams


def test_the_format_is_chosen_from_a_prefix_not_the_whole_file(tmp_path: Path) -> None:
    """Bad bytes after the prefix do not stop the choice (the whole file is not read); reading
    the sentences reaches them and names their line."""
    lines = ["Peter lives in Berlin", "Mary too"] * PREFIX_TOKEN_LINES
    path = tmp_path / "big"
    path.write_bytes(("\n".join(lines) + "\n").encode() + b"K\xf6ln\n")
    assert detect_input_format(path) == "text"
    with pytest.raises(ConllFormatError, match=rf"big:{len(lines) + 1}: bytes b'\\xf6' are not valid utf-8"):
        list(InputReader(path))
    ambiguous = tmp_path / "ambiguous"
    ambiguous.write_text("a b\n" * (PREFIX_TOKEN_LINES + 5), encoding="utf-8")
    with pytest.raises(ConllFormatError, match=rf"ambiguous:1: cannot tell .* every token line in its first"
                                               rf" {PREFIX_TOKEN_LINES} lines has 2 field"):
        InputReader(ambiguous)


def test_gzip_in_and_out_equal_the_plain_run(tmp_path: Path, ckpt: Path, text: list[str]) -> None:
    plain = tmp_path / "in.txt"
    plain.write_text("\n".join(text) + "\n", encoding="utf-8")
    packed = tmp_path / "in.txt.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    run(tmp_path, ckpt, plain, tmp_path / "out.conll", "window=5")
    summary = run(tmp_path, ckpt, packed, tmp_path / "out.conll.gz", "window=5")
    assert summary["input_format"] == "text" and summary["sentences"] == len(text)
    assert gzip.decompress((tmp_path / "out.conll.gz").read_bytes()) == (tmp_path / "out.conll").read_bytes()
    assert leftovers(tmp_path) == []


def test_a_damaged_gzip_input_names_file_and_line_and_leaves_no_output(tmp_path: Path, ckpt: Path,
                                                                       text: list[str]) -> None:
    data = gzip.compress(("\n".join(text * 20) + "\n").encode())
    truncated = tmp_path / "cut.txt.gz"
    truncated.write_bytes(data[: len(data) // 2])
    output = tmp_path / "out.jsonl"
    output.write_text("the previous predictions\n")
    with pytest.raises(ConllFormatError, match=r"cut\.txt\.gz:\d+: damaged or truncated gzip data"):
        run(tmp_path, ckpt, truncated, output, "format=jsonl", "window=16")
    assert output.read_text() == "the previous predictions\n" and leftovers(tmp_path) == []
    not_gzip = tmp_path / "plain.txt.gz"
    not_gzip.write_text("Peter lives\n", encoding="utf-8")
    with pytest.raises(ConllFormatError, match=r"plain\.txt\.gz:1: damaged or truncated gzip data"):
        run(tmp_path, ckpt, not_gzip, tmp_path / "other.jsonl", "format=jsonl")
    assert not (tmp_path / "other.jsonl").exists()


def test_bad_input_late_in_the_file_leaves_no_output_and_names_the_line(tmp_path: Path, ckpt: Path, text: list[str],
                                                                        capfd: pytest.CaptureFixture) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(("\n".join(text) + "\n").encode() + b"in K\xf6ln\n")
    output = tmp_path / "out.conll"
    with pytest.raises(ConllFormatError, match=rf"in\.txt:{len(text) + 1}: bytes b'\\xf6'"):
        run(tmp_path, ckpt, source, output, "window=8", "input_format=text")
    assert not output.exists() and leftovers(tmp_path) == []
    assert f"prediction stopped after {source}:{len(text)} (the last line read; 64 sentences predicted)" in \
        capfd.readouterr().err


def test_jsonl_input_round_trip_carries_other_fields(tmp_path: Path, ckpt: Path, text: list[str]) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": f"s{i}", "tokens": line.split()}) + "\n"
                              for i, line in enumerate(text)), encoding="utf-8")
    run(tmp_path, ckpt, source, tmp_path / "first.jsonl", "format=jsonl")
    first = [json.loads(line) for line in (tmp_path / "first.jsonl").read_text().splitlines()]
    assert [r["id"] for r in first] == [f"s{i}" for i in range(len(text))]
    assert [len(r["tags"]) for r in first] == [len(line.split()) for line in text]
    run(tmp_path, ckpt, tmp_path / "first.jsonl", tmp_path / "second.jsonl", "format=jsonl")
    assert (tmp_path / "second.jsonl").read_text() == (tmp_path / "first.jsonl").read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"tokens": ["a"]}\n{"tokens": "a b"}\n', encoding="utf-8")
    with pytest.raises(ConllFormatError, match=r'bad\.jsonl:2: a JSON-lines input record needs "tokens"'):
        run(tmp_path, ckpt, bad, tmp_path / "bad_out.jsonl", "format=jsonl")


def test_conll_document_separators_are_kept_where_the_input_had_them(tmp_path: Path, ckpt: Path) -> None:
    source = tmp_path / "docs.conll"
    source.write_text("-DOCSTART- O\n\nEU B-ORG\nrejects O\n\nPeter B-PER\n\n-DOCSTART- O\n\nMary B-PER\n",
                      encoding="utf-8")
    run(tmp_path, ckpt, source, tmp_path / "out.conll", "window=1")
    lines = (tmp_path / "out.conll").read_text().split("\n")
    assert [line.split("\t")[:2] for line in lines if line] == [
        ["-DOCSTART-", "O"], ["EU", "B-ORG"], ["rejects", "O"], ["Peter", "B-PER"], ["-DOCSTART-", "O"],
        ["Mary", "B-PER"]]
    assert [len(line.split("\t")) for line in lines if line and not line.startswith("-DOC")] == [3] * 4


def _command(ckpt: Path, tmp_path: Path, *options: str) -> list[str]:
    return [sys.executable, "-m", "neurocrf.cli.predict", f"ckpt_path={ckpt}", f"paths.log_dir={tmp_path / 'logs'}",
            *options]


ENV = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}


class Stdin(io.BytesIO):
    """Standard input for an in-process run: ``sys.stdin.buffer`` reads these bytes; with
    ``signal_after``, the process sends itself SIGTERM when that many lines have been read."""

    def __init__(self, data: bytes, signal_after: int | None = None) -> None:
        super().__init__(data)
        self.buffer, self.lines, self.signal_after = self, 0, signal_after

    def readline(self, size: int | None = -1) -> bytes:
        if self.lines == self.signal_after:
            os.kill(os.getpid(), signal.SIGTERM)
        self.lines += 1
        return super().readline(size)


def test_stdin_that_ends_without_a_line_break_gives_every_token_back(tmp_path: Path, ckpt: Path, text: list[str],
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture) -> None:
    monkeypatch.setattr(sys, "stdin", Stdin("\n".join(text).encode()))  # the last line cut off before its break
    predict(config(tmp_path, [f"ckpt_path={ckpt}", "input=-", "output=-", "format=jsonl", "input_format=text",
                              "window=7"]))
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["tokens"] for r in records] == [line.split() for line in text]
    assert sum(len(r["tags"]) for r in records) == sum(len(line.split()) for line in text)


def test_sigterm_in_the_run_leaves_no_output_and_names_the_line_reached(tmp_path: Path, ckpt: Path, text: list[str],
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capfd: pytest.CaptureFixture) -> None:
    output = tmp_path / "out.conll"
    output.write_text("the previous predictions\n")
    monkeypatch.setattr(sys, "stdin", Stdin(("\n".join(text) + "\n").encode(), signal_after=9))
    handler = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Terminated, match="terminated by SIGTERM"):
        predict(config(tmp_path, [f"ckpt_path={ckpt}", "input=-", f"output={output}", "input_format=text",
                                  "window=4"]))
    assert signal.getsignal(signal.SIGTERM) == handler  # restored
    assert output.read_text() == "the previous predictions\n" and leftovers(tmp_path) == []
    assert "prediction stopped after -:9 (the last line read; 8 sentences predicted) by Terminated" in \
        capfd.readouterr().err


@pytest.mark.slow
def test_sigterm_leaves_no_output_and_names_the_line_reached(tmp_path: Path, ckpt: Path, text: list[str]) -> None:
    output = tmp_path / "out.conll"
    process = subprocess.Popen(_command(ckpt, tmp_path, "input=-", f"output={output}", "input_format=text",
                                        "window=2"), stdin=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV,
                               text=True)
    process.stdin.write("\n".join(text[:5]) + "\n")  # then the input stays open
    process.stdin.flush()
    deadline = time.time() + 240
    while not leftovers(tmp_path) and time.time() < deadline:  # the temporary output exists: it predicts
        time.sleep(0.2)
    assert leftovers(tmp_path), "the run never started writing"
    time.sleep(1.0)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    process.stdin.close()
    assert process.returncode != 0
    assert "prediction stopped after -:5 (the last line read; 4 sentences predicted) by Terminated: terminated by" \
        " SIGTERM" in err, err[-2000:]
    assert not output.exists() and [p for p in leftovers(tmp_path) if p != "logs"] == []


PEAK_RSS = """
import resource, sys
from neurocrf.cli.predict import predict
from neurocrf.cli.utils import compose_task_config
ckpt, source, output, folder = sys.argv[1:5]
predict(compose_task_config("predict", folder, [f"ckpt_path={ckpt}", f"input={source}", f"output={output}",
                                                "input_format=text", "format=jsonl"]))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


@pytest.mark.slow
def test_memory_stays_flat_from_20k_to_200k_sentences(tmp_path: Path, ckpt: Path, text: list[str]) -> None:
    """Peak RSS of a whole run (fresh process) at 200,000 sentences within 1.2x of the peak at 20,000."""
    peaks = {}
    for size in (20_000, 200_000):
        source = tmp_path / f"in_{size}.txt"
        with open(source, "w", encoding="utf-8") as handle:
            for i in range(size):
                handle.write(text[i % len(text)] + "\n")
        output = tmp_path / f"out_{size}.jsonl"
        done = subprocess.run([sys.executable, "-c", PEAK_RSS, str(ckpt), str(source), str(output), str(tmp_path)],
                              env=ENV, capture_output=True, text=True, timeout=1800, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        with open(output, encoding="utf-8") as handle:
            assert sum(1 for _ in handle) == size
        peaks[size] = int(done.stdout.split()[-1])
        output.unlink()
    assert peaks[200_000] <= 1.2 * peaks[20_000], peaks


def test_the_progress_bar_counts_on_a_terminal_and_is_quiet_elsewhere(capsys: pytest.CaptureFixture) -> None:
    from neurocrf.inference.progress import Progress

    with Progress(total_bytes=1000, enabled=True) as bar:
        bar.update(3, 40, bytes_read=500)
        bar.update(2, 10, bytes_read=1000)
        bar.bar.refresh()
    shown = capsys.readouterr().err
    assert "5 sentences, 50 tokens" in shown and "sentences/s" in shown and "100%" in shown
    with Progress(total_bytes=None, enabled=True) as bar:
        bar.update(7, 70)
        bar.bar.refresh()
    assert "7 sentences" in capsys.readouterr().err
    with Progress(total_bytes=1000) as bar:  # stderr is no terminal here
        bar.update(3, 40, bytes_read=500)
    assert capsys.readouterr().err == "" and (bar.sentences, bar.tokens) == (3, 40)
