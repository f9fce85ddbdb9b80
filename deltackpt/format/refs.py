"""Ref and tag names, ref file contents and revision syntax."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from ..errors import CorruptObjectError, InvalidNameError, UnknownVersionError
from .ids import ID_HEX_LEN, is_hex_prefix
from .limits import MAX_NAME_LENGTH, MAX_REF_BYTES

LATEST = "latest"
# always fullmatch: '$' would also match before a final newline ("v1\n" was a valid tag name), and
# \d would take any Unicode digit
_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]*")
_REVISION = re.compile(r"(?P<base>[^~]+?)(?:~(?P<back>[0-9]{1,6}))?")
RESERVED = {LATEST, "HEAD"}
_ID_LIKE = re.compile(r"[0-9a-f]{4,32}")
# what "whitespace" means around ref contents and revisions: the six ASCII characters every
# language agrees on (Python's str.strip would also take \x1c-\x1f and Unicode spaces)
WHITESPACE = " \t\n\r\x0b\x0c"
MAX_REVISION_LENGTH = 256


def check_name(name: object, *, kind: str = "tag") -> str:
    """A ref/tag name: 1..128 of [A-Za-z0-9._-], not starting with '.' or '-', no '..'; a tag
    may not be 4-32 lowercase hex digits (it would shadow version id prefixes)."""
    if not isinstance(name, str) or not 0 < len(name) <= MAX_NAME_LENGTH or not _NAME.fullmatch(name) or ".." in name:
        raise InvalidNameError(f"invalid {kind} name {name!r:.80}: use 1-{MAX_NAME_LENGTH} of A-Z a-z 0-9 . _ -, "
                               "not starting with '.' or '-'")
    if name.endswith((".tmp", ".lock")):
        raise InvalidNameError(f"invalid {kind} name {name!r}: the suffixes .tmp and .lock are reserved")
    if kind == "tag" and (name in RESERVED or name.startswith("best")):
        raise InvalidNameError(f"invalid tag name {name!r}: reserved")
    if kind == "tag" and _ID_LIKE.fullmatch(name):
        raise InvalidNameError(f"invalid tag name {name!r}: 4 or more hex digits would shadow version ids")
    return name


def is_tag_name(name: str) -> bool:
    """Whether ``name`` may name a tag.  Never true for 4-32 lowercase hex digits, so a revision
    that looks like a version id prefix always means one: no file under refs/tags/ can shadow it."""
    try:
        check_name(name)
    except InvalidNameError:
        return False
    return True


def encode_ref(version_id: str) -> bytes:
    return (version_id + "\n").encode("ascii")


def decode_ref(data: bytes, *, what: str) -> str:
    if len(data) > MAX_REF_BYTES:
        raise CorruptObjectError(f"{what}: ref file of {len(data)} bytes is too large")
    try:
        text = data.decode("ascii").strip(WHITESPACE)
    except UnicodeDecodeError:
        raise CorruptObjectError(f"{what}: ref is not ASCII") from None
    if len(text) != ID_HEX_LEN or not is_hex_prefix(text):
        raise CorruptObjectError(f"{what}: ref does not hold a version id")
    return text


@dataclass(frozen=True)
class Revision:
    """A parsed revision: ``base`` (latest, a tag, an id or id prefix, ``best:metric[:max]``) and
    ``back`` steps along first parents (``latest~3``)."""

    base: str
    back: int = 0


def parse_revision(text: object) -> Revision:
    """``BASE[~N]`` after stripping surrounding whitespace; at most 256 characters once stripped."""
    if not isinstance(text, str):
        raise UnknownVersionError(f"not a revision: {text!r:.80}")
    stripped = text.strip(WHITESPACE)
    if not stripped or len(stripped) > MAX_REVISION_LENGTH:
        raise UnknownVersionError(f"not a revision: {text!r:.80} (1-{MAX_REVISION_LENGTH} characters)")
    m = _REVISION.fullmatch(stripped)
    if not m:
        raise UnknownVersionError(f"not a revision: {text!r:.80} (try 'latest', 'latest~2', a tag or an id prefix)")
    return Revision(m.group("base"), int(m.group("back") or 0))


def did_you_mean(word: str, names: list[str], spell: str = "{}") -> str:
    """``"; did you mean 'latest'?"``: the names closest to a misspelt ``word`` (difflib's ratio,
    else a match ignoring case), each written as ``spell.format(name)``; empty when none is close."""
    close = difflib.get_close_matches(word, names, n=3, cutoff=0.6) or [n for n in names if n.lower() == word.lower()]
    return f"; did you mean {' or '.join(repr(spell.format(c)) for c in close)}?" if close else ""


def parse_best(base: str) -> tuple[str, str]:
    """``best:METRIC[:min|:max]`` -> (metric, "min" | "max").  Only a final ``:min`` or ``:max`` is
    the direction; everything between ``best:`` and it is the metric name, colons included
    (``best:val:acc:max`` is metric ``val:acc``; a metric named ``x:max`` is ``best:x:max:min``)."""
    if not base.startswith("best:"):
        raise UnknownVersionError(f"{base!r:.80}: not a best: revision")
    metric, direction = base[len("best:"):], "min"
    for suffix in (":min", ":max"):
        if metric.endswith(suffix):
            metric, direction = metric[:-len(suffix)], suffix[1:]
            break
    if not metric:
        raise UnknownVersionError(f"{base!r:.80}: use best:METRIC, best:METRIC:min or best:METRIC:max")
    return metric, direction
