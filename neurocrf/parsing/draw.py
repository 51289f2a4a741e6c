"""Discontinuous trees as SVG, and gold beside predicted trees in one self-contained HTML page.

Layout (:func:`tree_svg`): the words along the bottom in sentence order, each under its POS tag;
every phrase on the row of its height (one above its highest child) and centred over its
children. A child is joined to its parent by a straight line, so a discontinuous constituent
reaches over the words of its gaps and its lines cross the lines of the constituents in between;
those lines are drawn in their own colour (class ``disc``).

Differences (:func:`difference_marks`): a constituent is marked when its bracket (label and
scored words, as :func:`~neurocrf.parsing.evaluate.evaluate` counts it: root and punctuation
deleted, words renumbered, function tags stripped, ``EQ_LABEL`` applied) is missing from the
other tree; brackets are matched as multisets, so the marks of a tree are exactly the brackets
that the sentence's precision or recall misses. Preterminals and deleted labels are never marked.

Every SVG element carries what a program needs to read the picture back: a ``<g class="node">``
per constituent with ``data-node`` (preorder number), ``data-label`` and ``data-span`` (its
terminal indices), one ``<text>`` per label and per word (``class="word"``, ``data-index``), and
one ``<line>`` per parent-child link with ``data-from`` / ``data-to``.

>>> from neurocrf.parsing.tree import Tree, TreebankSentence
>>> svg = tree_svg(TreebankSentence("1", ["is", "John", "rich"],
...                                 Tree.parse("(S (VP (VB 0) (JJ 2)) (NP 1))")))
>>> svg.startswith("<svg") and svg.count("<line") == 7 and svg.count('class="word"') == 3
True
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Mapping, Sequence

from neurocrf.parsing.evaluate import (
    EvalParams,
    evaluate,
    labeled_spans,
    load_params,
    scored_terminals,
    without_function_tags,
)
from neurocrf.parsing.tree import Tree, TreebankSentence

__all__ = ["GOLD_ONLY", "PRED_ONLY", "tree_svg", "difference_marks", "trees_html"]

GOLD_ONLY = "gold-only"
"""Class of a gold constituent that the prediction misses."""
PRED_ONLY = "pred-only"
"""Class of a predicted constituent that is not in the gold tree."""

_CHAR = 7.4  # estimated width of a character at the font size below, in pixels
_FONT = 13
_ROW = 46  # vertical distance between rows
_MARGIN = 14
_COLOURS = {GOLD_ONLY: ("#c0392b", "#fadbd8"), PRED_ONLY: ("#d35400", "#fdebd0"), "disc": ("#1f5fa8", None)}

_STYLE = f"""
text {{ font: {_FONT}px sans-serif; text-anchor: middle; }}
text.word {{ font-style: italic; }}
line {{ stroke: #555; stroke-width: 1.2; }}
line.lexical {{ stroke: #bbb; stroke-dasharray: 3 2; }}
line.disc {{ stroke: {_COLOURS["disc"][0]}; stroke-width: 1.6; }}
g.disc > text {{ fill: {_COLOURS["disc"][0]}; font-weight: bold; }}
g.{GOLD_ONLY} > rect {{ fill: {_COLOURS[GOLD_ONLY][1]}; stroke: {_COLOURS[GOLD_ONLY][0]}; }}
g.{GOLD_ONLY} > text {{ fill: {_COLOURS[GOLD_ONLY][0]}; font-weight: bold; }}
g.{PRED_ONLY} > rect {{ fill: {_COLOURS[PRED_ONLY][1]}; stroke: {_COLOURS[PRED_ONLY][0]}; }}
g.{PRED_ONLY} > text {{ fill: {_COLOURS[PRED_ONLY][0]}; font-weight: bold; }}
"""


def _text_width(text: str) -> float:
    return len(text) * _CHAR


def tree_svg(sentence: TreebankSentence, *, marks: Mapping[int, str] | None = None) -> str:
    """One tree as an ``<svg>`` element (see the module docstring).

    Args:
        marks: preorder node number (the order of ``tree.subtrees()``) -> :data:`GOLD_ONLY` or
            :data:`PRED_ONLY`, e.g. from :func:`difference_marks`.
    """
    tree, words, marks = sentence.tree, sentence.words, marks or {}
    nodes = list(tree.subtrees())
    number = {id(node): k for k, node in enumerate(nodes)}
    tags = sentence.pos_tags
    # one column per word, wide enough for the word and its tag
    x_word, right = [], float(_MARGIN)
    for word, tag in zip(words, tags):
        width = max(_text_width(word), _text_width(tag), 18.0) + 12
        x_word.append(right + width / 2)
        right += width
    top = tree.height()
    y_of = {id(node): _MARGIN + _FONT + (top - node.height()) * _ROW for node in nodes}
    y_words = _MARGIN + _FONT + top * _ROW
    x_of: dict[int, float] = {}
    for node in tree.postorder():
        xs = [x_of[id(c)] if isinstance(c, Tree) else x_word[c] for c in node.children]
        x_of[id(node)] = sum(xs) / len(xs)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="tree" width="{right + _MARGIN:.0f}" '
             f'height="{y_words + _MARGIN:.0f}" data-id="{html.escape(sentence.id)}"><style>{_STYLE}</style>']
    for node in nodes:  # lines first, so that labels are drawn over them
        disc = " disc" if node.fanout() > 1 else ""
        x1, y1 = x_of[id(node)], y_of[id(node)] + 4
        for child in node.children:
            if isinstance(child, Tree):
                x2, y2, to, kind = x_of[id(child)], y_of[id(child)] - _FONT, f"n{number[id(child)]}", "edge" + disc
            else:
                x2, y2, to, kind = x_word[child], y_words - _FONT, f"w{child}", "lexical"
            parts.append(f'<line class="{kind}" data-from="n{number[id(node)]}" data-to="{to}" '
                         f'x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"/>')
    for node in nodes:
        k, label = number[id(node)], node.label
        classes = ["node"] + (["disc"] if node.fanout() > 1 else []) + ([marks[k]] if k in marks else [])
        x, y = x_of[id(node)], y_of[id(node)]
        span = " ".join(map(str, node.leaves()))
        parts.append(f'<g class="{" ".join(classes)}" data-node="n{k}" data-label="{html.escape(label)}" '
                     f'data-span="{span}">')
        if k in marks:
            w = _text_width(label) + 8
            parts.append(f'<rect x="{x - w / 2:.1f}" y="{y - _FONT:.1f}" width="{w:.1f}" height="{_FONT + 5}" '
                         f'rx="3"/>')
        parts.append(f'<text x="{x:.1f}" y="{y:.1f}">{html.escape(label)}</text></g>')
    for i, word in enumerate(words):
        parts.append(f'<text class="word" data-index="{i}" x="{x_word[i]:.1f}" y="{y_words:.1f}">'
                     f'{html.escape(word)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def difference_marks(gold: TreebankSentence, pred: TreebankSentence, params: EvalParams | None = None, *,
                     functions: str = "remove") -> tuple[dict[int, str], dict[int, str]]:
    """The constituents of ``gold`` missing from ``pred`` and those of ``pred`` missing from
    ``gold`` (preorder node number -> :data:`GOLD_ONLY` / :data:`PRED_ONLY`), matched as
    :func:`~neurocrf.parsing.evaluate.evaluate` matches brackets (``params``: default
    ``proper.prm``)."""
    params = params if params is not None else load_params()
    keep = scored_terminals(without_function_tags(gold) if functions == "remove" else gold, params)
    spans = {side: labeled_spans(sentence.tree, keep, params, functions=functions)
             for side, sentence in (("gold", gold), ("pred", pred))}

    def unmatched(mine: list, theirs: list, kind: str) -> dict[int, str]:
        available = Counter(bracket for _, bracket in theirs)
        marks = {}
        for k, bracket in mine:
            if available[bracket]:
                available[bracket] -= 1
            else:
                marks[k] = kind
        return marks

    return (unmatched(spans["gold"], spans["pred"], GOLD_ONLY),
            unmatched(spans["pred"], spans["gold"], PRED_ONLY))


_PAGE_STYLE = """
body { font: 14px sans-serif; margin: 1.5em; color: #222; }
section { border-top: 1px solid #ddd; padding: 0.6em 0; }
h2 { font-size: 15px; margin: 0.3em 0; }
.pair { display: flex; flex-wrap: wrap; gap: 2em; align-items: flex-start; }
figure { margin: 0; overflow-x: auto; max-width: 100%; }
figcaption { font-size: 12px; color: #666; }
.legend span { display: inline-block; margin-right: 1.5em; }
.swatch { display: inline-block; width: 1.1em; height: 0.9em; vertical-align: middle; border: 1px solid;
          margin-right: 0.3em; border-radius: 3px; }
"""


def _percent(value: float, counted: bool) -> str:
    return f"{100 * value:.2f}" if counted else "-"


def trees_html(gold: Sequence[TreebankSentence], pred: Sequence[TreebankSentence] | None = None, *,
               params: EvalParams | None = None, functions: str = "remove", check_ids: bool = True,
               title: str = "Trees") -> str:
    """A self-contained HTML page: every sentence of ``gold`` with its id, drawn alone, or, with
    ``pred``, beside its predicted tree with the differences marked, a legend, and F1 / Dis-F1
    per sentence and over the page (:func:`~neurocrf.parsing.evaluate.evaluate`; paired
    sentences must agree in words and, with ``check_ids``, ids)."""
    params = params if params is not None else load_params()
    parts = [f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
             f"<style>{_PAGE_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    if pred is not None:
        total = evaluate(gold, pred, params, check_ids=check_ids, functions=functions)
        parts.append(f"<p>{len(gold)} sentences: labeled F1 {100 * total['f1']:.2f}, Dis-F1 "
                     f"{100 * total['dis_f1']:.2f} ({total['matched_brackets']} of {total['gold_brackets']} gold "
                     f"and {total['pred_brackets']} predicted constituents matched).</p>")
        swatches = [(GOLD_ONLY, "only in gold (missed)"), (PRED_ONLY, "only in the prediction (wrong)")]
        legend = "".join(f'<span><span class="swatch" style="background:{_COLOURS[kind][1]};border-color:'
                         f'{_COLOURS[kind][0]}"></span>{text}</span>' for kind, text in swatches)
    else:
        parts.append(f"<p>{len(gold)} sentences.</p>")
        legend = ""
    legend += (f'<span><span class="swatch" style="background:{_COLOURS["disc"][0]};border-color:'
               f'{_COLOURS["disc"][0]}"></span>discontinuous constituent and its branches</span>')
    parts.append(f'<p class="legend">{legend}</p>')
    for i, g in enumerate(gold):
        anchor = html.escape(g.id, quote=True)
        if pred is None:
            parts.append(f'<section id="s-{anchor}"><h2>{html.escape(g.id)} ({len(g.words)} words)</h2>'
                         f'<div class="pair"><figure>{tree_svg(g)}</figure></div></section>')
            continue
        p = pred[i]
        r = evaluate([g], [p], params, check_ids=False, functions=functions)
        gold_marks, pred_marks = difference_marks(g, p, params, functions=functions)
        scores = (f"F1 {_percent(r['f1'], bool(r['gold_brackets'] or r['pred_brackets']))}, Dis-F1 "
                  f"{_percent(r['dis_f1'], bool(r['gold_dis_brackets'] or r['pred_dis_brackets']))}")
        parts.append(f'<section id="s-{anchor}" data-f1="{r["f1"]:.6f}"><h2>{html.escape(g.id)} '
                     f'({len(g.words)} words): {scores}</h2><div class="pair">'
                     f"<figure><figcaption>gold</figcaption>{tree_svg(g, marks=gold_marks)}</figure>"
                     f"<figure><figcaption>predicted</figcaption>{tree_svg(p, marks=pred_marks)}</figure>"
                     f"</div></section>")
    parts.append("</body></html>\n")
    return "".join(parts)
