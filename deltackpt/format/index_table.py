"""Index files, version 2 (format 3): fixed-width columns sorted by chunk id, searched in place.

    index   = MAGIC || HEAD || ZSTD(PACKS || COLUMNS) || XXH64(HEAD || ZSTD(...))(u64 LE)
    HEAD    = P(u32 LE) || N(u32 LE)                         packs named, entries
    PACKS   = P x (pack id(16) || pack_len(u64 LE))           sorted by id, no id twice
    COLUMNS = chunk_id N x 16 || base N x 16 || offset N x u64 || length N x u32
              || raw_len N x u32 || pack N x u32 || depth N x u16 || encoding N x u8

Entries sorted by (chunk id, pack id, offset), none twice.  The tables are one zstd frame
declaring their exact size (known from HEAD before anything is allocated): fixed-width columns
take 55 bytes an entry where msgpack took about 36, and compressed they take about 26 (a
300-version history: 3.3 MB raw, 1.6 MB compressed, 2.2 MB as version 1).  A version-1 index is one msgpack map a
reader must decode whole, entry by entry, before it can find anything: a restart after 300
versions of an 8 MB state spent 0.3 s of its 0.4 s there (bench/MAINTENANCE.md).  Here a reader
checks every column with a few vector operations, keeps the file's bytes as they are, and finds a
chunk's entries by binary search; it builds entries only for the chunks it reads.

Example::

    table = IndexTable.decode(data, what="index/ab12...")
    found = table.lookup([chunk_id])       # {chunk_id: [(pack id, PackEntry), ...]}
"""

from __future__ import annotations

import struct

import numpy as np
import xxhash
import zstandard

from ..errors import CorruptObjectError
from .ids import ID_BYTES
from .limits import MAX_CHAIN_DEPTH, MAX_CHUNK_BYTES, MAX_INDEX_BYTES, MAX_PACK_BYTES
from .pack import MAGIC as PACK_MAGIC, TRAILER_BYTES, PackEntry

MAGIC = b"DCKIDX\x02\x00"
_HEAD = struct.Struct("<II")
_SUM = struct.Struct("<Q")
_PACK_ROW = ID_BYTES + 8
# bytes per entry, column by column, in file order
_COLUMNS = (("chunk_id", ID_BYTES), ("base", ID_BYTES), ("offset", 8), ("length", 4), ("raw_len", 4),
            ("pack", 4), ("depth", 2), ("encoding", 1))
ENTRY_BYTES = sum(w for _, w in _COLUMNS)   # 55
_ZERO_ID = bytes(ID_BYTES)


def _id_words(raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of 16-byte ids as two native uint64 columns (high and low word, big-endian order), so
    that comparing (high, low) compares the ids byte by byte."""
    words = raw.reshape(-1, ID_BYTES).view(">u8")
    return words[:, 0].astype(np.uint64), words[:, 1].astype(np.uint64)


def _increasing(keys: list[np.ndarray]) -> np.ndarray:
    """Per consecutive pair of rows: whether the tuple of ``keys`` strictly increases."""
    more = np.zeros(len(keys[0]) - 1, dtype=bool)
    same = np.ones(len(keys[0]) - 1, dtype=bool)
    for k in keys:
        a, b = k[:-1], k[1:]
        more |= same & (b > a)
        same &= b == a
    return more


def encode(packs: dict[str, tuple[int, list[PackEntry]]]) -> bytes:
    """The version-2 index file naming ``packs`` ({pack id: (pack length, entries)}); an entry
    listed twice is written once."""
    order = sorted(packs)
    slot = {pid: i for i, pid in enumerate(order)}
    seen: dict[tuple[bytes, str, int], PackEntry] = {}
    for pid, (_plen, entries) in packs.items():
        for e in entries:
            if seen.setdefault((e.chunk_id, pid, e.offset), e) != e:
                raise ValueError(f"pack {pid} offset {e.offset}: two different entries")
    rows = sorted(seen.items())
    n = len(rows)
    head = _HEAD.pack(len(order), n) + b"".join(bytes.fromhex(pid) + struct.pack("<Q", packs[pid][0])
                                                for pid in order)
    cols = [b"".join(e.chunk_id for _, e in rows),
            b"".join(e.base if e.base is not None else _ZERO_ID for _, e in rows),
            np.array([e.offset for _, e in rows], dtype="<u8").tobytes(),
            np.array([e.length for _, e in rows], dtype="<u4").tobytes(),
            np.array([e.raw_len for _, e in rows], dtype="<u4").tobytes(),
            np.array([slot[pid] for (_, pid, _), _ in rows], dtype="<u4").tobytes(),
            np.array([e.depth for _, e in rows], dtype="<u2").tobytes(),
            np.array([e.encoding for _, e in rows], dtype="u1").tobytes()]
    # level 1: as small as level 3 on these columns (within 2 %), several times faster; a
    # compressor per call, as one is not to be shared between threads (two saves at once)
    tables = zstandard.ZstdCompressor(level=1, write_content_size=True).compress(head[_HEAD.size:] + b"".join(cols))
    body = head[:_HEAD.size] + tables
    return MAGIC + body + _SUM.pack(xxhash.xxh64_intdigest(body))


_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def _frame_length(frame: memoryview) -> int:
    """The length of the zstd frame ``frame`` starts with, from its block headers (RFC 8878
    §3.1.1): what follows it is found without decompressing anything."""
    pos = zstandard.frame_header_size(frame)
    while True:
        if pos + 3 > len(frame):
            raise zstandard.ZstdError("the frame is cut short")
        header = int.from_bytes(frame[pos:pos + 3], "little")
        kind = (header >> 1) & 3
        if kind == 3:
            raise zstandard.ZstdError("a reserved block type")
        pos += 3 + (1 if kind == 1 else header >> 3)   # an RLE block stores one byte
        if header & 1:
            break
    return pos + (4 if zstandard.get_frame_parameters(frame).has_checksum else 0)


def _tables(data: bytes, what: str) -> tuple[int, int, bytes]:
    """P, N and the decompressed pack table and columns of a version-2 file whose magic and
    checksum were checked: the frame must declare exactly the size P and N give, and nothing may
    follow it."""
    p, n = _HEAD.unpack_from(data, len(MAGIC))
    expected = p * _PACK_ROW + n * ENTRY_BYTES
    if expected > MAX_INDEX_BYTES:
        raise CorruptObjectError(f"{what}: {p} packs and {n} entries, over MAX_INDEX_BYTES")
    frame = memoryview(data)[len(MAGIC) + _HEAD.size:-_SUM.size]
    try:
        if frame[:4] != _ZSTD_MAGIC or _frame_length(frame) != len(frame):
            raise CorruptObjectError(f"{what}: its tables are not exactly one zstd frame")
        declared = zstandard.frame_content_size(frame)
        if declared != expected:
            raise CorruptObjectError(f"{what}: its tables declare {declared} bytes, not the {expected} "
                                     f"that {p} packs and {n} entries take")
        # the output buffer is the declared size: a frame that would decode to more is refused
        raw = zstandard.ZstdDecompressor().decompress(frame, max_output_size=expected)
    except zstandard.ZstdError as exc:
        raise CorruptObjectError(f"{what}: its tables are not one zstd frame ({exc})") from None
    if len(raw) != expected:
        raise CorruptObjectError(f"{what}: its tables decode to {len(raw)} bytes, not {expected}")
    return p, n, raw


class IndexTable:
    """One version-2 index file, checked whole and kept as columns.  Immutable; threads share it."""

    def __init__(self, pack_ids: list[str], pack_lens: list[int], cols: dict[str, np.ndarray],
                 hi: np.ndarray, lo: np.ndarray) -> None:
        # (the columns are views of the decompressed tables, which they keep alive)
        self.pack_ids, self.pack_lens, self._cols, self._hi, self._lo = pack_ids, pack_lens, cols, hi, lo
        #: the packs this file holds at least one entry of
        # (np.unique would import numpy.ma on its first call: 10 ms of a restart)
        used = np.bincount(cols["pack"].astype(np.intp), minlength=len(pack_ids)) if len(hi) else np.zeros(0)
        self.filled = frozenset(pack_ids[k] for k in np.flatnonzero(used).tolist())

    def __len__(self) -> int:
        return len(self._hi)

    @classmethod
    def decode(cls, data: bytes, *, what: str = "index") -> "IndexTable":
        """Check a whole version-2 index file (CorruptObjectError naming ``what``): its length,
        checksum, pack table and every entry, as a version-1 reader checks each entry (spec §8)."""
        if len(data) > MAX_INDEX_BYTES:
            raise CorruptObjectError(f"{what}: {len(data)} bytes, over MAX_INDEX_BYTES")
        if len(data) < len(MAGIC) + _HEAD.size + _SUM.size or data[:8] != MAGIC:
            raise CorruptObjectError(f"{what}: not a version-2 index file")
        body = memoryview(data)[len(MAGIC):-_SUM.size]
        if xxhash.xxh64_intdigest(body) != _SUM.unpack_from(data, len(data) - _SUM.size)[0]:
            raise CorruptObjectError(f"{what}: checksum mismatch")
        p, n, data = _tables(data, what)
        at = 0
        table = np.frombuffer(data, dtype=np.uint8, count=p * _PACK_ROW, offset=at).reshape(p, _PACK_ROW)
        at += p * _PACK_ROW
        pack_hi, pack_lo = _id_words(np.ascontiguousarray(table[:, :ID_BYTES]))
        pack_lens = np.ascontiguousarray(table[:, ID_BYTES:]).view("<u8").ravel()
        if p > 1 and not _increasing([pack_hi, pack_lo]).all():
            raise CorruptObjectError(f"{what}: pack ids not in strictly increasing order")
        if p and int(pack_lens.max()) > MAX_PACK_BYTES:
            raise CorruptObjectError(f"{what}: a pack length is over MAX_PACK_BYTES")
        cols: dict[str, np.ndarray] = {}
        for name, width in _COLUMNS:
            dtype = np.uint8 if width == ID_BYTES else np.dtype({8: "<u8", 4: "<u4", 2: "<u2", 1: "u1"}[width])
            count = n * ID_BYTES if width == ID_BYTES else n
            cols[name] = np.frombuffer(data, dtype=dtype, count=count, offset=at)
            at += n * width
        hi, lo = _id_words(cols["chunk_id"])
        cls._check_entries(cols, hi, lo, pack_lens, p, what)
        pack_ids = [bytes(r).hex() for r in table[:, :ID_BYTES]]
        return cls(pack_ids, [int(x) for x in pack_lens], cols, hi, lo)

    @staticmethod
    def _check_entries(cols: dict[str, np.ndarray], hi: np.ndarray, lo: np.ndarray, pack_lens: np.ndarray,
                       p: int, what: str) -> None:
        n = len(hi)
        if not n:
            return
        pack, offset, length = cols["pack"], cols["offset"], cols["length"]
        depth, raw_len = cols["depth"], cols["raw_len"]

        def refuse(bad: np.ndarray, why: str) -> None:
            if bad.any():
                i = int(np.argmax(bad))
                cid = bytes(cols["chunk_id"][i * ID_BYTES:(i + 1) * ID_BYTES]).hex()
                raise CorruptObjectError(f"{what}: entry {i} (chunk {cid}): {why}")

        refuse(pack >= p, "names no pack of the file")
        if n > 1:
            refuse(np.concatenate([~_increasing([hi, lo, pack, offset]), [False]]),
                   "entries not in strictly increasing (chunk id, pack id, offset) order")
        refuse(length < 12, "length below 12 bytes")
        refuse(length > MAX_CHUNK_BYTES * 2, "length over twice MAX_CHUNK_BYTES")
        refuse(raw_len > MAX_CHUNK_BYTES, "raw length over MAX_CHUNK_BYTES")
        refuse(depth > MAX_CHAIN_DEPTH, "depth over MAX_CHAIN_DEPTH")
        refuse(offset < len(PACK_MAGIC), "object range starts inside the pack magic")
        refuse(offset > MAX_PACK_BYTES, "offset over MAX_PACK_BYTES")
        plen = pack_lens[np.minimum(pack, p - 1)].astype(np.int64)
        refuse(offset.astype(np.int64) + length > plen - TRAILER_BYTES, "object range lies outside the pack")
        base_words = cols["base"].reshape(n, ID_BYTES).view("<u8")
        refuse((depth == 0) & (base_words != 0).any(axis=1), "depth 0 but a base is named")

    def _entry(self, i: int) -> tuple[str, PackEntry]:
        c = self._cols
        depth = int(c["depth"][i])
        base = None if depth == 0 else bytes(c["base"][i * ID_BYTES:(i + 1) * ID_BYTES])
        e = tuple.__new__(PackEntry, (bytes(c["chunk_id"][i * ID_BYTES:(i + 1) * ID_BYTES]), int(c["offset"][i]),
                                      int(c["length"][i]), int(c["encoding"][i]), int(c["raw_len"][i]), base, depth))
        return self.pack_ids[int(c["pack"][i])], e

    def lookup(self, chunk_ids: list[bytes], into: dict[bytes, list[tuple[str, PackEntry]]],
               known: frozenset[str] | set[str] = frozenset()) -> None:
        """Append to ``into[c]`` (which must exist) every entry of each chunk ``c`` of
        ``chunk_ids`` (16-byte ids), in (pack id, offset) order; an entry in a pack of ``known``
        (packs indexed by earlier files) is left out when ``into[c]`` already holds a copy in that
        pack, as a chunk indexed twice in one pack counts once (Index.add_entries)."""
        if not chunk_ids or not len(self._hi):
            return
        high = np.frombuffer(b"".join(chunk_ids), dtype=">u8")[::2].astype(np.uint64)
        left, right = np.searchsorted(self._hi, high, "left"), np.searchsorted(self._hi, high, "right")
        for k in np.flatnonzero(right > left).tolist():
            cid = chunk_ids[k]
            lo = int.from_bytes(cid[8:], "big")
            copies = into[cid]
            for i in range(int(left[k]), int(right[k])):
                if int(self._lo[i]) == lo:
                    copy = self._entry(i)
                    if copy[0] in known and any(p == copy[0] for p, _ in copies):
                        continue
                    copies.append(copy)

    def packs(self) -> dict[str, tuple[int, list[PackEntry]]]:
        """Every entry, as the version-1 decoder gives them: {pack id: (pack length, entries by
        offset)}, every pack of the file named (with no entries when it has none)."""
        c = self._cols
        n = len(self._hi)
        out: dict[str, tuple[int, list[PackEntry]]] = {pid: (plen, []) for pid, plen in zip(self.pack_ids, self.pack_lens)}
        if not n:
            return out
        ids, bases = bytes(c["chunk_id"]), bytes(c["base"])
        order = np.lexsort((c["offset"], c["pack"]))
        lists = [self.pack_ids[k] for k in c["pack"][order].tolist()]
        new = tuple.__new__
        for i, pid, offset, length, encoding, raw_len, depth in zip(
                order.tolist(), lists, *(c[k][order].tolist() for k in ("offset", "length", "encoding", "raw_len", "depth"))):
            a = i * ID_BYTES
            out[pid][1].append(new(PackEntry, (ids[a:a + ID_BYTES], offset, length, encoding, raw_len,
                                               None if depth == 0 else bases[a:a + ID_BYTES], depth)))
        return out
