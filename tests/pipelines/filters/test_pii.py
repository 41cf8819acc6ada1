"""PII scrubbing in real text: every kind replaced by its placeholder and counted, lookalikes left as they were.

The valid examples are public test values whose checks hold by their own definitions (card networks' test numbers,
the IBAN standard's examples, jwt.io's token); the invalid ones are those with one digit changed, worked by hand
in the comments, never by the code under test.
"""

import gzip
import json
import re

import pydantic
import pytest

from pipelines.filters.config import FilterConfig, PiiConfig
from pipelines.filters.pii import find_pii, scrub_pii


PLANTED = {
    "EMAIL": "jane.doe@example.org",
    "IPV4": "192.168.17.4",
    "IPV6": "2001:db8:85a3::8a2e:370:7334",
    "PHONE": "+1 (555) 123-4567",
    "AWS_ACCESS_KEY": "AKIAIOSFODNN7EXAMPLE",
    "PRIVATE_KEY": "-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA0Z3VS5JJcds3xfn\n-----END RSA PRIVATE KEY-----",
}

# A fine-grained token's shape: github_pat_, 22 characters, _, 59 characters.
GITHUB_PAT = "github_pat_11ABCDEFG0abcdefghijkl_" + "a1B2c3D4e5F6g7H8i9J0" * 2 + "kLmNoPqRsTuVwXyZ123"
assert len(GITHUB_PAT) == len("github_pat_") + 22 + 1 + 59
# Each kind in the sentence a page would hold it in: (placeholder, the value, the sentence).
NEW_KINDS = [
    # Visa's and Mastercard's test numbers pass Luhn (4111...: 4x1 doubled digits 2+2+2+(8) ... sum 30);
    # American Express's 378282246310005 in its printed 4-6-5 groups, and the same number unspaced.
    ("CARD_NUMBER", "4111 1111 1111 1111", "Charge it to card 4111 1111 1111 1111 before Friday."),
    ("CARD_NUMBER", "5555-5555-5555-4444", "The backup card is 5555-5555-5555-4444, expiring soon."),
    ("CARD_NUMBER", "3782 822463 10005", "Amex 3782 822463 10005 was declined."),
    ("CARD_NUMBER", "4242424242424242", "Stripe's test card 4242424242424242 always succeeds."),
    # The IBAN registry's own examples (ISO 13616), printed in groups of four and unspaced.
    ("IBAN", "GB82 WEST 1234 5698 7654 32", "Pay into GB82 WEST 1234 5698 7654 32 by transfer."),
    ("IBAN", "DE89 3704 0044 0532 0130 00", "Überweisung an DE89 3704 0044 0532 0130 00 bitte."),
    ("IBAN", "NL91ABNA0417164300", "Rekening NL91ABNA0417164300 staat op naam."),
    # jwt.io's example token: header {"alg":"HS256","typ":"JWT"}.
    ("JWT", "eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIiwibmFtZSI6IkpvaG4gRG9lIiwiaWF0IjoxNTE2"
     "MjM5MDIyfQ.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "Authorization: Bearer {}"),
    ("GITHUB_TOKEN", "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", "export GH_TOKEN={}"),
    ("GITHUB_TOKEN", "ghs_16C7e42F292c6912E7710c838347Ae178B4a", "git clone https://{}@github.com/acme/app.git"),
    ("GITHUB_TOKEN", GITHUB_PAT, "Use the fine-grained token {} for the bot."),
    ("SLACK_TOKEN", "xoxb-2048123456-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx", "SLACK_BOT={} in the env file."),
    ("GOOGLE_API_KEY", "AIzaSyDaGmWKa4JsXZ-HjGw7ISLn_3namBGewQe", "maps.js?key={}&callback=init"),
    ("STRIPE_KEY", "sk_live_4eC39HqLyjWDarjtT1zdp7dc", "stripe.api_key = '{}'"),
    ("SSN", "078-05-1120", "His social security number, 078-05-1120, was printed on the card."),
]

LOOKALIKES = [
    "The ISBN is 978-3-16-148410-0 in the second edition.",
    "Upgrade to version 1.13.6.34 before running it.",
    "Released as v2.0.1.3 and v. 2.0.1.4 last spring; build 10.0.19041.1 followed.",
    "Firmware 1.2.3.4.5 shipped on 2024-01-15 and again on 15.01.2024.",
    "sha1 da39a3ee5e6b4b0d3255bfef95601890afd80709 and sha256 "
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 match.",
    # 4111 1111 1111 1111 sums to 30 under Luhn; the last digit one more makes 31: not a card.
    "Reference 4111 1111 1111 1112 is an order number.",
    "Order 4111111111111112 shipped.",
    # GB82 is the valid check pair for this account; GB83 is one off, so mod 97 gives 2, not 1.
    "Wrong account GB83 WEST 1234 5698 7654 32 was refused.",
    "Falsche IBAN DE88 3704 0044 0532 0130 00 abgelehnt.",
    "Invalid SSNs: 000-12-3456, 666-12-3456, 912-34-5678, 123-00-4567 and 123-45-0000.",
    "A 20-digit tracking code 4111 1111 1111 1111 2222 is no card.",
    "Doors open 12:30:45, std::vector costs 3.14 EUR, version 1.2.3, items 120 125 130, coords 53.369889",
    # Nature's ISSN (check: 0·8 + 0·7 + 2·6 + 8·5 + 0·4 + 8·3 + 3·2 = 82, and 82 + 6 = 88 = 8 · 11) and a page range:
    # 8 digits with a trunk 0, so the phone rule took both.
    "Nature (ISSN 0028-0836) printed it on pp. 0123-4567 of the volume.",
    # Dotted versions after a product or component name, four numbers like an address.
    "Python 3.10.12.1 and Kernel 2.6.32.71 fixed it; Chrome 120.0.6099.109 too.",
    "Dates written 15.01.2024 and 01.12.2024, pi 3.14159, a ratio 0.1234, a range 100-200.",
]


def wikitext_paragraph(shared_data) -> str:
    lines = (shared_data / "wiki" / "wikitext-2-valid.txt").read_text(encoding="utf-8").splitlines()
    return next(line.strip() for line in lines if len(line.split()) > 80)


def c4_text(shared_data) -> str:
    with gzip.open(shared_data / "jsonl" / "olmo_c4-sample.01.json.gz", "rt") as f:
        return json.loads(f.readline())["text"]


def test_planted_pii_is_replaced_by_typed_placeholders_and_counted(shared_data):
    doc = c4_text(shared_data)
    assert find_pii(doc) == {}
    planted = doc + "\n" + "\n".join(f"{kind.lower()}: {value}" for kind, value in PLANTED.items())
    planted += "\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n"
    scrubbed, counts = scrub_pii(planted)
    assert counts == {**{kind: 1 for kind in PLANTED}, "SECRET": 1}
    for kind, value in PLANTED.items():
        assert value not in scrubbed and f"{kind.lower()}: <{kind}>" in scrubbed
    assert "aws_secret_access_key = <SECRET>" in scrubbed
    assert scrubbed.startswith(doc)  # the real text around the PII is untouched
    assert find_pii(scrubbed) == {}


def test_every_new_kind_is_replaced_whole_in_real_text(shared_data):
    paragraph = wikitext_paragraph(shared_data)
    assert find_pii(paragraph) == {}
    sentences = [sentence.format(value) if "{}" in sentence else sentence for _, value, sentence in NEW_KINDS]
    text = paragraph + "\n\n" + "\n".join(sentences) + "\n"
    scrubbed, counts = scrub_pii(text)

    expected = paragraph + "\n\n" + "\n".join(
        (sentence.format(f"<{kind}>") if "{}" in sentence else sentence.replace(value, f"<{kind}>"))
        for kind, value, sentence in NEW_KINDS) + "\n"
    assert scrubbed == expected
    want: dict[str, int] = {}
    for kind, _, _ in NEW_KINDS:
        want[kind] = want.get(kind, 0) + 1
    assert counts == want
    assert find_pii(scrubbed) == {}
    # No digit of a card number or an account is left in its sentence.
    for kind, value, sentence in NEW_KINDS:
        if kind in ("CARD_NUMBER", "IBAN"):
            line = sentence.replace(value, f"<{kind}>")
            assert line in scrubbed.splitlines() and not re.search(r"\d", line), line


def test_a_token_in_a_clone_url_is_named_for_what_it_is():
    url = "https://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@github.com/acme/app.git"
    assert scrub_pii(url) == ("https://<GITHUB_TOKEN>@github.com/acme/app.git", {"GITHUB_TOKEN": 1})


@pytest.mark.parametrize("text", LOOKALIKES)
def test_lookalikes_are_left_exactly_as_they_were(shared_data, text):
    doc = wikitext_paragraph(shared_data) + "\n" + text
    assert scrub_pii(doc) == (doc, {})
    assert find_pii(doc) == {}


def test_an_address_ending_a_sentence_is_still_an_address():
    assert scrub_pii("The server is at 10.0.0.1. It answers pings.") == (
        "The server is at <IPV4>. It answers pings.", {"IPV4": 1})


def test_no_rule_replaces_part_of_a_longer_digit_run():
    # The phone rule used to take "0044 0532 0130" out of the IBAN and "+1 555 ..." shapes out of longer runs.
    for text in ("DE88 3704 0044 0532 0130 00", "0123 4567 8901 2345", "+49 30 1234 5678 9012 3456 78",
                 "4111 1111 1111 1111 2222"):
        assert scrub_pii(text) == (text, {}), text
    # A real page's number (C4 sample) in five groups after the country code: taken whole, the last "75" too.
    assert scrub_pii("Tel: +32 (0)2 790 75 75 Fax") == ("Tel: <PHONE> Fax", {"PHONE": 1})


def test_phone_numbers_of_real_pages_are_taken_whole():
    """Numbers as the demo's web pages (crawl/web-pages.warc.gz) write them: the phone rule took the first
    groups of the German ones and left the last visible, and the Japanese one looked like an SSN."""
    text = ("Tel: 069 / 920 77 00, Fax: 069/297 89 22 Mail. Tel. 030/226 343-0, Kontakt 030 5683 8000 60. "
            "Dietsch (089/99529727) gerne. Hokkaido 094-0011 Japan +81 158-23-2012.")
    expected = ("Tel: <PHONE>, Fax: <PHONE> Mail. Tel. <PHONE>, Kontakt <PHONE>. "
                "Dietsch (<PHONE>) gerne. Hokkaido 094-0011 Japan <PHONE>.")
    assert scrub_pii(text) == (expected, {"PHONE": 6})


def test_phone_numbers_in_every_common_written_form_are_scrubbed():
    """Spaces, dashes, dots, parentheses and a leading +country code; the dotted forms went through before."""
    numbers = ["030 226 343 0", "030-2263430", "030.226.34.30", "01.23.45.67.89", "01 23 45 67 89", "(030) 226.3430",
               "+49 30 2263430", "+49-30-2263430", "+49.30.2263430", "+33 1 23 45 67 89", "555.123.4567",
               "555-123-4567", "+1 (555) 123-4567"]
    text = " and ".join(f"call {n}" for n in numbers) + "."
    assert scrub_pii(text) == (" and ".join("call <PHONE>" for _ in numbers) + ".", {"PHONE": len(numbers)})
    # An address after a word an address follows stays an address, at a sentence's start too.
    assert scrub_pii("Server 10.0.0.1 answers. From 192.168.1.1 it came.") == (
        "Server <IPV4> answers. From <IPV4> it came.", {"IPV4": 2})


def test_a_switched_off_group_is_left_whole_and_no_other_rule_takes_part_of_it():
    text = "card 4111 1111 1111 1111, account DE89 3704 0044 0532 0130 00, ssn 078-05-1120, token " \
           "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"
    off = PiiConfig(card=False, iban=False, ssn=False, tokens=False)
    assert scrub_pii(text, off) == (text, {})
    assert scrub_pii(text, PiiConfig(card=False)) == (
        "card 4111 1111 1111 1111, account <IBAN>, ssn <SSN>, token <GITHUB_TOKEN>",
        {"IBAN": 1, "SSN": 1, "GITHUB_TOKEN": 1})


def test_the_new_switches_are_on_by_default_and_a_misspelt_one_is_refused():
    assert all(getattr(PiiConfig(), name) for name in ("tokens", "card", "iban", "ssn"))
    adapter = pydantic.TypeAdapter(FilterConfig)
    assert adapter.validate_python({"pii": {"iban": False}}).pii == PiiConfig(iban=False)
    with pytest.raises(pydantic.ValidationError, match=r"pii\.cards\n  Unexpected keyword argument"):
        adapter.validate_python({"pii": {"cards": False}})
