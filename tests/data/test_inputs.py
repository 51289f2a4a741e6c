"""Input files to tag: the format from the option, the extension or a bounded prefix of the file
(a first sentence longer than the prefix still read whole), ambiguous files refused with file and
line, text input decoded like CoNLL input, and the CoNLL reader/writer checks that protect the tag
column and the output."""

from __future__ import annotations

from pathlib import Path

import pytest

from neurocrf.data.conll import ConllFormatError, Sentence, check_writable, read_conll
from neurocrf.data.inputs import detect_input_format, read_input, read_text_sentences

ISSUE_TEXT = "Peter works in Berlin\nMary lives in Paris\n\nJohn flew to Rome\n"


def _write(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content.encode("utf-8") if isinstance(content, str) else content)
    return path


def _tokens(sentences: list[Sentence]) -> int:
    return sum(len(s.tokens) for s in sentences)


def test_equal_word_counts_with_a_blank_line_are_refused_not_read_as_conll(tmp_path: Path) -> None:
    path = _write(tmp_path, "input.txt", ISSUE_TEXT)
    message = (r"input\.txt:1: cannot tell whether this is a CoNLL column file or plain text: every token"
               r" line has 4 field\(s\) and no tag column \('Berlin' here is not a tag\)\. As CoNLL it holds"
               r" 2 sentence\(s\) of 3 token\(s\), as text 4 sentence\(s\) of 12 token\(s\)\. Give input_format")
    with pytest.raises(ConllFormatError, match=message):
        read_input(path)
    sentences, read_as = read_input(path, "text")
    assert read_as == "text" and _tokens(sentences) == 12 and [len(s) for s in sentences] == [4, 4, 0, 4]
    assert [s.line for s in sentences] == [1, 2, 3, 4]


def test_a_first_sentence_longer_than_any_prefix_is_read_whole(tmp_path: Path) -> None:
    words = [f"w{i}" for i in range(10_000)]
    tagged = "".join(f"{w}\t{'B-PER' if i % 7 == 0 else 'O'}\n" for i, w in enumerate(words)) + "\nlast\tO\n"
    sentences, read_as = read_input(_write(tmp_path, "long.txt", tagged))
    assert read_as == "conll" and [len(s) for s in sentences] == [10_000, 1]
    assert sentences[0].tokens == words and sentences[0].columns[1] == ["w1", "O"]
    tokens_only = _write(tmp_path, "long.conll", "\n".join(words) + "\n")
    sentences, read_as = read_input(tokens_only)  # the extension decides
    assert read_as == "conll" and [len(s) for s in sentences] == [10_000]


def test_one_sentence_without_a_final_blank_line_keeps_its_gold_tags_out_of_the_tokens(tmp_path: Path) -> None:
    path = _write(tmp_path, "gold", "EU\tB-ORG\nrejects\tO\nGerman\tB-MISC\ncall\tO")
    assert detect_input_format(path) == "conll"
    (sentence,), read_as = read_input(path)
    assert read_as == "conll" and sentence.tokens == ["EU", "rejects", "German", "call"]
    assert [row[1] for row in sentence.columns] == ["B-ORG", "O", "B-MISC", "O"]


@pytest.mark.parametrize(
    "name,content,expected",
    [
        ("a.txt", "-DOCSTART- -X- O\n\nEU NNP B-ORG\nrejects VBZ O\n\nPeter NNP B-PER\n", "conll"),
        ("b.txt", "-DOCSTART-\n\nEU\nrejects\n\nPeter\n", "conll"),  # one column, a document separator
        ("c.txt", "EU rejects German call\n\nPeter Blackburn\n", "text"),
        ("d.txt", "EU I-NP B-ORG\nrejects I-VP O\nGerman I-NP\n", "conll"),  # the CoNLL reader names line 3
        ("e.txt", "EU rejects\nGerman call to boycott\n", "text"),
        ("f.txt", "Peter lives in Berlin\n", "text"),  # one line: as CoNLL, one token with three more columns
        ("g.txt", "\ufeffPeter lives\n\nMary goes\n", "text"),  # every CoNLL sentence would be one token
    ],
)
def test_detection_rules(tmp_path: Path, name: str, content: str, expected: str) -> None:
    assert detect_input_format(_write(tmp_path, name, content)) == expected


def test_detection_of_a_broken_conll_file_hands_it_to_the_conll_reader(tmp_path: Path) -> None:
    path = _write(tmp_path, "d.txt", "EU I-NP B-ORG\nrejects I-VP O\nGerman I-NP\n")
    with pytest.raises(ConllFormatError, match=r"d\.txt:3: found 2 column\(s\), expected 3 as on line 1"):
        read_input(path)


@pytest.mark.parametrize(
    "content,line,reads",
    [
        ("EU\nrejects\n\nPeter\n", 1, "As CoNLL it holds 2 sentence\\(s\\) of 3 token\\(s\\), as text 4"),
        ("Peter lives\nin Berlin\n", 1, "As CoNLL it holds 1 sentence\\(s\\) of 2 token\\(s\\), as text 2"),
        ("EU O\nrejects VBZ\n", 2, "'VBZ' here is not a tag"),
    ],
)
def test_ambiguous_files_are_refused_naming_file_and_line(tmp_path: Path, content: str, line: int, reads: str) -> None:
    path = _write(tmp_path, "in", content)
    with pytest.raises(ConllFormatError, match=rf"in:{line}: cannot tell .*{reads}"):
        read_input(path)


def test_reader_options_apply_to_detection(tmp_path: Path) -> None:
    path = _write(tmp_path, "semi", "# comment line\nNew York;B-LOC\nis;O\n")
    sentences, read_as = read_input(path, reader={"delimiter": ";", "comment_prefix": "#"})
    assert read_as == "conll" and sentences[0].tokens == ["New York", "is"]


def test_empty_input_is_an_error_in_every_format(tmp_path: Path) -> None:
    for name, content in (("empty.txt", ""), ("blank.txt", "\n \n")):
        path = _write(tmp_path, name, content)
        for input_format in ("auto", "text"):
            with pytest.raises(ConllFormatError, match=rf"{name}:1: no tokens to tag"):
                read_input(path, input_format)
    with pytest.raises(ValueError, match="input_format must be one of"):
        read_input(_write(tmp_path, "x.txt", "a b\n"), "csv")
    with pytest.raises(FileNotFoundError, match="input file not found"):
        read_input(tmp_path / "missing.txt")


def test_text_input_drops_a_bom_and_keeps_every_line(tmp_path: Path) -> None:
    path = _write(tmp_path, "bom.txt", "\ufeffPeter lives in Berlin\r\n\r\nMary\u00a0Smith\r\n")
    sentences = read_text_sentences(path)
    assert [s.tokens for s in sentences] == [["Peter", "lives", "in", "Berlin"], [], ["Mary", "Smith"]]
    assert sentences[2].location(1) == f"{path}:3"
    assert [s.tokens for s in read_text_sentences(_write(tmp_path, "nofinal.txt", "a\n\nb"))] == [["a"], [], ["b"]]


def test_text_input_names_file_and_line_of_bytes_that_are_not_utf8(tmp_path: Path) -> None:
    path = _write(tmp_path, "latin.txt", "Peter lives\nin K\xf6ln\n".encode("latin-1"))
    for reading in (lambda: read_text_sentences(path), lambda: read_input(path, "text"), lambda: read_input(path)):
        with pytest.raises(ConllFormatError, match=r"latin\.txt:2: bytes b'\\xf6' are not valid utf-8"):
            reading()
    sentences, _ = read_input(path, "text", reader={"encoding": "latin-1"})
    assert sentences[1].tokens == ["in", "Köln"]


@pytest.mark.parametrize(
    "content,line,tag",
    [
        ("EU\tB-ORG\nPeter\tB-PER \n", 2, "'B-PER '"),
        ("EU\tB-ORG\nPeter\t B-PER\n", 2, "' B-PER'"),
        ("EU\t\n", 1, "''"),
        ("EU B-ORG\u00a0\n", 1, "'B-ORG\\\\xa0'"),
    ],
)
def test_whitespace_around_a_tag_is_an_error_not_a_new_type(tmp_path: Path, content: str, line: int, tag: str) -> None:
    path = _write(tmp_path, "tags.tsv", content)
    delimiter = "\t" if "\t" in content else None
    with pytest.raises(ConllFormatError, match=rf"tags\.tsv:{line}: tag {tag} is empty or has whitespace around it"):
        read_conll(path, delimiter=delimiter)
    read_conll(path, delimiter=delimiter, tag_column=None)  # no tag column: the columns are kept as they are


def test_check_writable_names_the_token_that_a_column_file_cannot_hold(tmp_path: Path) -> None:
    path = _write(tmp_path, "in.tsv", "EU\tB-ORG\n\tO\n")
    sentences = read_conll(path, delimiter="\t", tag_column=None)
    with pytest.raises(ConllFormatError, match=r"in\.tsv:2: value '' is empty or contains the delimiter"):
        check_writable(sentences, raw_columns=True)
    check_writable([Sentence(["a", "b"])])
    with pytest.raises(ConllFormatError, match="value 'a\\\\tb'"):
        check_writable([Sentence(["a\tb"], source="s", line=1)])
