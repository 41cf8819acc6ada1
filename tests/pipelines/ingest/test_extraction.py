"""Payload bytes -> text: content types, markup sniffing, charset decoding on real pages, the extraction deadline."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from pipelines.ingest.extraction import (
    ExtractionTimeout,
    decode_text,
    deadline,
    extract_main_text,
    looks_like_markup,
    parse_content_type,
)
from pipelines.ingest.warc import WarcEntry, read_warc

CRAWL = Path(__file__).resolve().parents[4] / "shared" / "data" / "crawl"


def first_pages(file_name: str, count: int) -> list[WarcEntry]:
    pages = []
    for entry in read_warc(CRAWL / file_name, max_payload_bytes=8 << 20):
        if isinstance(entry, WarcEntry) and entry.rec_type == "response" and entry.payload:
            pages.append(entry)
            if len(pages) == count:
                break
    return pages


@pytest.fixture(scope="module")
def euc_jp_page() -> bytes:
    """A real Japanese page, EUC-JP (declared by its HTTP header and by a <meta> tag)."""
    (entry,) = first_pages("resiliparse_clueweb09-ja_excerpt.warc.gz", 1)
    assert parse_content_type(entry.content_type) == ("text/html", "euc-jp")
    return entry.payload


def test_content_type_and_charset_are_parsed():
    assert parse_content_type("text/html; charset=ISO-8859-1") == ("text/html", "iso-8859-1")
    assert parse_content_type('Text/HTML;Charset="EUC-JP"') == ("text/html", "euc-jp")
    assert parse_content_type("application/xhtml+xml") == ("application/xhtml+xml", None)
    assert parse_content_type(None) == ("", None) and parse_content_type("") == ("", None)


def test_markup_is_sniffed_past_a_bom_and_blank_space():
    assert looks_like_markup(b"\xef\xbb\xbf \r\n<!DOCTYPE html><html>")
    assert looks_like_markup(b"<p>hi</p>")
    assert not looks_like_markup(b"{}") and not looks_like_markup(b"plain text <b>later</b>")


def test_the_declared_charset_is_used(euc_jp_page):
    text, why = decode_text(euc_jp_page, "euc-jp", html=True)
    assert text == euc_jp_page.decode("euc_jp") and why == ""
    assert any("\u3040" <= ch <= "\u30ff" for ch in text)


def test_a_wrongly_declared_charset_falls_back_to_the_meta_tag(euc_jp_page):
    text, _ = decode_text(euc_jp_page, "utf-8", html=True)
    assert text == euc_jp_page.decode("euc_jp")


def test_a_wrongly_declared_charset_without_meta_falls_back_to_the_detector(euc_jp_page):
    # html=False: no <meta> is looked at, so only cchardet's guess can rescue it; an unknown label is no help.
    assert decode_text(euc_jp_page, "utf-8", html=False)[0] == euc_jp_page.decode("euc_jp")
    assert decode_text(euc_jp_page, "no-such-charset", html=False)[0] == euc_jp_page.decode("euc_jp")


def test_latin1_labels_decode_as_browsers_do():
    # ISO-8859-1 declared, Windows-1252 meant: 0x93/0x94 are curly quotes, not C1 controls.
    text, _ = decode_text(b"\x93quoted\x94 caf\xe9", "iso-8859-1", html=False)
    assert text == "\u201cquoted\u201d caf\u00e9"


def test_a_bom_decides():
    assert decode_text("caf\u00e9 \u3042".encode("utf-16"), "iso-8859-1", html=False)[0] == "caf\u00e9 \u3042"
    assert decode_text(b"\xef\xbb\xbfplain", None, html=False)[0] == "plain"  # the "why" matters only on None
    assert decode_text(b"\xfe\xff\xd8", None, html=False) == (None, "invalid utf-16-be after its BOM")


def test_binary_is_undecodable_and_stray_nuls_are_dropped():
    text, why = decode_text(bytes(range(256)) * 64, "utf-8", html=False)
    assert text is None and "bytes invalid as UTF-8" in why and "declared: utf-8" in why
    page = ("word " * 2000).encode() + b"\x00"
    assert decode_text(page, None, html=False)[0] == "word " * 2000


def test_the_deadline_interrupts_and_restores_the_previous_handler():
    before = signal.getsignal(signal.SIGALRM)
    start = time.perf_counter()
    with pytest.raises(ExtractionTimeout) as info:
        with deadline(0.05):
            while True:
                pass
    assert info.value.seconds == 0.05 and time.perf_counter() - start < 5
    assert signal.getsignal(signal.SIGALRM) == before
    with deadline(5):  # finishing in time disarms it
        pass
    time.sleep(0.01)


def test_the_deadline_is_not_caught_by_except_exception():
    with pytest.raises(ExtractionTimeout):
        with deadline(0.02):
            try:
                while True:
                    pass
            except Exception:  # what trafilatura does around its parsing steps
                pytest.fail("the timeout was caught as an Exception")


def test_a_pathological_page_hits_the_extraction_deadline(monkeypatch):
    monkeypatch.setattr("pipelines.ingest.extraction.EXTRACT_TIMEOUT_S", 0.01)
    paragraphs = "".join(f"<div><p>Paragraph {i} of a page that goes on and on and on.</p>" for i in range(20_000))
    with pytest.raises(ExtractionTimeout) as info:
        extract_main_text(f"<html><body>{paragraphs}{'</div>' * 20_000}</body></html>")
    assert info.value.seconds == 0.01


def test_extraction_does_not_depend_on_pages_seen_before():
    pages = [p.payload.decode("utf-8", errors="replace") for p in first_pages("web-pages.warc.gz", 2)]
    first = extract_main_text(pages[0])
    assert first and "<html" not in first.lower()
    extract_main_text(pages[1])
    assert extract_main_text(pages[0]) == first
