"""Trees drawn as SVG: read the pictures back with xml.etree, and render the page in Chromium."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from neurocrf.cli.draw import draw
from neurocrf.cli.utils import compose_task_config
from neurocrf.parsing.draw import GOLD_ONLY, PRED_ONLY, difference_marks, tree_svg, trees_html
from neurocrf.parsing.evaluate import evaluate
from neurocrf.parsing.tree import Tree, TreebankSentence, random_tree
from neurocrf.parsing.treebank import write_treebank

SVG = "{http://www.w3.org/2000/svg}"
WORDS = ["Gelesen", "hat", "er", "das", "Buch", "."]
# VP {0, 3, 4} reaches over "hat er": discontinuous
GOLD = "(ROOT (S (VP (VVPP 0) (NP-OA (ART 3) (NN 4))) (VAFIN 1) (PPER 2)) ($. 5))"
# the VP misses the object NP, which sits under S; gold's NP has a function tag
PRED = "(ROOT (S (VP (VVPP 0)) (VAFIN 1) (PPER 2) (NP (ART 3) (NN 4))) ($. 5))"


def sent(tree: str, sid: str = "7") -> TreebankSentence:
    return TreebankSentence(sid, list(WORDS), Tree.parse(tree))


def parse_svg(text: str) -> dict:
    """What the picture shows: words left to right, labels, nodes and the lines between them."""
    root = ET.fromstring(text)
    texts = list(root.iter(f"{SVG}text"))
    words = sorted((float(t.get("x")), int(t.get("data-index")), t.text) for t in texts if t.get("class") == "word")
    nodes = {}
    for g in root.iter(f"{SVG}g"):
        (label,) = g.findall(f"{SVG}text")
        nodes[g.get("data-node")] = {"label": label.text, "x": float(label.get("x")), "y": float(label.get("y")),
                                     "span": [int(i) for i in g.get("data-span").split()],
                                     "classes": set(g.get("class").split())}
    lines = [{k: line.get(k) for k in ("class", "data-from", "data-to", "x1", "y1", "x2", "y2")}
             for line in root.iter(f"{SVG}line")]
    return {"texts": texts, "words": words, "nodes": nodes, "lines": lines}


def test_svg_words_in_order_one_text_per_word_and_label_and_connecting_lines():
    gold = sent(GOLD)
    picture = parse_svg(tree_svg(gold))
    # words along the bottom in sentence order, one text each
    assert [w[2] for w in picture["words"]] == WORDS and [w[1] for w in picture["words"]] == list(range(6))
    assert len({w[0] for w in picture["words"]}) == 6
    bottom = {float(t.get("y")) for t in picture["texts"] if t.get("class") == "word"}
    assert len(bottom) == 1 and all(n["y"] < min(bottom) for n in picture["nodes"].values())
    # one text per constituent label (phrases and POS tags) and per word, nothing else
    nodes = list(gold.tree.subtrees())
    assert len(picture["texts"]) == len(nodes) + len(WORDS)
    assert [picture["nodes"][f"n{k}"]["label"] for k in range(len(nodes))] == [n.label for n in nodes]
    # every node but the root hangs from its parent by exactly one line, from label to label;
    # every preterminal reaches its word
    by_target = {}
    for line in picture["lines"]:
        assert line["data-to"] not in by_target
        by_target[line["data-to"]] = line
    assert len(picture["lines"]) == len(nodes) - 1 + len(WORDS)
    for k, node in enumerate(nodes):
        for child in node.children:
            target = f"w{child}" if isinstance(child, int) else f"n{nodes.index(child)}"
            line = by_target[target]
            assert line["data-from"] == f"n{k}"
            assert float(line["x1"]) == pytest.approx(picture["nodes"][f"n{k}"]["x"], abs=0.06)
            end = picture["words"][child][0] if isinstance(child, int) else picture["nodes"][target]["x"]
            assert float(line["x2"]) == pytest.approx(end, abs=0.06)
            assert float(line["y1"]) < float(line["y2"])  # downwards, parent above child
    # parents above their children
    for k, node in enumerate(nodes):
        for child in node.children:
            if isinstance(child, Tree):
                assert picture["nodes"][f"n{k}"]["y"] < picture["nodes"][f"n{nodes.index(child)}"]["y"]


def test_discontinuous_constituent_spans_its_gap_with_crossing_branches():
    picture = parse_svg(tree_svg(sent(GOLD)))
    vp = next(k for k, n in picture["nodes"].items() if n["label"] == "VP")
    assert picture["nodes"][vp]["span"] == [0, 3, 4] and "disc" in picture["nodes"][vp]["classes"]
    assert [n["label"] for n in picture["nodes"].values() if "disc" in n["classes"]] == ["VP"]
    vp_lines = [ln for ln in picture["lines"] if ln["data-from"] == vp]
    assert {ln["class"] for ln in vp_lines} == {"edge disc"}
    # the VP's branches reach over the words of its gap (hat er), whose branches they cross
    xs = [float(ln["x2"]) for ln in vp_lines]
    gap_words = [w[0] for w in picture["words"] if w[1] in (1, 2)]
    assert min(xs) < min(gap_words) and max(gap_words) < max(xs)
    gap = {k for k, n in picture["nodes"].items() if n["label"] in ("VAFIN", "PPER")} | {"w1", "w2"}
    gap_lines = [ln for ln in picture["lines"] if ln["data-to"] in gap]
    assert len(gap_lines) == 4
    assert any(_segments_cross(a, b) for a in vp_lines for b in gap_lines)
    # a continuous tree has no crossing lines at all
    flat = parse_svg(tree_svg(sent("(ROOT (S (VVPP 0) (VAFIN 1) (PPER 2) (NP (ART 3) (NN 4))) ($. 5))")))
    assert not any(_segments_cross(a, b) for a in flat["lines"] for b in flat["lines"] if a is not b)


def _segments_cross(a: dict, b: dict) -> bool:
    def ccw(p, q, r):
        return (r[1] - p[1]) * (q[0] - p[0]) > (q[1] - p[1]) * (r[0] - p[0])
    p1, p2 = (float(a["x1"]), float(a["y1"])), (float(a["x2"]), float(a["y2"]))
    q1, q2 = (float(b["x1"]), float(b["y1"])), (float(b["x2"]), float(b["y2"]))
    return ccw(p1, q1, q2) != ccw(p2, q1, q2) and ccw(p1, p2, q1) != ccw(p1, p2, q2)


def test_differences_are_marked_on_exactly_the_differing_constituents():
    gold, pred = sent(GOLD), sent(PRED)
    gold_marks, pred_marks = difference_marks(gold, pred)
    gold_nodes, pred_nodes = list(gold.tree.subtrees()), list(pred.tree.subtrees())
    # gold VP {0,3,4} is missed (pred VP is {0}); NP-OA == NP once the function tag is stripped
    assert {gold_nodes[k].label: kind for k, kind in gold_marks.items()} == {"VP": GOLD_ONLY}
    assert {pred_nodes[k].label: kind for k, kind in pred_marks.items()} == {"VP": PRED_ONLY}
    picture = parse_svg(tree_svg(pred, marks=pred_marks))
    marked = {n["label"] for n in picture["nodes"].values() if PRED_ONLY in n["classes"]}
    assert marked == {"VP"}
    assert all(GOLD_ONLY not in n["classes"] for n in picture["nodes"].values())
    # with the function tags kept, the NPs differ as well
    gold_marks, _ = difference_marks(gold, pred, functions="leave")
    assert sorted(gold_nodes[k].label for k in gold_marks) == ["NP-OA", "VP"]


def test_marks_count_what_the_evaluation_misses_on_random_trees():
    rng = random.Random(4)
    for k in range(150):
        n = rng.randint(1, 10)
        words = [f"w{i}" for i in range(n)]
        gold = TreebankSentence(str(k), words, random_tree(rng, n, pos_tags=("N", "V", "$,")))
        pred = TreebankSentence(str(k), words, random_tree(rng, n, pos_tags=("N", "V", "$,")))
        r = evaluate([gold], [pred])
        gold_marks, pred_marks = difference_marks(gold, pred)
        assert len(gold_marks) == r["gold_brackets"] - r["matched_brackets"]
        assert len(pred_marks) == r["pred_brackets"] - r["matched_brackets"]
        ET.fromstring(tree_svg(pred, marks=pred_marks))  # well-formed


def svgs(page: str) -> list[ET.Element]:
    return [ET.fromstring(m) for m in re.findall(r"<svg .*?</svg>", page, flags=re.S)]


def test_page_holds_every_sentence_with_its_id_and_f1():
    gold = [sent(GOLD, "1"), sent(GOLD, "a<b")]
    pred = [sent(PRED, "1"), sent(GOLD, "a<b")]
    page = trees_html(gold, pred, title="Dev & test")
    assert page.startswith("<!DOCTYPE html>") and "<title>Dev &amp; test</title>" in page
    assert len(svgs(page)) == 4 and [s.get("data-id") for s in svgs(page)] == ["1", "1", "a<b", "a<b"]
    first, second = (re.search(rf'<section id="s-{re.escape(i)}" data-f1="([0-9.]+)"><h2>(.*?)</h2>', page)
                     for i in ("1", "a&lt;b"))
    r = evaluate(gold[:1], pred[:1])
    assert float(first.group(1)) == pytest.approx(r["f1"], abs=1e-6)
    assert first.group(2) == f"1 (6 words): F1 {100 * r['f1']:.2f}, Dis-F1 0.00"
    assert second.group(2) == "a&lt;b (6 words): F1 100.00, Dis-F1 100.00"
    assert "only in gold (missed)" in page and "only in the prediction (wrong)" in page
    total = evaluate(gold, pred)
    assert f"labeled F1 {100 * total['f1']:.2f}" in page
    alone = trees_html(gold)
    assert len(svgs(alone)) == 2 and "only in gold" not in alone and "discontinuous constituent" in alone
    with pytest.raises(ValueError, match="sentence 1 has id '9'"):
        trees_html(gold, [sent(PRED, "9"), sent(GOLD, "a<b")])


def test_draw_entry_point(tmp_path: Path):
    gold_path, pred_path = tmp_path / "gold.export", tmp_path / "parse.discbracket"
    gold = [sent(GOLD, str(i)) for i in range(1, 4)]
    write_treebank(gold_path, gold, "export")
    write_treebank(pred_path, [sent(PRED, str(i)) for i in range(1, 4)], "discbracket", write_ids=True)
    before = gold_path.read_text(encoding="utf-8")
    out = draw(compose_task_config("draw", tmp_path, [f"gold={gold_path}", f"predictions={pred_path}"]))
    assert out == tmp_path / "trees.html" and len(svgs(out.read_text(encoding="utf-8"))) == 6
    page = draw(compose_task_config("draw", tmp_path, [f"gold={gold_path}", "ids=[3,1]",
                                                       f"output={tmp_path / 'two.html'}"])).read_text()
    assert re.findall(r'<section id="s-(\w+)"', page) == ["1", "3"]  # treebank order
    one = draw(compose_task_config("draw", tmp_path, [f"gold={gold_path}", f"predictions={pred_path}",
                                                      "ids=[2]", f"output={tmp_path / 'two.svg'}"]))
    picture = parse_svg(one.read_text(encoding="utf-8"))
    assert {n["label"] for n in picture["nodes"].values() if PRED_ONLY in n["classes"]} == {"VP"}
    assert gold_path.read_text(encoding="utf-8") == before  # read, never written
    with pytest.raises(ValueError, match=r"no sentence with id\(s\) \['8'\]"):
        draw(compose_task_config("draw", tmp_path, [f"gold={gold_path}", "ids=[8,1]"]))
    with pytest.raises(ValueError, match="an .svg output holds one tree; 3 sentences"):
        draw(compose_task_config("draw", tmp_path, [f"gold={gold_path}", f"output={tmp_path / 'x.svg'}"]))
    pred_path.write_text(pred_path.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match=f"3 gold sentences .* but 1 predicted ones \\({pred_path}\\)"):
        draw(compose_task_config("draw", tmp_path, [f"gold={gold_path}", f"predictions={pred_path}"]))


def _chromium() -> str | None:
    return next((shutil.which(name) for name in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(name)), None)


@pytest.mark.slow
def test_page_renders_in_headless_chromium(tmp_path: Path):
    browser = _chromium()
    if browser is None:
        pytest.skip("no Chromium (Debian: apt-get install -y chromium)")
    pytest.importorskip("PIL", reason="reads the screenshot with Pillow")
    from PIL import Image

    page = tmp_path / "trees.html"
    page.write_text(trees_html([sent(GOLD, "1")], [sent(PRED, "1")]), encoding="utf-8")
    shot = tmp_path / "shot.png"
    run = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                          f"--screenshot={shot}", "--window-size=1200,500", page.as_uri()],
                         capture_output=True, text=True, timeout=120, check=False)
    assert shot.is_file(), run.stderr[-2000:]
    image = Image.open(shot).convert("RGB")
    colours = image.getcolors(maxcolors=1 << 20)
    assert colours is not None and len(colours) > 20  # text, lines and marks, not a blank page
    dark = sum(count for count, (r, g, b) in colours if r + g + b < 300)
    reddish = sum(count for count, (r, g, b) in colours if r > 150 and g < 120 and b < 120)
    assert dark > 500 and reddish > 20  # text and lines; a mark in the colours of the legend
