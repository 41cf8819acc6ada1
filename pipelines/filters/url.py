"""The URL step: datatrove's URL filter on the recipe's own block lists (domains, words, subwords), plus our rules
for a missing or malformed URL."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from datatrove.data import Document
from datatrove.pipeline.filters import URLFilter

from pipelines.filters.config import UrlFilterConfig

class UrlBlocklistFilter(URLFilter):
    """datatrove's URL filter on the recipe's own lists (its built-in lists are not used), plus malformed URLs."""

    name = "😈 URL blocklist"

    def __init__(self, config: UrlFilterConfig, lists_root: Path, exclusion_writer=None):
        super().__init__(
            extra_domains=_read_list_files(config.blocked_domains_files, lists_root),
            banned_words=_read_list_files(config.blocked_words_files, lists_root),
            banned_subwords=_read_list_files(config.blocked_subwords_files, lists_root),
            use_integrated_lists=False,
            exclusion_writer=exclusion_writer,
        )
        self.drop_missing_url = config.drop_missing_url
        # tldextract would fetch the public-suffix list over the network: use the snapshot it ships.
        from tldextract import TLDExtract

        self.tldextractor = TLDExtract(suffix_list_urls=(), cache_dir=None)

    def filter(self, doc: Document):
        url = doc.metadata.get("url")
        if not url:
            return (False, "url_missing") if self.drop_missing_url else True
        if not _well_formed_url(url):
            return False, "url_malformed"
        verdict = super().filter(doc)
        if verdict is True:
            return True
        return False, f"url_{verdict[1]}"


def _well_formed_url(url: str) -> bool:
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # e.g. an unbalanced IPv6 bracket
        return False
    if parts.scheme not in ("http", "https") or not host or any(ch.isspace() for ch in url):
        return False
    return "." in host or host == "localhost" or ":" in host


def _read_list_files(names: tuple[str, ...], root: Path) -> list[str]:
    entries: list[str] = []
    for name in names:
        path = (root / name).resolve()
        if not path.is_file():
            raise ValueError(f"filter.url: list file {name!r} not found (looked for {path})")
        entries += [line.strip() for line in path.read_text().splitlines() if line.strip() and not line.startswith("#")]
    return entries
