"""The registry's table of frozen ids (deltackpt/codecs/registry.py): each id makes the codec of
that id and name, one instance per id however many threads ask at once, and unknown ids and names
are typed errors."""

from __future__ import annotations

import threading
import time

import pytest

from deltackpt.codecs import registry
from deltackpt.errors import CodecError, CorruptObjectError


def test_each_id_makes_the_codec_of_that_id_and_name():
    for encoding_id, (name, *_how) in registry._MAKERS.items():
        codec = registry.get(encoding_id)
        assert (codec.encoding_id, codec.name) == (encoding_id, name)
        assert registry.by_name(name) is codec
    assert [c.encoding_id for c in registry.all_codecs()] == list(range(12))


def test_threads_asking_at_once_get_one_instance(monkeypatch):
    """Eight threads miss the table together, each makes a codec (slowly, so that they overlap),
    and every one of them gets the instance the first one stored."""
    from deltackpt.codecs import sub_delta

    class SlowToMake(sub_delta.SubDelta):
        def __init__(self) -> None:
            time.sleep(0.05)
            super().__init__()
    monkeypatch.setattr(sub_delta, "SubDelta", SlowToMake)
    monkeypatch.setattr(registry, "_MADE", {})
    start, got = threading.Barrier(8), []

    def ask() -> None:
        start.wait(10)
        got.append(registry.get(registry.SUB_DELTA))
    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert len(got) == 8 and len({id(c) for c in got}) == 1 and isinstance(got[0], SlowToMake)


@pytest.mark.parametrize("bad", [12, 255, -1, None, "1", [1]])
def test_an_unknown_id_is_a_corrupt_object(bad):
    with pytest.raises(CorruptObjectError, match="unknown encoding id"):
        registry.get(bad)


def test_an_unknown_name_lists_the_known_ones():
    with pytest.raises(CodecError, match="unknown encoding 'lz4'; known: .*'bg-zstd'"):
        registry.by_name("lz4")
