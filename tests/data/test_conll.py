"""Column file reader/writer: layouts of the real corpora, round trips, and every bad input."""

import io
from pathlib import Path

import pytest

from neurocrf.data.conll import ConllFormatError, Sentence, read_conll, write_conll


def _write(tmp_path: Path, text: str | bytes, name: str = "corpus.txt") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_bytes(text.encode("utf-8"))
    return path


def _data(sentences: list[Sentence]) -> list[tuple]:
    return [(s.tokens, s.tags, s.columns, s.document) for s in sentences]


def test_reads_tab_file_with_locations(tmp_path: Path) -> None:
    path = _write(tmp_path, "EU\tB-ORG\nrejects\tO\n\nPeter\tB-PER\nBlackburn\tI-PER\n")
    first, second = read_conll(path)
    assert first.tokens == ["EU", "rejects"] and first.tags == ["B-ORG", "O"]
    assert first.columns == [["EU", "B-ORG"], ["rejects", "O"]]
    assert (first.source, first.line, first.token_lines) == (str(path), 1, [1, 2])
    assert (second.line, second.token_lines, second.document) == (4, [4, 5], 0)
    assert second.location(1) == f"{path}:5"


CONLL2003 = (
    "EU NNP I-NP I-ORG\nrejects VBZ I-VP O\nGerman JJ I-NP I-MISC\n\n"
    "Peter NNP I-NP I-PER\nBlackburn NNP I-NP I-PER\n\n"
    "-DOCSTART- -X- O O\n\n"
    "BRUSSELS NNP I-NP I-LOC\n1996-08-22 CD I-NP O\n\n"
    "-DOCSTART- -X- O O"  # the train file's quirk: a separator as last line, no final newline
)


def test_conll2003_layout_docstart_at_end_without_newline(tmp_path: Path) -> None:
    sentences = read_conll(_write(tmp_path, CONLL2003), tag_column=3, scheme="IOB1", min_columns=4)
    assert [s.tokens for s in sentences] == [
        ["EU", "rejects", "German"], ["Peter", "Blackburn"], ["BRUSSELS", "1996-08-22"]
    ]
    assert sentences[0].tags == ["I-ORG", "O", "I-MISC"]
    assert [s.document for s in sentences] == [0, 0, 1]
    assert sentences[2].columns[0] == ["BRUSSELS", "NNP", "I-NP", "I-LOC"]
    assert sentences[2].line == 10


def test_leading_docstart_and_jnlpba_medline_lines(tmp_path: Path) -> None:
    text = (
        "###MEDLINE:90110496\n\nAnti-Ro\tB-protein\nare\tO\n\nIL-2\tB-protein\n\n"
        "###MEDLINE:90110497\n\nT\tB-cell_type\ncells\tI-cell_type\n\n"
    )
    sentences = read_conll(_write(tmp_path, text), delimiter="\t", scheme="IOB2")
    assert [s.tokens for s in sentences] == [["Anti-Ro", "are"], ["IL-2"], ["T", "cells"]]
    assert [s.document for s in sentences] == [0, 0, 1]


def test_document_prefixes_are_configurable(tmp_path: Path) -> None:
    path = _write(tmp_path, "@@doc 1\na O\n\n@@doc 2\nb O\n")
    sentences = read_conll(path, docstart=["@@doc"])
    assert [(s.tokens, s.document) for s in sentences] == [(["a"], 0), (["b"], 1)]
    medline = _write(tmp_path, "###MEDLINE:1\n\na\tO\n", "medline.txt")
    with pytest.raises(ConllFormatError, match=r"medline\.txt:1: found 1 column"):
        read_conll(medline, docstart=None, min_columns=2)
    with pytest.raises(ConllFormatError, match=r"medline\.txt:3: found 2 column\(s\), expected 1"):
        read_conll(medline, docstart="-DOCSTART-", tag_column=None)


def test_comments_blank_runs_crlf_bom_and_no_final_newline(tmp_path: Path) -> None:
    text = "\ufeff# sent 1\r\nA\tO\r\n# inside\r\nB\tB-X\r\n\r\n\r\n \t \r\n\r\n# sent 2\r\nC\tO"
    sentences = read_conll(_write(tmp_path, text), comment_prefix="#")
    assert [(s.tokens, s.tags) for s in sentences] == [(["A", "B"], ["O", "B-X"]), (["C"], ["O"])]
    assert sentences[0].token_lines == [2, 4]
    assert sentences[0].location(1).endswith(":4")
    assert sentences[1].line == 10


def test_whitespace_splitting_keeps_non_ascii_spaces(tmp_path: Path) -> None:
    path = _write(tmp_path, "New\u00a0York  \t B-LOC\n")
    assert read_conll(path)[0].tokens == ["New\u00a0York"]
    path = _write(tmp_path, "a b\tO\n", "tabs.txt")
    assert read_conll(path, delimiter="\t")[0].tokens == ["a b"]


def test_column_selection(tmp_path: Path) -> None:
    path = _write(tmp_path, "w1 NN B-NP\nw2 VB B-VP\n")
    (sentence,) = read_conll(path, token_column=0, tag_column=-2)
    assert sentence.tags == ["NN", "VB"]
    (untagged,) = read_conll(path, tag_column=None)
    assert untagged.tags is None and untagged.tokens == ["w1", "w2"]


def test_other_encodings(tmp_path: Path) -> None:
    path = _write(tmp_path, "Köln B-LOC\nist O\n".encode("latin-1"))
    assert read_conll(path, encoding="latin-1")[0].tokens == ["Köln", "ist"]


@pytest.mark.parametrize(
    "text,options,message",
    [
        ("a O\nb O\n\nc X O\n", {}, r":4: found 3 column\(s\), expected 2 as on line 1"),
        ("a O\nb\n", {}, r":2: found 1 column\(s\), expected 2 as on line 1"),
        ("a O\n", {"min_columns": 4}, r":1: found 2 column\(s\), need at least 4"),
        ("a O\n", {"tag_column": 3}, r":1: found 2 column\(s\), need at least 4"),
        ("\n\na\tO\tx\n", {"delimiter": "\t", "tag_column": -4}, r":3: .*need at least 4"),
        ("a O\nb I-PER\n", {"scheme": "IOB2"}, r":2: token 2: I-PER follows O"),
        ("a O\n\nb B-PER\nc E-PER\n", {"scheme": "IOB2"}, r":4: token 2: tag 'E-PER' is not valid"),
        ("a I-LOC\nb B-PER\n", {"scheme": "IOB1"}, r":2: token 2: in IOB1|B-PER follows I-LOC"),
        ("x PER\n", {"scheme": "BIOES"}, r":1: token 1: tag 'PER'"),
        ("", {}, r":1: no sentences found"),
        ("\n\n  \n", {}, r":1: no sentences found"),
        ("-DOCSTART- -X- O O\n\n", {}, r":1: no sentences found"),
        ("# only a comment\n", {"comment_prefix": "#"}, r":1: no sentences found"),
    ],
)
def test_bad_input_names_file_and_line(
    tmp_path: Path, text: str, options: dict, message: str
) -> None:
    path = _write(tmp_path, text, "bad.conll")
    with pytest.raises(ConllFormatError, match=r"bad\.conll" + message):
        read_conll(path, **options)


def test_invalid_utf8_reports_line(tmp_path: Path) -> None:
    path = _write(tmp_path, b"a O\nb O\n\nc\xff\xfe O\n", "bytes.conll")
    with pytest.raises(ConllFormatError, match=r"bytes\.conll:4: bytes .* are not valid utf-8"):
        read_conll(path)
    assert issubclass(ConllFormatError, ValueError)


def test_unknown_scheme_or_missing_file(tmp_path: Path) -> None:
    path = _write(tmp_path, "a O\n")
    with pytest.raises(ValueError, match="unknown tag scheme"):
        read_conll(path, scheme="IOB")
    with pytest.raises(FileNotFoundError):
        read_conll(tmp_path / "missing.conll")


def test_round_trip_two_columns_with_documents(tmp_path: Path) -> None:
    text = (
        "-DOCSTART-\tO\n\nA\tS-PER\nb\tO\n\nC\tO\n\n\n"
        "-DOCSTART-\tO\n\nD\tS-LOC\nE\tB-ORG\nF\tE-ORG\n"
    )
    original = read_conll(_write(tmp_path, text), scheme="BIOES")
    out = tmp_path / "out" / "copy.conll"
    write_conll(out, original)
    again = read_conll(out, scheme="BIOES")
    assert _data(again) == _data(original)
    assert [s.document for s in again] == [0, 0, 1]
    assert not [p.name for p in out.parent.iterdir() if p.name != "copy.conll"]  # no temp files
    write_conll(tmp_path / "flat.conll", original, docstart=None)
    assert "-DOCSTART-" not in (tmp_path / "flat.conll").read_text()


def test_round_trip_raw_columns_of_conll2003(tmp_path: Path) -> None:
    options = {"tag_column": 3, "scheme": "IOB1"}
    original = read_conll(_write(tmp_path, CONLL2003), **options)
    out = tmp_path / "copy.conll"
    write_conll(out, original, delimiter=" ", raw_columns=True)
    assert _data(read_conll(out, **options)) == _data(original)
    assert out.read_text().startswith("-DOCSTART- O O O\n\nEU NNP I-NP I-ORG\n")


def test_write_to_handle_with_extra_columns() -> None:
    sentences = [Sentence(["a", "b"], ["B-X", "O"]), Sentence(["c"], None)]
    handle = io.StringIO()
    write_conll(handle, sentences, extra_tag_columns={"pred": [["B-X", "B-X"], ["O"]]})
    assert handle.getvalue() == "a\tB-X\tB-X\nb\tO\tB-X\n\nc\tO\n\n"


@pytest.mark.parametrize(
    "sentence,message",
    [
        (Sentence(["a b"], ["O"]), "contains the delimiter"),
        (Sentence(["a"], ["O", "O"]), "2 tags for 1 tokens"),
        (Sentence([""], ["O"]), "is empty"),
        (Sentence(["a\nb"], ["O"]), "line break"),
    ],
)
def test_write_rejects_what_cannot_be_read_back(sentence: Sentence, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        write_conll(io.StringIO(), [sentence], delimiter=" ")


def test_write_checks_extra_columns_and_raw_columns() -> None:
    with pytest.raises(ValueError, match="extra column 'p' has 1 sentences"):
        two = [Sentence(["a"]), Sentence(["b"])]
        write_conll(io.StringIO(), two, extra_tag_columns={"p": [["O"]]})
    with pytest.raises(ValueError, match="extra column 'p' has 2 values for 1 tokens"):
        write_conll(io.StringIO(), [Sentence(["a"])], extra_tag_columns={"p": [["O", "O"]]})
    with pytest.raises(ValueError, match="raw_columns=True needs"):
        write_conll(io.StringIO(), [Sentence(["a"])], raw_columns=True)


def test_sentence_block_writes_what_write_conll_writes_and_refuses_the_same_values() -> None:
    """Random sentences (empty values, tabs, line breaks in tokens, tags, raw and extra columns):
    one sentence at a time gives write_conll's text, or the same error."""
    import random

    from neurocrf.data.conll import sentence_block

    rng = random.Random(0)
    pieces = ["a", "b", "", "\t", "\n", "\r", " ", "ab"]

    def value() -> str:
        return "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))

    for _ in range(5000):
        n = rng.randint(0, 4)
        raw = rng.random() < 0.5
        sentence = Sentence([value() or "x" for _ in range(n)], tags=[value() for _ in range(n)] if rng.random() < .5
                            else None, columns=[[value() for _ in range(rng.randint(1, 3))] for _ in range(n)]
                            if rng.random() < .8 else None, source="f", line=1)
        extra = {f"e{k}": [value() for _ in range(n)] for k in range(rng.randint(0, 2))}
        results = []
        for write in (lambda: sentence_block(sentence, extra, raw_columns=raw),
                      lambda: _whole(sentence, extra, raw)):
            try:
                results.append(write())
            except ValueError as error:
                results.append(f"{type(error).__name__}: {error}")
        assert results[0] == results[1], (sentence, extra, raw)


def _whole(sentence: Sentence, extra: dict, raw: bool) -> str:
    out = io.StringIO()
    write_conll(out, [sentence], extra_tag_columns={k: [v] for k, v in extra.items()}, raw_columns=raw)
    return out.getvalue()
