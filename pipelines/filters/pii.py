"""PII: what the scrubber replaces with typed placeholders, and the scrubbing step.

    scrub_pii("mail jane@example.org, card 4111 1111 1111 1111")  # ("mail <EMAIL>, card <CARD_NUMBER>", counts)
    find_pii(text)   # {kind: [the strings the scrubber would replace]}: what a check on kept documents looks for

Each kind is a rule: a candidate pattern, and for kinds whose shape alone says little a check that the candidate
really is one (Luhn for card numbers, ISO 7064 mod 97 for IBANs, a JSON header with "alg" for JWTs, the invalid
SSN areas, `ipaddress` for IPv6, no "version" before an IPv4-looking string). Rules run in order, most specific
first, over the original text: a span one rule takes (or shields) is out of every later rule's reach, so a
GitHub token in a clone URL is a GITHUB_TOKEN, not the local part of an e-mail address. A candidate that fails a
shielding rule's check (an IBAN with wrong check digits, a version string) is left as it is and shielded from
the rest, and so is a lookalike that passes a keeping rule's check (an ISSN, a page range: not phone numbers). Digit runs are taken whole or not at all: the card, phone and SSN rules refuse to start or end next to
another digit group, so no rule replaces part of a longer number and leaves the rest visible.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import ipaddress
import json
import re
from dataclasses import dataclass
from typing import Callable

from datatrove.data import DocumentsPipeline
from datatrove.pipeline.base import PipelineStep

from pipelines.filters.config import PiiConfig


@dataclass(frozen=True)
class _Rule:
    group: str  # the PiiConfig switch that turns it on
    kind: str  # the placeholder: <KIND>, and the `pii_<KIND>` stat
    pattern: re.Pattern  # the span replaced is group "value" where the pattern has one, else the whole match
    check: Callable[[re.Match], bool] | None = None
    shields: bool = False  # a candidate failing `check` is still kept out of later rules' reach
    keep: bool = False  # a lookalike: a candidate passing `check` is left as it is, out of later rules' reach
    needle: str = ""  # text every match contains: a text without it skips the pattern (a substring test is cheap)


def _luhn(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = int(ch) * (2 if i % 2 else 1)
        total += d - 9 if d > 9 else d
    return total % 10 == 0


def _card(match: re.Match) -> bool:
    """13-19 digits passing Luhn, starting as payment networks' numbers do (2-6), written whole or in the
    groups cards print: 4-4-4-4(-1..4), Amex 4-6-5, Diners 4-6-4, one kind of separator. An ISBN (978-...,
    groups 3-1-2-6-1) fails the first digit and the grouping."""
    text = match.group(0)
    digits = re.sub(r"\D", "", text)
    if not 13 <= len(digits) <= 19 or digits[0] not in "23456" or len(set(re.findall(r"[ -]", text))) > 1:
        return False
    groups = [len(g) for g in re.split(r"[ -]", text)]
    grouped = (len(groups) == 1 or groups in ([4, 6, 5], [4, 6, 4])
               or (len(groups) >= 4 and all(g == 4 for g in groups[:-1]) and 1 <= groups[-1] <= 4))
    return grouped and _luhn(digits)


def _iban(match: re.Match) -> bool:
    """ISO 13616: 15-34 characters whose ISO 7064 mod-97 remainder, country and check digits moved to the end
    and letters read as 10-35, is 1."""
    compact = match.group(0).replace(" ", "")
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def _b64_json(segment: str) -> dict | None:
    try:
        value = json.loads(base64.urlsafe_b64decode(segment + "=" * (-len(segment) % 4)))
    except (binascii.Error, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    return value if isinstance(value, dict) else None


def _jwt(match: re.Match) -> bool:
    """A JSON Web Token: its header is a JSON object naming "alg", its payload a JSON object."""
    header, payload, _ = match.group(0).split(".")
    head = _b64_json(header)
    return head is not None and "alg" in head and _b64_json(payload) is not None


def _ssn(match: re.Match) -> bool:
    """A US social security number: never area 000, 666 or 900-999, group 00 or serial 0000."""
    area, group, serial = match.group(0).split("-")
    return area not in ("000", "666") and area[0] != "9" and group != "00" and serial != "0000"


_VERSION_BEFORE = re.compile(r"(?i)\b(?:version|ver|v|release|build|rev)\.?:?\s*$")
# A product or component name right before: capitalized, with a lower-case letter (an acronym such as IP or DNS is no
# product name), and not a word an address follows ("Server 10.0.0.1", "From 192.168.1.1").
_NAME_BEFORE = re.compile(r"(?<![\w.-])([A-Z][\w+-]*[a-z][\w+-]*) $")
_ADDRESS_WORDS = frozenset(
    "address addr at bind client connect connected connecting destination dns from gateway host ip listening local "
    "node peer ping proxy public private remote router server source subnet target to via".split())


def _ipv4(match: re.Match) -> bool:
    """Not a version string: "version 1.13.6.34", "v 2.0.1.3", "Python 3.10.12.1" and "Kernel 2.6.32.71" are valid
    addresses by shape, so the words before decide (dotted runs of more than four numbers never match the pattern)."""
    before = match.string[max(0, match.start() - 40):match.start()]
    if _VERSION_BEFORE.search(before[-12:]):
        return False
    name = _NAME_BEFORE.search(before)
    return name is None or name.group(1).lower() in _ADDRESS_WORDS


def _issn(match: re.Match) -> bool:
    """An ISSN's check character (ISO 3297): the first seven digits weighted 8 down to 2, plus the check (X is 10),
    make a multiple of 11."""
    digits = match.group(0).replace("-", "")
    total = sum(int(d) * w for d, w in zip(digits[:7], range(8, 1, -1)))
    check = 10 if digits[7] in "Xx" else int(digits[7])
    return (total + check) % 11 == 0


def _number_range(match: re.Match) -> bool:
    """A page or number range ("pp. 0123-4567"): two runs of equal length, the second the larger."""
    first, second = re.split(r"[-\u2013]", match.group(0))
    return len(first) == len(second) and int(first) < int(second)


def _ipv6(match: re.Match) -> bool:
    text = match.group(0)
    if sum(ch.isalnum() for ch in text) < 2:  # "::" alone is punctuation (C++ scopes), not an address
        return False
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def _phone(match: re.Match) -> bool:
    return 8 <= sum(ch.isdigit() for ch in match.group(0)) <= 15


# Most specific first: a private-key block holds base64 that later rules must not see; tokens go before the
# secret-assignment and e-mail rules (a token in "https://ghp_...@github.com" or "api_key = sk_live_..." is named
# for what it is); IBANs, cards and SSNs before the phone rule.
_OCTET = r"(?:25[0-5]|2[0-4]\d|1\d\d|[1-9]?\d)"
_RULES: tuple[_Rule, ...] = (
    _Rule("credentials", "PRIVATE_KEY", re.compile(
        r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----.*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----", re.DOTALL),
          needle="PRIVATE KEY-----"),
    _Rule("tokens", "JWT", re.compile(r"(?<![\w.-])eyJ[A-Za-z0-9_-]{6,}\.[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*(?![\w-])"),
          _jwt, needle="eyJ"),
    _Rule("tokens", "GITHUB_TOKEN", re.compile(
        r"\b(?:gh[pousr]_[A-Za-z0-9]{36}|github_pat_[A-Za-z0-9]{22}_[A-Za-z0-9]{59})\b"), needle="_"),
    _Rule("tokens", "SLACK_TOKEN", re.compile(r"\bxox[abposr]-\d{8,}(?:-[A-Za-z0-9]+){1,3}\b"), needle="xox"),
    _Rule("tokens", "GOOGLE_API_KEY", re.compile(r"\bAIza[0-9A-Za-z_-]{35}(?![\w-])"), needle="AIza"),
    _Rule("tokens", "STRIPE_KEY", re.compile(r"\b(?:sk|rk)_live_[0-9A-Za-z]{16,}\b"), needle="_live_"),
    _Rule("credentials", "AWS_ACCESS_KEY", re.compile(r"\b(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA)[0-9A-Z]{16}\b")),
    # The value of an assignment to a secret-looking name (aws_secret_access_key = ..., api_key: "..."): the
    # name stays ("api_key = <SECRET>"), only the value is sensitive.
    _Rule("credentials", "SECRET", re.compile(
        r"(?i)(?:secret|password|passwd|api[_-]?key|access[_-]?token|auth[_-]?token)[\w-]{0,24}"
        r"[\"']?\s{0,3}[:=]\s{0,3}[\"']?(?P<value>[A-Za-z0-9/+=_\-]{16,})")),
    _Rule("email", "EMAIL", re.compile(r"\b[A-Za-z0-9._%+\-]+@(?:[A-Za-z0-9\-]+\.)+[A-Za-z]{2,}\b"), needle="@"),
    # Country, check digits, then groups of four (a space between groups or none) and a shorter last group.
    _Rule("iban", "IBAN", re.compile(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,3})?\b"), _iban,
          shields=True),
    # A whole run of digits joined by single spaces or dashes: never preceded or followed by another group.
    _Rule("card", "CARD_NUMBER", re.compile(r"(?<![\w.,+/-])(?<!\d )\d(?:[ -]?\d){12,18}(?![ -]?\d)(?!\w|[.,/]\d)"),
          _card),
    _Rule("ssn", "SSN", re.compile(r"(?<![\w+-])(?<!\d )\d{3}-\d{2}-\d{4}(?![\w-])"), _ssn, shields=True, needle="-"),
    # Candidates only: validated with `ipaddress`, so clock times such as 12:30:45 stay.
    _Rule("ip", "IPV6", re.compile(
        r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?(?![\w:])"), _ipv6),
    # Four numbers, not part of a longer dotted run ("1.2.3.4.5"); a sentence's full stop may follow.
    _Rule("ip", "IPV4", re.compile(rf"(?<![\w.])(?:{_OCTET}\.){{3}}{_OCTET}(?!\w|\.\d)"), _ipv4, shields=True),
    # Lookalikes of a phone number, shielded from the phone rule and left as they are: an ISSN ("ISSN 0028-0836", its
    # check character valid) and a page or number range ("pp. 0123-4567"), each a whole run, not part of a number.
    _Rule("phone", "ISSN", re.compile(r"(?<![\w+/.-])(?<!\d )\d{4}-\d{3}[\dXx](?![\w/-])(?![ -]?\d)"), _issn,
          keep=True, needle="-"),
    _Rule("phone", "RANGE", re.compile(r"(?<![\w+/.-])(?<!\d )\d{1,6}[-\u2013]\d{1,6}(?![\w/.-])(?![ -]?\d)"),
          _number_range, keep=True),
    # Only shapes that are phone numbers and rarely anything else (8-15 digits): an international +CC number in up
    # to five groups, an (area) code, a national number with its trunk 0 and its groups ("030 / 226 343-0"), a French
    # one in five pairs, a North American 555-123-4567; groups apart by spaces, dashes or dots. Plain digit groups
    # ("120 125 130", coordinates, prices, dates such as 15.01.2024) are not phone numbers, nor is part of a longer run.
    _Rule("phone", "PHONE", re.compile(
        r"(?<![\w+/.-])(?<!\d )(?:\+\d{1,3}(?:[ .-]?\(?\d{1,5}\)?){1,5}"
        r"|\(0?\d{2,5}\)[ .-]?\d{3,4}[ .-]?\d{2,5}"
        r"|0\d{1,4}(?: ?/ ?|[ .-])\d{3,9}(?:[ .-]\d{1,5}){0,3}"
        r"|0\d(?P<pair>[ .-])\d\d(?:(?P=pair)\d\d){3}"
        r"|\d{3}(?P<na>[-.])\d{3}(?P=na)\d{4})(?![\w/-])(?!\.\d)(?! \d)"), _phone),
)


def _scan(text: str, config: PiiConfig) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every span to replace, in text order; no two overlap."""
    starts: list[int] = []  # replaced or shielded spans, sorted and disjoint: their starts and ends
    ends: list[int] = []
    found: list[tuple[int, int, str]] = []
    for rule in _RULES:
        if not getattr(config, rule.group) or rule.needle not in text:
            continue
        for match in rule.pattern.finditer(text):
            start, end = match.span("value" if "value" in rule.pattern.groupindex else 0)
            at = bisect.bisect_right(starts, start)
            if (at and ends[at - 1] > start) or (at < len(starts) and starts[at] < end):
                continue  # overlaps a span an earlier rule took
            valid = rule.check is None or rule.check(match)
            if valid or rule.shields:
                starts.insert(at, start)
                ends.insert(at, end)
            if valid and not rule.keep:
                found.append((start, end, rule.kind))
    return sorted(found)


def find_pii(text: str, config: PiiConfig = PiiConfig()) -> dict[str, list[str]]:
    """PII still present in `text`, by placeholder type (what the scrubber would replace)."""
    found: dict[str, list[str]] = {}
    for start, end, kind in _scan(text, config):
        found.setdefault(kind, []).append(text[start:end])
    return found


def scrub_pii(text: str, config: PiiConfig = PiiConfig()) -> tuple[str, dict[str, int]]:
    """`text` with PII replaced by typed placeholders (<EMAIL>, <CARD_NUMBER>, ...), and the count per type."""
    counts: dict[str, int] = {}
    pieces, at = [], 0
    for start, end, kind in _scan(text, config):
        pieces += [text[at:start], f"<{kind}>"]
        counts[kind] = counts.get(kind, 0) + 1
        at = end
    return "".join(pieces) + text[at:], counts


class PiiScrubber(PipelineStep):
    """Replaces PII with typed placeholders; stats count `pii_<TYPE>` and `documents_scrubbed`."""

    name = "🕵️ PII scrubber"
    type = "✂️ - FORMAT"

    def __init__(self, config: PiiConfig):
        super().__init__()
        self.config = config

    def run(self, data: DocumentsPipeline, rank: int = 0, world_size: int = 1) -> DocumentsPipeline:
        for doc in data:
            with self.track_time():
                doc.text, counts = scrub_pii(doc.text, self.config)
            if counts:
                self.stat_update("documents_scrubbed")
                for kind, n in counts.items():
                    self.stat_update(f"pii_{kind}", value=n)
            yield doc
