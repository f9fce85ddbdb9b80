"""msgpack with the limits every reader applies to untrusted bytes."""

from __future__ import annotations

from typing import Any, Callable

import msgpack

from ..errors import CorruptObjectError


def pack(value: Any) -> bytes:
    """Serialize with bin/str kept apart (bytes stay bytes, str stays str)."""
    return msgpack.packb(value, use_bin_type=True, strict_types=False)


def unpack(data: bytes | memoryview, *, what: str, max_bytes: int,
           ext_hook: Callable[[int, bytes], Any] | None = None) -> Any:
    """Deserialize untrusted msgpack: bounded sizes, no unknown ext types, no trailing bytes."""
    if len(data) > max_bytes:
        raise CorruptObjectError(f"{what}: {len(data)} bytes exceeds the limit of {max_bytes}")
    kwargs: dict[str, Any] = dict(
        raw=False,
        strict_map_key=False,
        use_list=True,
        max_bin_len=len(data),
        max_str_len=len(data),
        max_array_len=len(data),
        max_map_len=len(data),
        max_ext_len=len(data),
    )
    if ext_hook is not None:
        kwargs["ext_hook"] = ext_hook
    try:
        return msgpack.unpackb(data, **kwargs)
    except CorruptObjectError:
        raise
    except (ValueError, TypeError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError,
            msgpack.OutOfData, RecursionError, OverflowError) as exc:
        raise CorruptObjectError(f"{what}: undecodable msgpack ({type(exc).__name__}: {exc})") from None


def expect(cond: bool, what: str, detail: str) -> None:
    """Raise CorruptObjectError unless ``cond`` holds."""
    if not cond:
        raise CorruptObjectError(f"{what}: {detail}")


def expect_int(value: Any, what: str, lo: int = 0, hi: int = 1 << 64) -> int:
    """A schema check for an integer field in [lo, hi]."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        raise CorruptObjectError(f"{what}: expected an integer in [{lo}, {hi}], got {value!r:.80}")
    return value
