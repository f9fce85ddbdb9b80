"""Regenerate the seed corpora in fuzz/corpus/<target>/ from a real repository.

    python fuzz/make_corpus.py

Builds a small repository (a real model + AdamW, several training steps, lossless deltas, sparse
embedding updates, q8/q4 deltas and fp16/bf16 casts) in a temporary folder and copies out its
manifests, packs, index files, every object (once per flag combination the object target knows),
refs, tag names and revisions, the config, plus a few hand-made hostile inputs (a 1 TB tensor, a
zstd frame declaring a huge size, a pack header claiming 1e9 entries, tuples nested 200 and 5000
deep, names and ids ending in a newline).  File names are content
hashes, so reruns only add what changed.
"""

from __future__ import annotations

import hashlib
import os
import struct
import sys
import tempfile

import _harness  # noqa: F401  (puts the repository root on sys.path)

import msgpack
import xxhash
import zstandard

CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
TARGETS = ("manifest", "pack", "index", "objects", "refs", "config")


def build_repository(path: str) -> None:
    """A repository with every codec in use (the corruption tests use the same recipe)."""
    import torch

    import deltackpt

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Embedding(64, 16), torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                torch.nn.Linear(32, 8))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    encodings = [None, None, {"optimizer.*": "q8-delta"}, {"optimizer.*": "q4-delta"}, {"model.3.*": "fp16"},
                 {"model.3.*": "bf16"}, None]
    for step, enc in enumerate(encodings):
        idx = torch.randint(0, 4, (8,))  # only a few embedding rows change: sparse deltas
        loss = model(idx).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        deltackpt.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step}, path,
                       step=step, metrics={"loss": float(loss.detach())}, encoding=enc, tag="first" if step == 0 else None)


def _write(target: str, data: bytes) -> None:
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, hashlib.sha1(data).hexdigest()), "wb") as f:
        f.write(data)


def native_plane_objects() -> list[bytes]:
    """bg-zstd objects whose planes c-blosc interleaves (long enough to split), one with bytes after
    a plane's frame and one with a zstd plane exactly as long as a raw one (both legal)."""
    from deltackpt.codecs.bytegroup import encode_planes
    from deltackpt.format import objects

    n = 512
    data = bytes((i * 37 + (i >> 9)) & 0xFF if i % 4 < 3 else 0x3C for i in range(4 * n))
    params, payload = encode_planes(data, 4, 1)
    payload = bytes(payload)
    top = payload[sum(params["s"][:3]):]
    tail = dict(params, s=params["s"][:3] + [len(top) + 4])
    skip = n - len(top) - 8   # a skippable frame pads the top plane to exactly n bytes
    padded = top + (0x184D2A50).to_bytes(4, "little") + skip.to_bytes(4, "little") + bytes(skip)
    return [objects.EncodedObject(1, 4 * n, params, payload).to_bytes(),
            objects.EncodedObject(1, 4 * n, tail, payload + b"tail").to_bytes(),
            objects.EncodedObject(1, 4 * n, dict(params, s=params["s"][:3] + [n]), payload[:-len(top)] + padded).to_bytes()]


def hostile_seeds() -> dict[str, list[bytes]]:
    """Inputs that claim sizes the data cannot back."""
    from deltackpt.format import manifest, objects, pack

    huge_tensor = {"parent": None, "time": 0.0, "tree": {"w": msgpack.ExtType(1, msgpack.packb(0))},
                   "blobs": [{"nbytes": 0, "itemsize": 4, "row_bytes": 0, "chunks": []}],
                   "tensors": [{"name": "w", "key": ["w"], "dtype": "float32", "shape": [1 << 38],
                                "stride": [1], "blob": 0, "offset": 0}]}
    frame = bytearray(zstandard.ZstdCompressor(write_content_size=True).compress(b"\0" * 64))
    zparams = {"w": 1, "m": [1], "s": [len(frame)]}
    big = objects.EncodedObject(1, 1 << 26, zparams, bytes(frame)).to_bytes()
    header = msgpack.packb([[b"\0" * 16, 8, 12, 0, 0, None, 0]] * 3)
    body = b"\0" * 12
    fake_pack = pack.MAGIC + body + header + struct.pack("<IQ8s", len(header), xxhash.xxh64_intdigest(header),
                                                         pack.END_MAGIC)
    claims = bytearray(fake_pack)
    claims[-20:-16] = struct.pack("<I", 10**9 & 0xFFFFFFFF)
    entries_1e9 = b"\xdd" + struct.pack(">I", 10**9)  # msgpack array32 header claiming 1e9 items

    def nested(depth: int) -> msgpack.ExtType:  # a tuple in a tuple ... (issue 16: 200 segfaulted)
        ext = msgpack.ExtType(2, msgpack.packb(["x"]))
        for _ in range(depth - 1):
            ext = msgpack.ExtType(2, msgpack.packb([ext]))
        return ext

    def tree(value: object) -> bytes:
        return manifest.MAGIC + msgpack.packb({"parent": None, "time": 0.0, "tree": value, "tensors": [],
                                               "blobs": []}, use_bin_type=True)

    return {
        "manifest": [manifest.MAGIC + msgpack.packb(huge_tensor, use_bin_type=True), tree(nested(200)),
                     tree(nested(5000)), tree({nested(1): 1})],
        "objects": [b"\x01" + big, b"\x03" + big] + [b"\x11" + o for o in native_plane_objects()],
        "pack": [b"\x00" + fake_pack, b"\x00" + bytes(claims), b"\x01" + entries_1e9],
        "index": [b"\x01" + msgpack.packb({"0" * 32: [1 << 40, [[b"\0" * 16, 8, 12, 0, 0, None, 0]]]}),
                  b"\x01" + msgpack.packb({"0" * 31 + "\n": [100, []]})],
        "refs": [b"latest~3", b"../../etc/passwd", b"a" * 32 + b"\n", b"best:loss:max", "tag\u00e9".encode(),
                 b"v1\n", b"a" * 31 + b"\n", "latest~\u0663".encode()],
        "config": [msgpack.packb({"format": "deltackpt", "version": 99, "repo_id": "x"})],
    }


def main() -> None:
    from deltackpt.format import index as index_fmt
    from deltackpt.format import pack as pack_fmt
    from deltackpt.repo.repository import Repository

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "repo")
        build_repository(path)
        repo = Repository(path)
        store = repo.store
        for key in store.list("manifests/"):
            _write("manifest", store.get(key))
        seen_enc = set()
        for key in store.list("packs/"):
            data = store.get(key)
            _write("pack", b"\x00" + data)
            for e in pack_fmt.parse_pack(data):
                obj = data[e.offset:e.offset + e.length]
                if len(obj) < 64 * 1024:
                    # every object with and without a base; the other base patterns once per codec
                    extra = (0x05, 0x0B, 0x0D, 0x13, 0x17) if e.encoding not in seen_enc else ()
                    for flags in (0x01, 0x03) + extra:
                        _write("objects", bytes([flags]) + obj)
                seen_enc.add(e.encoding)
            header_len = struct.unpack("<I", data[-20:-16])[0]
            _write("pack", b"\x01" + data[-20 - header_len:-20])
        for key in store.list("index/"):
            data = store.get(key)
            _write("index", b"\x00" + data)
            _write("index", (b"\x02" if data[:8] == index_fmt.MAGIC_V2 else b"\x01") + data[len(index_fmt.MAGIC):-8])
            _write("index", b"\x03" + data)
        for key in store.list("refs/"):
            _write("refs", store.get(key))
            _write("refs", key.rsplit("/", 1)[-1].encode())
        latest = repo.latest()
        for rev in (latest, latest[:6], "latest", "latest~2", "first", "best:loss", "best:loss:max", "HEAD~1"):
            _write("refs", rev.encode())
        _write("config", store.get("config"))
        for target, seeds in hostile_seeds().items():
            for seed in seeds:
                _write(target, seed)
        print(f"encodings present in the packs: {sorted(seen_enc)}", file=sys.stderr)
    for target in TARGETS:
        folder = os.path.join(CORPUS, target)
        print(f"{target}: {len(os.listdir(folder))} seeds", file=sys.stderr)


if __name__ == "__main__":
    main()
