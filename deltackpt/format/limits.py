"""Hard limits every reader enforces before allocating anything (spec/FORMAT.md, "Limits")."""

FORMAT_VERSION = 3
# versions this code reads; it writes FORMAT_VERSION into new repositories and keeps an existing
# repository's version (a version-1 repository stays readable by version-1 readers, a version-2
# one by version-2 readers: its index files stay version 1)
READABLE_VERSIONS = (1, 2, 3)
"""The one on-disk format version this code writes and reads."""

MAX_CHUNK_BYTES = 64 * 1024 * 1024
"""A chunk's raw length: 16x the largest target chunk size, so a decoder never allocates more."""

DEFAULT_CHUNK_BYTES = 2 * 1024 * 1024
"""Target chunk size: small enough that a layer restore and dedup are fine-grained, large enough
that zstd and per-object overhead stay negligible (measured in bench/, see the spec)."""

MAX_OBJECT_PARAMS_BYTES = 4096
"""Codec parameters are a few ids and integers; 4 KiB leaves room and bounds a hostile header."""

MAX_PACK_HEADER_BYTES = 64 * 1024 * 1024
"""A pack header lists its objects: an entry is at most 59 bytes of msgpack (two 16-byte ids,
five integers), so 64 MiB holds at least 1.1 million entries, above PACK_MAX_OBJECTS."""

PACK_TARGET_BYTES = 64 * 1024 * 1024
"""Writers close a pack once its objects reach this size: a save writes a handful of files."""

PACK_MAX_OBJECTS = 100_000
"""Writers also close a pack at this many objects, so its header (<= 5.9 MB) stays far below
MAX_PACK_HEADER_BYTES whatever the object sizes."""

MAX_PACK_BYTES = 1 << 40
"""Offsets in a pack are u64 but a pack is never above 1 TiB."""

MAX_MANIFEST_BYTES = 256 * 1024 * 1024
"""A chunk reference costs about 24 bytes of msgpack and a tensor entry about 200, so 256 MiB
holds e.g. 100k tensors (20 MB) with 9 million chunk references (~216 MB): an 18 TiB state at
the default chunk size."""

MAX_INDEX_BYTES = 1024 * 1024 * 1024
"""An index file for a whole repository after gc."""

MAX_TENSOR_ELEMENTS = 1 << 48
"""Shape products above this are refused before any arithmetic on them."""

MAX_NDIM = 64
"""torch itself caps dimensions at 64."""

MAX_MSGPACK_DEPTH = 512
"""Nesting of the saved tree; deeper trees are refused at save and at load.  Tuples (msgpack ext
payloads, decoded one at a time, never recursively: format/tree.py) count as levels too."""

MAX_TUPLE_PAYLOAD_BYTES = 4 * MAX_MANIFEST_BYTES
"""A tuple's payload is copied once more for every tuple around it, so a manifest of N bytes
nesting tuples k deep costs k*N bytes of copying: the payloads summed over all tuples of one
manifest stay under 1 GiB (writers refuse a tree above it), which bounds the work of a decode to a
few times a maximal manifest's, whatever the nesting (a legitimate tree is far below: a 4 MiB
tree inside 120 tuples sums to 480 MiB)."""

MAX_CHAIN_DEPTH = 1024
"""A delta chain longer than this is corrupt (writers keep it at the keyframe interval)."""

MAX_CONFIG_BYTES = 64 * 1024
"""The config is a map of half a dozen short fields (~150 bytes)."""

MAX_REF_BYTES = 4096
"""A ref file is one version id and a newline."""

MAX_EVENT_BYTES = 64 * 1024
"""An event record (a rollback or a drill, spec/FORMAT.md "Event records"): a few dozen short
fields, at most EVENT_MAX_VALUES recent values and EVENT_MAX_VERSIONS version ids (~36 KiB)."""

EVENT_MAX_VALUES = 64
"""The (step, value) pairs a rollback record keeps of the series that fired."""

EVENT_MAX_VERSIONS = 1024
"""Version ids a rollback record lists as abandoned (33 bytes each in msgpack)."""

EVENT_MAX_TEXT = 2048
"""Characters of any text field of an event record (an error message, a metric name)."""

MAX_NAME_LENGTH = 128
"""Ref and tag names."""

DEFAULT_KEYFRAME_INTERVAL = 8
"""At most this many deltas between keyframes of a chunk (restoring decodes <= K+1 objects)."""

MAX_KEYFRAME_INTERVAL = 1024
"""The largest keyframe interval a config may hold: a chain stays within MAX_CHAIN_DEPTH."""
