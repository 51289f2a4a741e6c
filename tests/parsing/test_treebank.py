"""Treebank readers and writers: Alpino XML, NeGra export 3/4, discbracket, Penn brackets."""

import io
import random

import pytest

from neurocrf.parsing.alpino import parse_alpino_xml, read_alpino
from neurocrf.parsing.bracket import (
    parse_discbracket,
    parse_penn,
    read_discbracket,
    strip_function_tags,
    write_discbracket,
)
from neurocrf.parsing.export import parse_export, read_export, write_export
from neurocrf.parsing.tree import Tree, TreebankFormatError, TreebankSentence, random_tree
from neurocrf.parsing.treebank import data_root, read_treebank, split_treebank, write_treebank

# "Ik zou alsmaar informatie moeten geven ." The subject is shared through index 1; the inner
# infinitive (alsmaar informatie ... geven) is interrupted by "moeten": a discontinuous INF.
ALPINO = """<?xml version="1.0" encoding="UTF-8"?>
<alpino_ds version="1.3">
  <node begin="0" cat="top" end="7" id="0" rel="top">
    <node begin="0" cat="smain" end="6" id="1" rel="--">
      <node begin="0" end="1" id="2" index="1" pos="noun" rel="su" word="Ik"/>
      <node begin="1" end="2" id="3" pos="verb" rel="hd" word="zou"/>
      <node begin="0" cat="inf" end="6" id="4" rel="vc">
        <node begin="0" end="1" id="5" index="1" rel="su"/>
        <node begin="4" end="5" id="6" pos="verb" rel="hd" word="moeten"/>
        <node begin="0" cat="inf" end="6" id="7" rel="vc">
          <node begin="0" end="1" id="8" index="1" rel="su"/>
          <node begin="2" end="3" id="9" pos="adv" rel="mod" word="alsmaar"/>
          <node begin="3" end="4" id="10" pos="noun" rel="obj1" word="informatie"/>
          <node begin="5" end="6" id="11" pos="verb" rel="hd" word="geven"/>
        </node>
      </node>
    </node>
    <node begin="6" end="7" id="12" pos="punct" rel="--" word="."/>
  </node>
  <sentence>Ik zou alsmaar informatie moeten geven .</sentence>
</alpino_ds>
"""
ALPINO_TREE = ("(TOP (SMAIN (noun 0) (verb 1) (INF (verb 4) (INF (adv 2) (noun 3) (verb 5))))"
               " (punct 6))")

# "Darüber muss nachgedacht werden ." with two discontinuous VPs.
EXPORT3 = """%% a comment
#BOS 1 2 1070544990 0
Darüber\tPROAV\t--\tMO\t500\tMO\t501
muss\tVMFIN\t3.Sg.Pres.Ind\tHD\t502
nachgedacht\tVVPP\tPsp\tHD\t500
werden\tVAINF\tInf\tHD\t501
.\t$.\t--\t--\t0
#500\tVP\t--\tOC\t501
#501\tVP\t--\tOC\t502
#502\tS\t--\t--\t0
#EOS 1
"""
EXPORT_TREE = "(VROOT (S (VP (VP (PROAV 0) (VVPP 2)) (VAINF 3)) (VMFIN 1)) ($. 4))"
EXPORT_WORDS = ["Darüber", "muss", "nachgedacht", "werden", "."]


def _to_format4(text: str) -> str:
    out = []
    for line in text.splitlines():
        fields = line.split("\t")
        if len(fields) >= 5 and not line.startswith("#BOS") and not line.startswith("#EOS"):
            fields.insert(1, "--" if fields[0].startswith("#") else fields[0].lower())
        out.append("\t".join(fields))
    return "\n".join(out) + "\n"


EXPORT4 = ("#FORMAT 4\n#BOT ORIGIN\n0\tnegra.txt\n#EOT ORIGIN\n" + _to_format4(EXPORT3))


def _random_sentences(count: int, seed: int = 0) -> list[TreebankSentence]:
    rng = random.Random(seed)
    out = []
    for k in range(count):
        n = rng.randint(1, 12)
        words = [rng.choice(["a", "b(", ")c", "d=e", "Über", "(x)"]) + str(i) for i in range(n)]
        out.append(TreebankSentence(str(k + 1), words, random_tree(rng, n, root="VROOT")))
    return out


# ---------------------------------------------------------------------------- Alpino
def test_alpino_index_node_gives_discontinuous_constituent():
    s = parse_alpino_xml(ALPINO, sent_id="42")
    assert s.id == "42"
    assert s.words == ["Ik", "zou", "alsmaar", "informatie", "moeten", "geven", "."]
    assert s.tree == Tree.parse(ALPINO_TREE)
    inner = [n for n in s.tree.subtrees() if n.label == "INF" and 4 not in n.leaves()][0]
    assert inner.blocks() == [(2, 4), (5, 6)]
    assert s.pos_tags == ["noun", "verb", "adv", "noun", "verb", "verb", "punct"]


def test_alpino_reader_keeps_functions_head_projections_and_postags():
    xml = ALPINO.replace('pos="noun" rel="obj1"', 'pos="noun" postag="N(soort,ev)" rel="obj1"')
    s = parse_alpino_xml(xml)
    assert s.annotations == {
        "function": ["su", "hd", "mod", "obj1", "hd", "hd", "--"],
        # a head takes the cat/rel of the phrase it heads, through chains of hd links
        "projection": ["-/su", "smain/--", "-/mod", "-/obj1", "inf/vc", "inf/vc", "-/--"],
        "postag": ["_", "_", "_", "N(soort,ev)", "_", "_", "_"],
    }


def test_alpino_folder_is_read_in_numeric_order(tmp_path):
    for name in ["10", "2", "1"]:
        (tmp_path / f"{name}.xml").write_text(ALPINO, encoding="utf-8")
    sents = read_alpino(tmp_path)
    assert [s.id for s in sents] == ["1", "2", "10"]
    assert [s.id for s in read_treebank(tmp_path, limit=2)] == ["1", "2"]


def test_alpino_phrase_with_only_secondary_children_is_dropped():
    xml = ALPINO.replace('<node begin="0" end="1" id="5" index="1" rel="su"/>',
                         '<node begin="0" cat="np" end="1" id="5" rel="su">'
                         '<node begin="0" end="1" id="50" index="1" rel="hd"/></node>')
    assert parse_alpino_xml(xml).tree == Tree.parse(ALPINO_TREE)


@pytest.mark.parametrize("edit, line, message", [
    (('<node begin="1" end="2" id="3" pos="verb" rel="hd" word="zou"/>',
      '<node begin="1" end="2" id="3" pos="verb" rel="hd" word="zou">'), 21, "XML parse error"),
    (('pos="adv" rel="mod" word="alsmaar"', 'rel="mod" word="alsmaar"'), 12, "no 'pos'"),
    (('begin="3" end="4" id="10"', 'begin="3" end="5" id="10"'), 13, "expected one word"),
    (('<node begin="5" end="6" id="11" pos="verb" rel="hd" word="geven"/>', ''), 3, r"missing \[5\]"),
    (('geven .</sentence>', 'geven . extra</sentence>'), 20, "<sentence> has 8 tokens"),
    (('id="9" pos="adv"', 'id="9" index="3" pos="adv"'), None, None),  # primary with index: fine
    (('<node begin="0" end="1" id="8" index="1" rel="su"/>', '<node begin="0" end="1" id="8"/>'),
     11, "neither"),
])
def test_alpino_errors_name_file_and_line(tmp_path, edit, line, message):
    path = tmp_path / "3.xml"
    path.write_text(ALPINO.replace(*edit), encoding="utf-8")
    assert edit[0] in ALPINO
    if message is None:
        assert read_alpino(tmp_path)[0].tree == Tree.parse(ALPINO_TREE)
        return
    with pytest.raises(TreebankFormatError, match=message) as err:
        read_alpino(tmp_path)
    assert str(err.value).startswith(f"{path}:{line}:")
    assert isinstance(err.value, ValueError)


def test_alpino_missing_folder():
    with pytest.raises(FileNotFoundError):
        read_alpino("/nonexistent/alpino")


# ---------------------------------------------------------------------------- export
@pytest.mark.parametrize("text, fmt", [(EXPORT3, None), (EXPORT3, 3), (EXPORT4, None),
                                       (_to_format4(EXPORT3), None), (_to_format4(EXPORT3), 4)])
def test_export_reader_formats_3_and_4(text, fmt):
    (s,) = parse_export(text, fmt)
    assert s.id == "1"
    assert s.words == EXPORT_WORDS
    assert s.tree == Tree.parse(EXPORT_TREE)
    vps = [n for n in s.tree.subtrees() if n.label == "VP"]
    assert sorted(n.fanout() for n in vps) == [2, 2]


def test_export_root_label_option():
    (s,) = parse_export(EXPORT3, root_label="ROOT")
    assert s.tree.label == "ROOT"


@pytest.mark.parametrize("fmt", [3, 4])
def test_export_round_trip(tmp_path, fmt):
    sents = _random_sentences(120)
    path = tmp_path / "t.export"
    write_export(path, sents, fmt)
    assert path.read_text(encoding="utf-8").startswith(f"#FORMAT {fmt}\n")
    back = read_export(path)
    assert [(s.id, s.words, s.tree) for s in back] == [(s.id, s.words, s.tree) for s in sents]
    # and through the facade, read -> write -> read again
    buf = io.StringIO()
    write_treebank(buf, back, "export", fmt_version=fmt)
    assert [(s.id, s.words, s.tree) for s in parse_export(buf.getvalue())] == \
        [(s.id, s.words, s.tree) for s in sents]


@pytest.mark.parametrize("fmt", [3, 4])
def test_export_reader_keeps_per_token_annotations(fmt):
    (s,) = parse_export(EXPORT3 if fmt == 3 else _to_format4(EXPORT3))
    assert s.annotations == {
        "function": ["MO", "HD", "HD", "HD", "--"],
        "morph": ["--", "3.Sg.Pres.Ind", "Psp", "Inf", "--"],
        # HD edges followed upwards: nachgedacht heads VP#500, which is OC (not HD) of VP#501
        "projection": ["-/MO", "S/--", "VP/OC", "VP/OC", "-/--"],
    }


def test_export_writer_numbers_bottom_up_and_keeps_foreign_root():
    (s,) = parse_export(EXPORT3)
    buf = io.StringIO()
    write_export(buf, [s])
    lines = buf.getvalue().splitlines()
    assert lines[2].split("\t") == ["Darüber", "PROAV", "--", "MO", "500"]  # morph and edge kept
    assert lines[3].split("\t") == ["muss", "VMFIN", "3.Sg.Pres.Ind", "HD", "502"]
    nonterminals = [line.split("\t") for line in lines if line.startswith("#5")]
    assert [(f[0], f[1], f[4]) for f in nonterminals] == [("#500", "VP", "501"), ("#501", "VP", "502"),
                                                         ("#502", "S", "0")]
    other = TreebankSentence("x", ["a", "b"], Tree.parse("(S (A 0) (B 1))"))
    buf = io.StringIO()
    write_export(buf, [other])
    (back,) = parse_export(buf.getvalue())
    assert back.tree == Tree.parse("(VROOT (S (A 0) (B 1)))")


def test_export_writer_rejects_unrepresentable_trees():
    with pytest.raises(ValueError, match="not under a preterminal"):
        write_export(io.StringIO(), [TreebankSentence("1", ["a", "b"], Tree.parse("(VROOT (S 0 1))"))])
    with pytest.raises(ValueError, match="whitespace"):
        write_export(io.StringIO(), [TreebankSentence("1", ["a b"], Tree.parse("(VROOT (A 0))"))])


@pytest.mark.parametrize("text, line, message", [
    (EXPORT3.replace("HD\t500\n", "HD\t509\n"), 5, "parent #509 is not defined"),
    (EXPORT3.replace("#EOS 1", "#EOS 2"), 11, "#EOS 2 closes #BOS 1"),
    (EXPORT3.replace("#EOS 1\n", ""), 2, "has no #EOS"),
    (EXPORT3.replace("HD\t501\n", "HD\tx\n"), 6, "not a number"),
    (EXPORT3.replace("muss\tVMFIN\t3.Sg.Pres.Ind\tHD\t502", "muss\tVMFIN"), 4, "at least 5 fields"),
    (EXPORT3.replace("#501\tVP\t--\tOC\t502", "#501\tVP\t--\tOC\t500").replace(
        "#500\tVP\t--\tOC\t501", "#500\tVP\t--\tOC\t501"), 8, "cycle"),
    (EXPORT3.replace("#502\tS\t--\t--\t0\n", "#502\tS\t--\t--\t0\n#503\tS\t--\t--\t0\n"), 11,
     "no children"),
    (EXPORT3 + EXPORT3.replace("#BOS 1 2", "#BOS 2").replace("#EOS 1\n", ""), 13, "has no #EOS"),
    ("#EOS 3\n", 1, "#EOS without #BOS"),
    ("#FORMAT 5\n", 1, "unsupported #FORMAT"),
])
def test_export_errors_name_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.export"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TreebankFormatError, match=message) as err:
        read_export(path)
    assert str(err.value).startswith(f"{path}:{line}:")


# ---------------------------------------------------------------------------- discbracket
def test_discbracket_reader():
    """disco-dop's form: a tree, optionally a tab and a comment; the id is the line number (as
    disco-dop numbers lines) unless the comment starts with id=."""
    text = ("(S (VP (VB 0=is) (NN 2=x)) (X 1=y))\n\n(S (A 0=#LRB#))\tid7\n(S (A 0=a=b))\t s 8 \n"
            "(S (A 0=a))\tid=wsj_0001:10\n(S (A 0=a))\tid=7  checked by  hand \n")
    a, b, c, d, e = parse_discbracket(text)
    assert (a.id, a.words, a.comment) == ("1", ["is", "y", "x"], None)
    assert a.tree == Tree.parse("(S (VP (VB 0) (NN 2)) (X 1))")
    assert (b.id, b.words, str(b.tree), b.comment) == ("3", ["("], "(S (A 0))", "id7")
    assert (c.id, c.words, c.comment) == ("4", ["a=b"], "s 8")
    assert (d.id, d.comment) == ("wsj_0001:10", None)
    assert (e.id, e.comment) == ("7", "checked by  hand")
    # files written as tree<TAB>id: the whole comment is the id on request
    assert [s.id for s in parse_discbracket(text, id_from_comment=True)] == ["1", "id7", "s 8", "id=wsj_0001:10",
                                                                              "id=7  checked by  hand"]


def test_discbracket_comments_stay_comments_and_round_trip(tmp_path):
    """Alpino annotator comments and disco-dop's prob= comments, as disco-dop writes them
    (``writetree(..., 'discbracket', comment=...)``), are comments, never ids; written back with
    ids, every line reads back to the same ids, trees and comments, and disco-dop's own reader
    (which keys every line by its number) still reads the tree before the tab."""
    path = tmp_path / "alpino.discbracket"
    path.write_text("(TOP (SMAIN (N 0=Het) (WW 1=regent)) (let 2=.))\tZin is door annotator gecontroleerd.\n"
                    "(TOP (N 0=Ja))\n"
                    "(TOP (N 0=Nee))\tprob=1.5e-05\n", encoding="utf-8")
    sents = read_treebank(path)
    assert [(s.id, s.comment) for s in sents] == [("1", "Zin is door annotator gecontroleerd."), ("2", None),
                                                  ("3", "prob=1.5e-05")]
    for s, new_id in zip(sents, ("cdb/12", "cdb/2", "cdb/100")):
        s.id = new_id
    out = tmp_path / "with_ids.discbracket"
    write_discbracket(out, sents, write_ids=True)
    lines = out.read_text(encoding="utf-8").splitlines()
    assert [line.split("\t", 1)[1] for line in lines] == [
        "id=cdb/12 Zin is door annotator gecontroleerd.", "id=cdb/2", "id=cdb/100 prob=1.5e-05"]
    again = read_treebank(out)
    assert [(s.id, s.words, s.tree, s.comment) for s in again] == [(s.id, s.words, s.tree, s.comment) for s in sents]
    buf = io.StringIO()
    write_discbracket(buf, sents)  # without ids: the comments only, as they were read
    assert buf.getvalue() == path.read_text(encoding="utf-8")


def test_comments_travel_between_discbracket_and_export(tmp_path):
    """disco-dop writes a comment on the #BOS line (``#BOS 1 %% id=0``); so does neurocrf."""
    sents = parse_discbracket("(ROOT (S (A 0=a) (B 1=b)))\tid=a1 checked\n(ROOT (S (A 0=c) (B 1=d)))\n")
    path = tmp_path / "t.export"
    write_treebank(path, sents, "export", root_label="ROOT")
    assert [line for line in path.read_text(encoding="utf-8").splitlines() if line.startswith("#BOS")] == [
        "#BOS a1 %% checked", "#BOS 2"]
    back = read_treebank(path)
    assert [(s.id, s.comment, s.words) for s in back] == [("a1", "checked", ["a", "b"]), ("2", None, ["c", "d"])]
    (first,) = read_treebank(_write(tmp_path, "d.export", "#BOS 1 %% id=0\nx\tN\t--\t--\t0\n#EOS 1\n"))
    assert (first.id, first.comment) == ("1", "id=0")
    with pytest.raises(ValueError, match="holds a line break"):
        write_treebank(io.StringIO(), [TreebankSentence("1", ["a"], Tree.parse("(S (A 0))"), comment="a\nb")],
                       "export")


def _write(folder, name: str, text: str):
    path = folder / name
    path.write_text(text, encoding="utf-8")
    return path


def test_discbracket_reads_discodop_sentid_lines():
    """``discodop treetransforms --sentid`` writes ``key|tree``."""
    a, b = parse_discbracket("cdb/17|(S (A 0=a))\n18|(S (A 0=b))\tprob=0.5\n")
    assert (a.id, a.words, b.id, b.comment) == ("cdb/17", ["a"], "18", "prob=0.5")


def test_discbracket_hand_written_in_discodop_form(tmp_path):
    """A file as disco-dop writes it (``writetree(..., 'discbracket', comment=...)``): comments
    after a tab, discontinuous constituents, escaped brackets."""
    path = tmp_path / "gold.discbracket"
    path.write_text(
        "(ROOT (S (VP (VVPP 0=Gelesen) (NN 2=Buch)) (VAFIN 1=hat) (PPER 3=er)) ($. 4=.))\tid=1\n"
        "(ROOT (NP (NE 0=Peter) ($[ 1=#LRB#) (NE 2=Pan) ($[ 3=#RRB#)))\tid=2\n",
        encoding="utf-8")
    first, second = read_treebank(path)
    assert (first.id, second.id) == ("1", "2")
    assert first.words == ["Gelesen", "hat", "Buch", "er", "."]
    assert [n.fanout() for n in first.tree.subtrees() if n.label == "VP"] == [2]
    assert second.words == ["Peter", "(", "Pan", ")"]
    assert second.pos_tags == ["NE", "$(", "NE", "$("]  # the STTS tag, as the export format writes it
    buf = io.StringIO()
    write_discbracket(buf, [first, second], write_ids=True)
    assert buf.getvalue() == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("write_ids", [False, True])
def test_discbracket_round_trip(tmp_path, write_ids):
    sents = _random_sentences(150, seed=3)
    path = tmp_path / "t.discbracket"
    write_discbracket(path, sents, write_ids=write_ids)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert all(line.startswith("(") for line in lines)  # the tree first
    if write_ids:
        assert [line.rsplit("\t", 1)[1] for line in lines] == [f"id={s.id}" for s in sents]
    first = read_discbracket(path)
    assert [(s.words, s.tree) for s in first] == [(s.words, s.tree) for s in sents]
    if write_ids:
        assert [s.id for s in first] == [s.id for s in sents]
    buf = io.StringIO()
    write_treebank(buf, first, "discbracket", write_ids=write_ids)
    assert buf.getvalue() == path.read_text(encoding="utf-8")
    assert read_treebank(path) == first


@pytest.mark.parametrize("text, line, message", [
    ("(S (A 0=a)\n", 1, "not closed"),
    ("(S (A 0=a))\n(S (A 0=a) (B 2=b))\n", 2, "not 0..1"),
    ("(S (A 0=a) (B 1))\n", 1, r"terminal\(s\) \[1\] have no '=word'"),
    ("\n(S (A 0=a) (B 0=b))\n", 2, "repeated"),
    ("x (S (A 0=a))\n", 1, "expected a tree or 'tree<TAB>comment'"),
    ("(S (A 0=a))\n7\t(S (A 0=a))\n", 2, "an 'id<TAB>tree' line: discbracket puts the tree first"),
    ("(S (A 0=a))\tid= x\n", 1, "the comment 'id= x' names no id after 'id='"),
    ("(S (A 0=a))\tid=\n", 1, "names no id"),
    ("\tcomment only\n", 1, "expected a tree"),
])
def test_discbracket_errors_name_file_and_line(tmp_path, text, line, message):
    path = tmp_path / "bad.discbracket"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(TreebankFormatError, match=message) as err:
        read_discbracket(path)
    assert str(err.value).startswith(f"{path}:{line}:")


def test_discbracket_bracket_escapes():
    # '(' and ')' are written #LRB# / #RRB# as disco-dop does; a Penn-style -LRB- is a plain word
    (s,) = parse_discbracket("(S (A 0=#LRB#) (B 1=a#RRB#) (C 2=-LRB-))")
    assert s.words == ["(", "a)", "-LRB-"]
    buf = io.StringIO()
    write_discbracket(buf, [s])
    assert buf.getvalue() == "(S (A 0=#LRB#) (B 1=a#RRB#) (C 2=-LRB-))\n"


def test_discbracket_writer_rejects_whitespace_in_words_and_ids():
    with pytest.raises(ValueError, match="whitespace"):
        write_discbracket(io.StringIO(), [TreebankSentence("1", ["a b"], Tree.parse("(S (A 0))"))])
    for bad in ("", " 1", "a\tb", "s 8"):
        with pytest.raises(ValueError, match="discbracket comment cannot hold"):
            write_discbracket(io.StringIO(), [TreebankSentence(bad, ["a"], Tree.parse("(S (A 0))"))], write_ids=True)
    for bad in (" x", "a\tb", "a\nb"):
        with pytest.raises(ValueError, match="discbracket comment cannot hold"):
            write_discbracket(io.StringIO(), [TreebankSentence("1", ["a"], Tree.parse("(S (A 0))"), comment=bad)])
    with pytest.raises(ValueError, match="would read back as an id"):
        write_discbracket(io.StringIO(), [TreebankSentence("1", ["a"], Tree.parse("(S (A 0))"), comment="id=2")])


# ---------------------------------------------------------------------------- Penn brackets
PENN = """( (S
    (NP-SBJ-1 (DT The) (NN cat) )
    (VP (VBD sat)
      (NP (-NONE- *T*-1) )
      (PP-LOC=2 (IN on) (NP (DT the) (NN mat) )))
    (. .) ))
(S (NP (-LRB- -LRB-) (NN x) (-RRB- -RRB-)))
"""


def test_penn_reader_strips_traces_and_function_tags(tmp_path):
    path = tmp_path / "wsj_0001.mrg"
    path.write_text(PENN, encoding="utf-8")
    a, b = read_treebank(path)
    assert a.id == "wsj_0001:1" and b.id == "wsj_0001:2"
    assert a.words == ["The", "cat", "sat", "on", "the", "mat", "."]
    assert a.tree == Tree.parse("(ROOT (S (NP (DT 0) (NN 1)) (VP (VBD 2) (PP (IN 3) (NP (DT 4) (NN 5))))"
                                " (. 6)))")
    assert b.tree == Tree.parse("(S (NP (-LRB- 0) (NN 1) (-RRB- 2)))")
    assert strip_function_tags("NP-SBJ-1") == "NP" and strip_function_tags("-NONE-") == "-NONE-"
    assert strip_function_tags("PP=2") == "PP" and strip_function_tags("ADVP") == "ADVP"


@pytest.mark.parametrize("text, line, message", [
    ("(S (NP (DT a))\n\n", 1, "not closed"),
    ("(S (NP (DT a)))\n)\n", 2, "unbalanced"),
    ("(S (NP (DT a) b))\n", 1, "unexpected token"),
    ("(S (NP (-NONE- *)))\n", 1, "without words"),
    ("(S\n ())\n", 2, "empty bracket"),
])
def test_penn_errors(text, line, message):
    with pytest.raises(TreebankFormatError, match=message) as err:
        parse_penn(text, source="f.mrg")
    assert str(err.value).startswith(f"f.mrg:{line}:")


def test_read_treebank_rejects_unknown_format(tmp_path):
    with pytest.raises(ValueError, match="cannot tell"):
        read_treebank(tmp_path / "x.txt")
    with pytest.raises(ValueError, match="unknown treebank format"):
        read_treebank(tmp_path, "conll")


# ---------------------------------------------------------------------------- split
def test_split_is_deterministic_by_numeric_id():
    sents = [TreebankSentence(str(i), ["a"], Tree.parse("(S (A 0))")) for i in range(105)]
    random.Random(0).shuffle(sents)
    split = split_treebank(sents)
    assert [len(split[k]) for k in ("train", "dev", "test")] == [85, 10, 10]
    assert [s.id for s in split["test"]] == [str(i) for i in range(95, 105)]
    assert [s.id for s in split["dev"]] == [str(i) for i in range(85, 95)]
    assert [s.id for s in split["train"]][:3] == ["0", "1", "2"]  # 2 before 10: numeric order
    with pytest.raises(ValueError):
        split_treebank(sents, dev=0.6, test=0.5)


# ---------------------------------------------------------------------------- the real treebank
@pytest.mark.slow
def test_alpino_corpus_reads_and_round_trips(tmp_path):
    from neurocrf.parsing.punctuation import move_punctuation_sentence

    folder = data_root() / "alpino" / "cdb"
    if not folder.is_dir():
        pytest.skip(f"no Alpino treebank at {folder} (set NEUROCRF_DATA)")
    sents = read_treebank(folder)
    assert len(sents) == 7136
    assert sum(len(s.words) for s in sents) == 140778
    moved = [move_punctuation_sentence(s) for s in sents]
    phrases = [n for s in moved for n in s.tree.subtrees() if not n.is_preterminal]
    disc_share = sum(n.fanout() > 1 for n in phrases) / len(phrases)
    disc_sents = sum(any(n.fanout() > 1 for n in s.tree.subtrees()) for s in moved) / len(moved)
    assert 0.07 < disc_share < 0.08 and 0.47 < disc_sents < 0.49
    assert max(n.fanout() for n in phrases) == 4
    split = split_treebank(sents)
    assert [len(split[k]) for k in ("train", "dev", "test")] == [5710, 713, 713]
    assert (split["dev"][0].id, split["test"][0].id, split["test"][-1].id) == ("5725", "6441", "7153")
    for fmt in ("discbracket", "export"):
        path = tmp_path / f"alpino.{fmt}"
        write_treebank(path, moved, fmt, **({"root_label": "TOP"} if fmt == "export" else {}))
        back = read_treebank(path, **({"root_label": "TOP"} if fmt == "export" else {}))
        assert [(s.words, s.tree) for s in back] == [(s.words, s.tree) for s in moved]
