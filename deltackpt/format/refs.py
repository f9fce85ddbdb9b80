"""Ref and tag names, ref file contents and revision syntax."""

from __future__ import annotations

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


def encode_ref(version_id: str) -> bytes:
    return (version_id + "\n").encode("ascii")


def decode_ref(data: bytes, *, what: str) -> str:
    if len(data) > MAX_REF_BYTES:
        raise CorruptObjectError(f"{what}: ref file of {len(data)} bytes is too large")
    try:
        text = data.decode("ascii").strip()
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
    if not isinstance(text, str) or not text or len(text) > 256:
        raise UnknownVersionError(f"not a revision: {text!r:.80}")
    m = _REVISION.fullmatch(text.strip())
    if not m:
        raise UnknownVersionError(f"not a revision: {text!r:.80} (try 'latest', 'latest~2', a tag or an id prefix)")
    return Revision(m.group("base"), int(m.group("back") or 0))
