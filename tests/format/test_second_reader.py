"""A second, independent reader of format versions 1 to 3, written only from spec/FORMAT.md.

It imports nothing from deltackpt's format, codecs or repo packages: msgpack, zstandard, xxhash
and numpy read the bytes, torch only builds tensors to compare with ``deltackpt.load``.  If this
reader and deltackpt disagree on any bit, the spec is incomplete or the code drifted from it.
"""

from __future__ import annotations

import math
import os
import re
import struct

import msgpack
import numpy as np
import pytest
import torch
import xxhash
import zstandard

import deltackpt

HEX32 = re.compile(r"^[0-9a-f]{32}$")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16,
          "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
          "uint8": torch.uint8, "bool": torch.bool}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


class SpecReader:
    """Reads a local repository following spec/FORMAT.md, sections by section."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.encodings_seen: set[int] = set()
        config = msgpack.unpackb(self.get("config"), raw=False)                     # "Config and versioning"
        assert config["format"] == "deltackpt" and config["version"] in (1, 2, 3)
        copies: dict[bytes, list[tuple[str, list]]] = {}                            # "Index files"
        for name in sorted(os.listdir(os.path.join(root, "index"))):
            data = self.get(f"index/{name}")
            assert data[:8] == (b"DCKIDX\x02\x00" if config["version"] == 3 else b"DCKIDX\x01\x00")
            body, (checksum,) = data[8:-8], struct.unpack("<Q", data[-8:])
            assert xxhash.xxh64_intdigest(body) == checksum
            packs = (self.index_v2(body[:8], zstandard.ZstdDecompressor().decompress(body[8:])) if data[6] == 2
                     else msgpack.unpackb(body, raw=False, strict_map_key=False))
            for pack_id, (_pack_len, entries) in packs.items():
                for e in entries:
                    copies.setdefault(e[0], []).append((pack_id, e))
        self.index = self.choose(copies)

    @staticmethod
    def index_v2(head: bytes, body: bytes) -> dict[str, tuple[int, list]]:
        """Index version 2 (§8): P and N, then (decompressed) a pack table and the entries column
        by column."""
        p, n = struct.unpack("<II", head)
        assert len(body) == 24 * p + 55 * n
        packs, pos = [], 0
        for _ in range(p):
            packs.append((body[pos:pos + 16].hex(), struct.unpack_from("<Q", body, pos + 16)[0]))
            pos += 24
        assert [x[0] for x in packs] == sorted({x[0] for x in packs})
        cols = {}
        for name, width, fmt in (("chunk_id", 16, None), ("base", 16, None), ("offset", 8, "Q"), ("length", 4, "I"),
                                 ("raw_len", 4, "I"), ("pack", 4, "I"), ("depth", 2, "H"), ("encoding", 1, "B")):
            raw = body[pos:pos + width * n]
            cols[name] = ([raw[i * 16:(i + 1) * 16] for i in range(n)] if fmt is None
                          else list(struct.unpack(f"<{n}{fmt}", raw)))
            pos += width * n
        out: dict[str, tuple[int, list]] = {pid: (plen, []) for pid, plen in packs}
        keys = []
        for i in range(n):
            pid, plen = packs[cols["pack"][i]]
            depth = cols["depth"][i]
            base = None if depth == 0 else cols["base"][i]
            assert depth > 0 or cols["base"][i] == bytes(16)
            assert 8 <= cols["offset"][i] and cols["offset"][i] + cols["length"][i] <= plen - 20
            keys.append((cols["chunk_id"][i], pid, cols["offset"][i]))
            out[pid][1].append([cols["chunk_id"][i], cols["offset"][i], cols["length"][i], cols["encoding"][i],
                                cols["raw_len"][i], base, depth])
        assert keys == sorted(set(keys))
        return out

    @staticmethod
    def choose(copies: dict[bytes, list[tuple[str, list]]]) -> dict[bytes, tuple[str, list]]:
        """'Choosing a copy' (§8): real depth breadth-first from the keyframes, first copy among equals."""
        chosen: dict[bytes, tuple[str, list]] = {}
        level = [cid for cid, cps in copies.items() for c in cps[:1] if any(x[1][5] is None for x in cps)]
        for cid in level:
            chosen[cid] = next(x for x in copies[cid] if x[1][5] is None)
        while level:
            reached = set(level)
            level = []
            for cid, cps in copies.items():
                if cid in chosen:
                    continue
                for c in cps:
                    if c[1][5] in reached:
                        chosen[cid] = c
                        level.append(cid)
                        break
        return chosen

    def get(self, key: str, start: int = 0, length: int | None = None) -> bytes:
        assert all(re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9._-]*", p) for p in key.split("/"))  # "Threat model"
        fd = os.open(os.path.join(self.root, *key.split("/")), os.O_RDONLY | os.O_NOFOLLOW)
        try:
            size = os.fstat(fd).st_size
            return os.pread(fd, size - start if length is None else length, start)
        finally:
            os.close(fd)

    def index_from_packs(self) -> dict[bytes, tuple[str, list]]:                   # "Pack files": self-describing
        out: dict[bytes, list[tuple[str, list]]] = {}
        for sub in sorted(os.listdir(os.path.join(self.root, "packs"))):
            for pack_id in sorted(os.listdir(os.path.join(self.root, "packs", sub))):
                key = f"packs/{sub}/{pack_id}"
                data = self.get(key)
                assert xxhash.xxh3_128_hexdigest(data) == pack_id and data[:8] == b"DCKPACK\x01"
                header_len, checksum, end = struct.unpack("<IQ8s", data[-20:])
                assert end == b"DCKPEND\x01" and header_len + 28 <= len(data)
                header = data[len(data) - 20 - header_len:len(data) - 20]
                assert xxhash.xxh64_intdigest(header) == checksum
                for e in msgpack.unpackb(header, raw=False):
                    out.setdefault(e[0], []).append((pack_id, e))
        return self.choose(out)

    def resolve_latest(self) -> str:                                                # "Refs, tags and revisions"
        vid = self.get("refs/latest").decode("ascii").strip()
        assert HEX32.match(vid)
        return vid

    def manifest(self, vid: str) -> dict:                                           # "Manifest"
        data = self.get(f"manifests/{vid}")
        assert xxhash.xxh3_128_hexdigest(data) == vid and data[:8] == b"DCKMAN\x01\x00"

        def ext(code: int, payload: bytes):
            if code == 1:
                return ("tensor", msgpack.unpackb(payload))
            if code == 2:
                return ("tuple", msgpack.unpackb(payload, raw=False, strict_map_key=False, ext_hook=ext))
            raise ValueError(f"unknown ext type {code}")

        return msgpack.unpackb(data[8:], raw=False, strict_map_key=False, ext_hook=ext)

    # objects and codecs -----------------------------------------------------------------------
    def chunk(self, cid: bytes) -> bytes:                                           # "Pack", "Object encoding"
        pack_id, (_cid, offset, length, encoding, raw_len, base, _depth) = self.index[cid]
        obj = self.get(f"packs/{pack_id[:2]}/{pack_id}", offset, length)
        version, enc, params_len, obj_raw_len = struct.unpack_from("<BBHQ", obj, 0)
        assert (version, enc, obj_raw_len) == (1, encoding, raw_len)
        params = msgpack.unpackb(obj[12:12 + params_len], raw=False) if params_len else {}
        assert params.get("base") == base
        payload = obj[12 + params_len:]
        base_bytes = None if base is None else np.frombuffer(self.chunk(base), dtype=np.uint8)
        out = self.decode(enc, params, payload, raw_len, base_bytes)
        assert len(out) == raw_len and xxhash.xxh3_128_digest(out) == cid
        self.encodings_seen.add(enc)
        return out

    @staticmethod
    def planes(params: dict, payload: bytes, raw_len: int) -> np.ndarray:           # spec/codecs/bg-zstd.md
        w, modes, sizes = params["w"], params["m"], params["s"]
        assert len(modes) == len(sizes) == w and raw_len % w == 0 and sum(sizes) == len(payload)
        n, pos, rows = raw_len // w, 0, []
        for mode, size in zip(modes, sizes):
            part = payload[pos:pos + size]
            pos += size
            if mode == 1:
                assert zstandard.frame_content_size(part) == n
                part = zstandard.ZstdDecompressor().decompress(part, max_output_size=n)
            assert len(part) == n
            rows.append(np.frombuffer(part, dtype=np.uint8))
        return np.stack(rows).T.reshape(-1) if rows and n else np.zeros(0, np.uint8)

    def decode(self, enc: int, params: dict, payload: bytes, raw_len: int, base: np.ndarray | None) -> bytes:
        if enc == 0:                                                                # raw
            return bytes(payload)
        planes = None if enc == 4 else self.planes(params, payload, raw_len)
        if enc == 1:                                                                # bg-zstd
            return planes.tobytes()
        if enc == 2:                                                                # xor-delta
            return (planes ^ base).tobytes()
        if enc == 3:                                                                # sub-delta (zigzag)
            t = UINT[params["w"]]
            z = planes.view(t)
            d = (z >> t(1)) ^ (-(z & t(1)).astype(t))
            with np.errstate(over="ignore"):
                return (d + base.view(t)).astype(t).tobytes()
        if enc == 4:                                                                # sparse
            rb, count, bm = params["rb"], params["n"], params["bm"]
            nrows = raw_len // rb
            bitmap = zstandard.ZstdDecompressor().decompress(payload[:bm], max_output_size=(nrows + 7) // 8)
            changed = np.unpackbits(np.frombuffer(bitmap, np.uint8), count=nrows).astype(bool)
            assert changed.sum() == count
            rows = self.planes(params, payload[bm:], count * rb).reshape(count, rb)
            out = base.copy().reshape(nrows, rb)
            out[changed] ^= rows
            return out.tobytes()
        raise AssertionError(f"encoding {enc} is not needed by a lossless repository")

    # tensors ----------------------------------------------------------------------------------
    def load(self, vid: str):
        m = self.manifest(vid)
        blobs = []
        for b in m["blobs"]:
            data = b"".join(self.chunk(cid) for cid, _n in b["chunks"])
            assert len(data) == b["nbytes"]
            blobs.append(torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8))
        tensors = []
        for t in m["tensors"]:
            dtype, storage = DTYPES[t["dtype"]], blobs[t["blob"]]
            isz = torch.empty(0, dtype=dtype).element_size()
            if math.prod(t["shape"]) == 0:
                tensors.append(torch.empty(t["shape"], dtype=dtype))
                continue
            out = torch.empty(0, dtype=dtype)
            out.set_(storage.untyped_storage(), t["offset"] // isz, t["shape"], t["stride"])
            tensors.append(out)

        def build(v):
            if isinstance(v, tuple) and len(v) == 2 and v[0] == "tensor":
                return tensors[v[1]]
            if isinstance(v, tuple) and len(v) == 2 and v[0] == "tuple":
                return tuple(build(x) for x in v[1])
            if isinstance(v, dict):
                return {k: build(x) for k, x in v.items()}
            if isinstance(v, list):
                return [build(x) for x in v]
            return v

        return build(m["tree"]), m


def assert_same(a, b, path="") -> None:
    """Structure equal, tensors bit-identical (dtype, shape, stride, bytes), NaN equal to NaN."""
    assert type(a) is type(b) or (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)), path
    if isinstance(a, torch.Tensor):
        assert (a.dtype, a.shape, a.stride()) == (b.dtype, b.shape, b.stride()), path
        assert a.contiguous().reshape(-1).view(torch.uint8).tolist() == b.contiguous().reshape(-1).view(torch.uint8).tolist(), path
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and a != a:
        assert b != b, path
    else:
        assert a == b, path


class TiedLM(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(64, 16)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 16))
        self.norm = torch.nn.LayerNorm(16)
        self.head = torch.nn.Linear(16, 64, bias=False)
        self.head.weight = self.emb.weight  # tied: one storage, two names

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.mlp(self.emb(ids))))


def _train_and_save(path: str, delta_base: str) -> None:
    torch.manual_seed(0)
    deltackpt.Repo.init(path, delta_base=delta_base)
    model = TiedLM()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    table = torch.randn(128, 8)  # a lookup table of which one save touches only a few rows
    for step in range(2):
        ids = torch.randint(0, 64, (4, 6))
        loss = torch.nn.functional.cross_entropy(model(ids).reshape(-1, 64), ids.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad()
        if step:
            table[3] += 1.0
        state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "table": table.clone(),
                 "ema_bf16": {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()},
                 "head_t": model.head.weight.t(), "empty": torch.zeros(0, 3), "scalar": torch.tensor(2.5),
                 "nan": torch.tensor([float("nan"), -0.0]), "misc": (1, "two", None, b"\x03")}
        deltackpt.save(state, path, step=step, metrics={"loss": float(loss.detach())})


@pytest.mark.parametrize("delta_base", ["child", "parent"])
def test_second_reader_matches_deltackpt(tmp_path, delta_base):
    """An independent reader written from the spec loads every tensor bit-identical to deltackpt.load,
    through raw, bg-zstd, xor-delta, sub-delta and sparse objects, with tied storage kept shared,
    and rebuilds the index from the pack headers alone; in both write topologies (format 2's reverse
    deltas, whose index holds several copies per chunk, and forward chains)."""
    path = str(tmp_path / "repo")
    _train_and_save(path, delta_base)
    reader = SpecReader(path)
    vid = reader.resolve_latest()
    ours, m = reader.load(vid)
    assert m["parent"] is not None and m["step"] == 1
    theirs = deltackpt.load(path, vid)
    assert_same(ours, theirs)
    assert ours["model"]["emb.weight"].untyped_storage().data_ptr() == ours["model"]["head.weight"].untyped_storage().data_ptr()
    assert ours["head_t"].untyped_storage().data_ptr() == ours["model"]["emb.weight"].untyped_storage().data_ptr()
    assert ours["ema_bf16"]["norm.weight"].dtype == torch.bfloat16
    # the parent too: with "child" the head is all keyframes and the parent deltas against it;
    # with "parent" the other way round
    assert_same(reader.load(m["parent"])[0], deltackpt.load(path, m["parent"]))
    assert reader.index_from_packs() == reader.index  # the index can be rebuilt from the packs alone
    # forward chains cover every lossless codec here; reverse deltas pick their own winners
    missing = ({0, 1, 2, 3, 4} if delta_base == "parent" else {0, 1}) - reader.encodings_seen
    if delta_base == "child":
        assert reader.encodings_seen & {2, 3, 4}, "no reverse delta was read"
    if missing:
        pytest.fail(f"the saved repository used no object of encodings {sorted(missing)}: the test lost coverage")
