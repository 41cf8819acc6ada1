"""C4's line rules with the kept text as it was: only the lines the rules drop leave it.

datatrove's C4QualityFilter judges a document line by line and rebuilds it from the kept lines joined by "\n":
every paragraph break ("\n\n") became a single newline, every kept line lost its indentation, and the document
its final newline, in every document it kept. C4LineFilter makes the same decisions (the same rules, in the
same order, the same document verdicts and `line-filter-*` stats) and writes the document back from its own
text: a kept line keeps its characters and its line ending (only `remove_citations` edits inside a line), and
between two kept lines stays what was there. Where lines were dropped, the blank lines around them shrink to
the longest run of blank lines the gap had, so "A\n\nShare\n\nB" is "A\n\nB" and "A\nShare\nB" is "A\nB".

`keep_headings` (C4Config): C4 drops every line of fewer than `min_words_per_line` words, headings with them
("Fazit", "What Happened", "Zubereitung:"). With it on, such a line is kept when it starts with a letter or
digit and the next non-blank line is a sentence line the rules keep (enough words, terminal punctuation): a
heading introduces text, while menu entries and table debris ("|") stand among other short lines; interface
labels that may stand alone before text ("Share", "Log in", "Teilen": _INTERFACE_LABELS) are never headings. A
kept heading passes the other line rules (JavaScript, policy, lorem ipsum, curly bracket), and does not count
towards `min_num_sentences`.
"""

from __future__ import annotations

from datatrove.data import Document
from datatrove.pipeline.filters import C4QualityFilter
from datatrove.pipeline.filters.c4_filters import CITATION_REGEX, ELLIPSIS, END_PUNCTUATION, POLICY_SUBSTRINGS
from datatrove.utils.text import split_into_sentences

from pipelines.filters.config import C4Config

# Interface labels: short lines that stand before text as headings do, and are no headings (en, de, fr, es, pl,
# it, pt). Compared lower-cased, without trailing punctuation.
_INTERFACE_LABELS = frozenset(label.strip() for label in """
share, tweet, print, email, e-mail, log in, login, log out, sign in, sign up, register, subscribe, reply, comment,
comments, menu, search, home, back, next, previous, more, read more, like, follow, facebook, twitter, linkedin,
pinterest, whatsapp, advertisement, teilen, drucken, anmelden, abmelden, registrieren, antworten, kommentare,
kommentieren, suche, startseite, weiterlesen, mehr, zurück, weiter, werbung, anzeige, partager, imprimer, connexion,
rechercher, accueil, compartir, imprimir, buscar, inicio, udostępnij, szukaj, zaloguj, condividi, stampa, cerca,
accedi, partilhar, pesquisar, entrar""".split(","))

_KEPT = "kept"
_DROPPED = "dropped"
_BLANK = "blank"


class C4LineFilter(C4QualityFilter):
    """C4's line and document rules (datatrove's), the kept text written back with its own line breaks."""

    name = "⛰ C4 lines (text kept as it was)"

    def __init__(self, config: C4Config, exclusion_writer=None):
        super().__init__(
            exclusion_writer=exclusion_writer, remove_citations=config.remove_citations,
            filter_no_terminal_punct=config.filter_no_terminal_punct, min_num_sentences=config.min_num_sentences,
            min_words_per_line=config.min_words_per_line, max_word_length=config.max_word_length,
            filter_lorem_ipsum=config.filter_lorem_ipsum, filter_javascript=config.filter_javascript,
            filter_curly_bracket=config.filter_curly_bracket, filter_policy=config.filter_policy)
        self.keep_headings = config.keep_headings

    def filter(self, doc: Document):
        # The same line units as datatrove's str.splitlines(), each with its own line ending.
        lines = [(piece.splitlines()[0] if piece.splitlines() else "", piece) for piece in doc.text.splitlines(True)]
        texts: list[str] = []  # each line's text as it is written back (citations removed where asked)
        verdicts: list[tuple[str | None, str | None]] = []  # (line rule that drops it, content rule that would)
        for content, _ in lines:
            texts.append(CITATION_REGEX.sub("", content) if self.remove_citations else content)
            verdicts.append(self._judge(content) if content.strip() else (_BLANK, None))

        states, sentence_lines = [], []
        for i, (dropped_by, content_rule) in enumerate(verdicts):
            if dropped_by == _BLANK:
                states.append(_BLANK)
                continue
            self.stat_update("line-total")
            heading = dropped_by == "too_few_words" and self._heading(texts[i], verdicts, texts, i)
            if dropped_by is not None and not heading:
                self.stat_update(f"line-filter-{dropped_by}")
                states.append(_DROPPED)
                continue
            if content_rule in ("lorem_ipsum", "curly_bracket"):
                return False, content_rule  # drop the entire document
            if content_rule is not None:
                self.stat_update(f"line-filter-{content_rule}")
                states.append(_DROPPED)
                continue
            if heading:
                self.stat_update("line-kept-heading")
            else:
                sentence_lines.append(texts[i])
            self.stat_update("line-kept")
            states.append(_KEPT)
        if _sentences(sentence_lines, self.min_num_sentences, self.language) < self.min_num_sentences:
            return False, "too_few_sentences"
        doc.text = _rebuilt(lines, texts, states)
        return True

    def _judge(self, content: str) -> tuple[str | None, str | None]:
        """datatrove's line rules in its order: (the line rule that drops the line, or None; the content rule
        that drops it or its document, or None). Content rules are only reached by lines of enough words."""
        line = content.strip()
        words = line.split()
        if self.max_word_length != -1 and any(len(word) > self.max_word_length for word in words):
            return "too_long_word", None
        if self.remove_citations:
            line = CITATION_REGEX.sub("", line)
        if self.filter_no_terminal_punct and (not line.endswith(END_PUNCTUATION) or line.endswith(ELLIPSIS)):
            return "no_terminal_punc", None
        lowered = line.lower()
        content_rule = None
        if self.filter_lorem_ipsum and "lorem ipsum" in lowered:
            content_rule = "lorem_ipsum"
        elif self.filter_javascript and "javascript" in lowered:
            content_rule = "javascript"
        elif self.filter_curly_bracket and "{" in line:
            content_rule = "curly_bracket"
        elif self.filter_policy and any(p in lowered for p in POLICY_SUBSTRINGS):
            content_rule = "policy"
        if len(words) < self.min_words_per_line:
            return "too_few_words", content_rule
        return None, content_rule

    def _heading(self, text: str, verdicts, texts: list[str], i: int) -> bool:
        """A short line kept as a heading: it starts with a letter or digit, is no URL and no interface label,
        and the next non-blank line is a sentence line the rules keep."""
        line = text.strip()
        if not self.keep_headings or not line or not line[0].isalnum() or "://" in line:
            return False
        if line.lower().rstrip(".:!?»>›") in _INTERFACE_LABELS:
            return False
        for j in range(i + 1, len(verdicts)):
            if verdicts[j][0] == _BLANK:
                continue
            following = texts[j].strip()
            return (verdicts[j] == (None, None) and len(following.split()) >= max(self.min_words_per_line, 1)
                    and following.endswith(END_PUNCTUATION) and not following.endswith(ELLIPSIS))
        return False


def _sentences(lines: list[str], needed: int, language: str) -> int:
    """datatrove's sentence count of the kept lines (spaCy's sentencizer on each), as far as the verdict needs it:
    every line counts at least one sentence (split_into_sentences gives at least one part, even for a blank text), so
    with `needed` lines or more the count is enough without running spaCy; only a page short of lines is counted
    exactly. Counting every line was a spaCy call per line, a quarter of the web rule set's time."""
    if needed == -1 or len(lines) >= needed:
        return len(lines)
    return sum(len(split_into_sentences(line.strip(), language)) for line in lines)


def _rebuilt(lines: list[tuple[str, str]], texts: list[str], states: list[str]) -> str:
    """The kept lines with their own endings and, between them, the text that was there: as it was where
    nothing was dropped, else the gap's longest run of blank lines. A dropped line at either end takes the
    blank lines beside it too (the text ends with a line break only if it did)."""
    kept = [i for i, state in enumerate(states) if state == _KEPT]
    if not kept:
        return ""

    def gap(lo: int, hi: int) -> str:
        if _DROPPED not in states[lo:hi]:
            return "".join(piece for _, piece in lines[lo:hi])
        best: list[int] = []
        run: list[int] = []
        for j in range(lo, hi):
            run = run + [j] if states[j] == _BLANK else []
            best = run if len(run) > len(best) else best
        return "".join(lines[j][1] for j in best)

    def own(i: int) -> str:  # a kept line: its text and its own line ending
        return texts[i] + lines[i][1][len(lines[i][0]):]

    out = [gap(0, kept[0])] if _DROPPED not in states[: kept[0]] else []
    for a, b in zip(kept, kept[1:]):
        out += [own(a), gap(a + 1, b)]
    last = kept[-1]
    if _DROPPED in states[last + 1:]:
        ending = lines[last][1][len(lines[last][0]):]
        out.append(texts[last] + (ending if lines[-1][1] != lines[-1][0] else ""))
    else:
        out += [own(last), gap(last + 1, len(lines))]
    return "".join(out)
