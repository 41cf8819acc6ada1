"""pipelines/filters/url.py: the recipe's block lists and malformed URLs (the pipeline's run of it, every reason
counted: test_pipeline.py)."""

import pytest
from datatrove.data import Document

from pipelines.filters.config import UrlFilterConfig
from pipelines.filters.url import UrlBlocklistFilter, _well_formed_url
from tests.conftest import REPO

LISTS = REPO / "recipes"


@pytest.mark.parametrize("url, ok", [
    ("https://example.org/a", True), ("http://localhost:8000/", True), ("http://[::1]/", True),
    ("hard::example.com-page.html", False), ("ftp://example.org/", False), ("https://exa mple.org/", False),
    ("http://[::1/", False), ("https://intranet/", False),
])
def test_a_url_is_well_formed_with_a_web_scheme_and_a_real_host(url, ok):
    assert _well_formed_url(url) is ok


def test_urls_are_judged_on_the_recipes_lists():
    config = UrlFilterConfig(blocked_domains_files=("lists/blocked_domains.txt",), drop_missing_url=True)
    step = UrlBlocklistFilter(config, LISTS)
    blocked = next(line.strip() for line in (LISTS / "lists/blocked_domains.txt").read_text().splitlines()
                   if line.strip() and not line.startswith("#"))
    assert step.filter(Document(text="t", id="a", metadata={"url": f"https://www.{blocked}/page"})) == (False, "url_domain")
    assert step.filter(Document(text="t", id="b", metadata={"url": "https://example.org/fine"})) is True
    assert step.filter(Document(text="t", id="c", metadata={})) == (False, "url_missing")
    assert step.filter(Document(text="t", id="d", metadata={"url": "hard::x"})) == (False, "url_malformed")


def test_missing_list_file_is_named():
    with pytest.raises(ValueError, match="nope.txt"):
        UrlBlocklistFilter(UrlFilterConfig(blocked_domains_files=("lists/nope.txt",)), LISTS)
