"""Payload bytes -> document text: content types, markup sniffing, charset decoding, and HTML main-text
extraction (trafilatura) under a deadline.

    mime, charset = parse_content_type("text/html; charset=EUC-JP")   # ("text/html", "euc-jp")
    text, why = decode_text(payload, charset, html=True)                # (None, why) when undecodable
    main = extract_main_text(text)                                      # may raise ExtractionTimeout

Runs inside ingest's datatrove tasks, several pages after one another in a process, so it holds no state between
pages (see extract_main_text).
"""

from __future__ import annotations

import re
import signal
import threading

EXTRACT_TIMEOUT_S = 30  # a pathological page must not hang the stage; generous, so it never depends on load

HTML_TYPES = ("text/html", "application/xhtml+xml")
PLAIN_TYPES = ("text/plain",)

# WHATWG-style label fixes: what browsers decode these declared charsets as (supersets of the labels).
_CHARSET_ALIASES = {
    "iso-8859-1": "cp1252", "iso8859-1": "cp1252", "latin1": "cp1252", "latin-1": "cp1252", "us-ascii": "cp1252",
    "ascii": "cp1252", "gb2312": "gb18030", "gbk": "gb18030", "x-gbk": "gb18030", "shift_jis": "cp932",
    "shift-jis": "cp932", "sjis": "cp932", "x-sjis": "cp932", "euc-kr": "cp949", "ks_c_5601-1987": "cp949",
    "tis-620": "cp874", "iso-8859-9": "cp1254", "iso-8859-11": "cp874",
}
_META_CHARSET = re.compile(rb"""<meta[^>]{0,200}?charset\s*=\s*["']?\s*([a-zA-Z0-9_:.+-]{1,40})""", re.I)
_MAX_REPLACED = 0.001  # a UTF-8 text with at most this fraction of stray bytes is kept, those bytes as U+FFFD
_MAX_NULS = 0.001  # more NULs than this fraction of the characters: binary data, not text
_BOMS = ((b"\xef\xbb\xbf", "utf-8"), (b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


# ---------------------------------------------------------------------------------------------------------------
# What a payload is


def parse_content_type(value: str | None) -> tuple[str, str | None]:
    """'text/html; charset=ISO-8859-1' -> ('text/html', 'iso-8859-1')."""
    if not value:
        return "", None
    mime, _, params = value.partition(";")
    match = re.search(r"charset\s*=\s*[\"']?([^\"';\s]+)", params, re.I)
    return mime.strip().lower(), (match.group(1).lower() if match else None)


def looks_like_markup(payload: bytes) -> bool:
    """Whether a payload without a Content-Type starts like HTML/XML (after a BOM and blank space)."""
    head = payload[:256].lstrip(b"\xef\xbb\xbf \t\r\n\x0c").lower()
    return head.startswith(b"<")


# ---------------------------------------------------------------------------------------------------------------
# Bytes -> text


def decode_text(data: bytes, declared: str | None, *, html: bool) -> tuple[str | None, str]:
    """Bytes -> text, or (None, why). In order: a BOM; UTF-8 (valid UTF-8 is very rarely anything else); the
    charset declared by HTTP, then by <meta>; cchardet's guess; UTF-8 with a few stray bytes replaced. A candidate
    counts only if it decodes strictly and is not binary (see _without_stray_nuls)."""
    for bom, codec in _BOMS:
        if data.startswith(bom):
            return _try(data[len(bom) :], codec), f"invalid {codec} after its BOM"
    candidates = ["utf-8"]
    if declared:
        candidates.append(declared)
    if html and (match := _META_CHARSET.search(data[:4096])):
        candidates.append(match.group(1).decode("ascii").lower())
    for charset in candidates:
        if (text := _try(data, _CHARSET_ALIASES.get(charset, charset))) is not None:
            return text, ""
    import cchardet

    guess = (cchardet.detect(data) or {}).get("encoding")
    if guess and (text := _try(data, _CHARSET_ALIASES.get(guess.lower(), guess))) is not None:
        return text, ""
    text = data.decode("utf-8", errors="replace")
    replaced = text.count("\ufffd")
    if replaced <= _MAX_REPLACED * len(text) and (kept := _without_stray_nuls(text)) is not None:
        return kept, ""
    declared_all = ", ".join(dict.fromkeys(candidates[1:])) or "none"
    return None, f"{replaced}/{len(data)} bytes invalid as UTF-8; declared: {declared_all}; detector guessed: {guess}"


def _try(data: bytes, codec: str) -> str | None:
    try:
        text = data.decode(codec)
    except (UnicodeDecodeError, LookupError):
        return None
    return _without_stray_nuls(text)


def _without_stray_nuls(text: str) -> str | None:
    """None for binary-looking text (NULs above _MAX_NULS, e.g. UTF-16 read as UTF-8); else the text without its
    NULs (real pages have a few, and lxml refuses any)."""
    nuls = text.count("\x00")
    if not nuls:
        return text
    return None if nuls > _MAX_NULS * len(text) else text.replace("\x00", "")


# ---------------------------------------------------------------------------------------------------------------
# HTML -> main text


class ExtractionTimeout(BaseException):
    """A page took longer than its deadline. BaseException, so that no `except Exception` inside trafilatura
    swallows it."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


def extract_main_text(html: str) -> str | None:
    """Main text as datatrove's Trafilatura() extractor gets it (same call, same options); None when there is
    none. Raises ExtractionTimeout after EXTRACT_TIMEOUT_S (in a main thread; elsewhere there is no deadline)."""
    from trafilatura import extract
    from trafilatura.deduplication import LRU_TEST

    # deduplicate=True drops text segments seen several times before, in a cache global to the process; cleared
    # per page so a page's text never depends on which pages this process handled before (any task or worker count).
    LRU_TEST.clear()
    with deadline(EXTRACT_TIMEOUT_S):
        return extract(html, favor_precision=True, include_comments=False, deduplicate=True)


class deadline:
    """SIGALRM after `seconds`, raised as ExtractionTimeout; only where signals can be used (a main thread)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        self.armed = hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()

    def __enter__(self):
        if self.armed:
            self.previous = signal.signal(signal.SIGALRM, self._expire)
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc):
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)
        return False

    def _expire(self, signum, frame):
        raise ExtractionTimeout(self.seconds)
