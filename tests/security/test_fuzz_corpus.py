"""Replay every fuzz target's seed corpus, plus deterministic mutations of each seed, through the
target's TestOneInput in plain pytest, so CI exercises the decoders' contract without atheris:
only DeltackptError subclasses escape (anything else fails the test)."""

from __future__ import annotations

import random

import pytest

from deltackpt.format import config, index, manifest, pack

from ._fuzz_targets import TARGETS, corpus, target

MUTATIONS = 6  # per seed


def _mutants(data: bytes, rnd: random.Random) -> list[bytes]:
    out = []
    for _ in range(MUTATIONS):
        b = bytearray(data)
        op = rnd.randrange(6)
        if op == 0 and b:  # bit flips
            for _ in range(rnd.randint(1, 4)):
                i = rnd.randrange(len(b))
                b[i] ^= 1 << rnd.randrange(8)
        elif op == 1 and b:  # truncation
            del b[rnd.randrange(len(b)):]
        elif op == 2 and len(b) > 1:  # byte-sized values set to extremes
            i = rnd.randrange(1, len(b))
            b[i] = rnd.choice((0x00, 0x7F, 0x80, 0xFF, 0xCF, 0xDD, 0xC4, 0xD4))
        elif op == 3 and len(b) > 9:  # u32/u64 fields set to huge values
            i = rnd.randrange(1, len(b) - 8)
            b[i:i + 8] = rnd.choice((b"\xff" * 8, b"\x00\x00\x00\x40\x00\x00\x00\x00", b"\x7f" + b"\xff" * 7))
        elif op == 4:  # insertion
            i = rnd.randrange(len(b) + 1)
            b[i:i] = bytes(rnd.randrange(256) for _ in range(rnd.randint(1, 16)))
        elif len(b) > 2:  # splice a chunk of the input elsewhere
            i, j = sorted(rnd.sample(range(len(b)), 2))
            k = rnd.randrange(len(b))
            b[k:k] = b[i:j][:256]
        out.append(bytes(b))
    return out


@pytest.mark.parametrize("name", TARGETS)
def test_seed_corpus_and_mutants_raise_only_typed_errors(name):
    """Every seed and its mutations decode or raise a DeltackptError; nothing else escapes."""
    fn = target(name).TestOneInput
    seeds = corpus(name)
    assert len(seeds) >= 2, f"fuzz/corpus/{name} is empty: run python fuzz/make_corpus.py"
    rnd = random.Random(f"corpus-{name}")
    for fname, data in seeds:
        fn(data)
        for i, m in enumerate(_mutants(data, rnd)):
            try:
                fn(m)
            except Exception as exc:  # name the input so it can be turned into a regression test
                raise AssertionError(f"{name} seed {fname} mutant {i} ({m.hex()[:400]}): {exc!r}") from exc


def test_real_seeds_are_accepted():
    """The corpus holds real, valid objects (so the replays reach the deep checks, not just the magic)."""
    ok = {"manifest": 0, "pack": 0, "index": 0, "config": 0}
    for _f, data in corpus("manifest"):
        ok["manifest"] += _accepts(manifest.decode, data)
    for _f, data in corpus("pack"):
        ok["pack"] += data[:1] == b"\x00" and _accepts(pack.parse_pack, data[1:])
    for _f, data in corpus("index"):
        ok["index"] += data[:1] == b"\x00" and _accepts(index.decode, data[1:])
    for _f, data in corpus("config"):
        ok["config"] += _accepts(lambda d: config.decode(d, where="t"), data)
    assert all(ok.values()), ok


def _accepts(fn, data) -> bool:
    try:
        fn(data)
        return True
    except Exception:
        return False
