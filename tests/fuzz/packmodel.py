"""Structure-aware pack mutation: a pack as a list of entries, mutated, then framed again.

Seeds are real packs (``git pack-objects`` output in
``libs/enroute-core/tests/git/testdata``) and packs our writer makes.
Mutating the model instead of the bytes keeps the framing valid (zlib
streams, headers, trailer) so that the inputs reach delta application,
base resolution and the object parsers, not only the framing checks.
"""

from __future__ import annotations

import hashlib
import struct
import zlib
from dataclasses import dataclass, replace

from fuzzkit import PACK_DATA, fuzz_bytes, mutated
from hypothesis import strategies as st

from enroute_core.base.ids import ObjectId
from enroute_core.base.limits import Limits
from enroute_core.git.commit import Commit, Identity
from enroute_core.git.delta import create_delta
from enroute_core.git.object_type import ObjectType
from enroute_core.git.objects import object_id
from enroute_core.git.pack import OBJ_OFS_DELTA, OBJ_REF_DELTA, encode_ofs_distance, iter_entries
from enroute_core.git.packindexer import index_pack
from enroute_core.git.packwrite import worthwhile_delta, write_pack
from enroute_core.git.source import BytesSource
from enroute_core.git.tree import MODE_FILE, Tree, TreeEntry


@dataclass(frozen=True, slots=True)
class Entry:
    type_num: int
    data: bytes
    base_index: int | None = None  # OFS_DELTA: index of the base entry
    base_oid: bytes | None = None  # REF_DELTA
    declared: int | None = None  # a size header that lies; None: len(data)
    raw_stream: bytes | None = None  # replaces the zlib stream when set
    base_body: bytes | None = None  # what the delta applies to in the seed
    ofs_shift: int = 0  # moves an OFS_DELTA base off the start of its entry


@dataclass(frozen=True, slots=True)
class PackModel:
    entries: tuple[Entry, ...]
    count: int | None = None  # header count that lies
    version: int = 2
    reseal: bool = True


def entry_header(type_num: int, size: int) -> bytes:
    out = bytearray()
    byte = (type_num << 4) | (size & 0x0F)
    size >>= 4
    while size:
        out.append(byte | 0x80)
        byte = size & 0x7F
        size >>= 7
    out.append(byte)
    return bytes(out)


def build(model: PackModel) -> bytes:
    count = len(model.entries) if model.count is None else model.count
    out = bytearray(b"PACK" + struct.pack(">II", model.version, count))
    offsets: list[int] = []
    for index, e in enumerate(model.entries):
        offsets.append(len(out))
        head = entry_header(e.type_num, len(e.data) if e.declared is None else e.declared)
        if e.type_num == OBJ_OFS_DELTA:
            base = e.base_index if e.base_index is not None else index
            distance = offsets[index] - offsets[base] if base < index else offsets[index] + 7
            head += encode_ofs_distance(max(distance + e.ofs_shift, 1))
        elif e.type_num == OBJ_REF_DELTA:
            head += (e.base_oid or bytes(20))[:20].ljust(20, b"\0")
        stream = e.raw_stream if e.raw_stream is not None else zlib.compress(e.data)
        out += head + stream
    if model.reseal:
        out += hashlib.sha1(out).digest()
    else:
        out += bytes(20)
    return bytes(out)


def model_of(pack: bytes, known: dict[ObjectId, tuple[int, bytes]]) -> PackModel:
    offsets: dict[int, int] = {}
    oids = [o.oid for o in index_pack(BytesSource(pack)).objects]
    entries = []
    for index, e in enumerate(iter_entries(BytesSource(pack))):
        offsets[e.offset] = index
        h = e.header
        base_index = offsets[h.base_offset] if h.base_offset is not None else None
        base_oid = h.base_oid or (oids[base_index] if base_index is not None else None)
        base_body = known[ObjectId(base_oid)][1] if base_oid is not None else None
        entries.append(Entry(h.type_num, e.data, base_index, h.base_oid, base_body=base_body))
    return PackModel(tuple(entries))


def objects_of(
    pack: bytes, external: dict[ObjectId, tuple[int, bytes]] | None = None
) -> dict[ObjectId, tuple[int, bytes]]:
    found: dict[ObjectId, tuple[int, bytes]] = {}

    def keep(index: int, oid: ObjectId, type_num: int, body: bytes) -> None:
        found[oid] = (type_num, body)

    store = external or {}
    index_pack(BytesSource(pack), on_object=keep, external_base=store.get)
    return found


# -- seeds ----------------------------------------------------------------------------------


def _writer_pack() -> bytes:
    """A small history our writer packs with deltas: two commits, trees, blobs, a tag."""
    me = Identity(b"A U Thor", b"a@example.com", 1_700_000_000, b"+0000")
    blob1 = b"".join(b"line %d\n" % i for i in range(200))
    blob2 = blob1.replace(b"line 7\n", b"line seven\n")
    tree1 = Tree.build([TreeEntry(MODE_FILE, b"a.txt", object_id(ObjectType.BLOB, blob1))])
    tree2 = Tree.build([TreeEntry(MODE_FILE, b"a.txt", object_id(ObjectType.BLOB, blob2))])
    t1, t2 = tree1.serialize(), tree2.serialize()
    c1 = Commit.create(
        tree=object_id(ObjectType.TREE, t1), author=me, committer=me, message=b"one\n"
    ).serialize()
    c2 = Commit.create(
        tree=object_id(ObjectType.TREE, t2),
        parents=(object_id(ObjectType.COMMIT, c1),),
        author=me,
        committer=me,
        message=b"two\n",
    ).serialize()
    tag = (
        b"object " + object_id(ObjectType.COMMIT, c2).hex().encode() + b"\ntype commit\n"
        b"tag v1\ntagger A U Thor <a@example.com> 1700000000 +0000\n\nv1\n"
    )
    objects = [(1, c2), (1, c1), (4, tag), (2, t2), (2, t1), (3, blob1), (3, blob2)]
    return write_pack(objects, delta=worthwhile_delta)


GIT_PACKS = [(PACK_DATA / n).read_bytes() for n in ("small-ofs.pack", "small-ref.pack")]
WRITER_PACKS = [
    _writer_pack(),
    write_pack(objects_of(GIT_PACKS[0]).values(), delta=worthwhile_delta, ofs_delta=False),
]
SEED_PACKS = GIT_PACKS + WRITER_PACKS
KNOWN: dict[ObjectId, tuple[int, bytes]] = {}
for _pack in SEED_PACKS:
    KNOWN.update(objects_of(_pack))
SEED_MODELS = [model_of(p, KNOWN) for p in SEED_PACKS]


def _resolution_models() -> list[PackModel]:
    """Valid packs that take the indexer's rarer paths: a delta chain three deep, a
    REF_DELTA before its base and an OFS_DELTA on that delta (both wait), and a thin
    pack whose REF_DELTA base is only in the store."""
    v = [b"".join(b"line %d of 0\n" % i for i in range(120))]
    for r in range(1, 4):
        v.append(v[-1].replace(b"line %d of 0" % (r * 7), b"line %d of %d" % (r * 7, r)))
    d = [create_delta(v[i], v[i + 1]) for i in range(3)]
    deltas = (Entry(OBJ_OFS_DELTA, d[i], base_index=i, base_body=v[i]) for i in range(3))
    chain = PackModel((Entry(3, v[0]), *deltas))
    v0_oid = object_id(ObjectType.BLOB, v[0])
    forward = PackModel(
        (
            Entry(OBJ_REF_DELTA, d[0], base_oid=v0_oid, base_body=v[0]),
            Entry(OBJ_OFS_DELTA, d[1], base_index=0, base_body=v[1]),
            Entry(3, v[0]),
        )
    )
    stored_oid, (_, stored) = next((o, k) for o, k in KNOWN.items() if k[0] == 3)
    thin_target = stored + b"one more line\n"
    thin = PackModel(
        (
            Entry(OBJ_REF_DELTA, create_delta(stored, thin_target), base_oid=stored_oid,
                  base_body=stored),
            Entry(OBJ_OFS_DELTA, create_delta(thin_target, v[0]), base_index=0,
                  base_body=thin_target),
        )
    )  # fmt: skip
    return [chain, forward, thin]


for _model in _resolution_models():
    _pack = build(_model)
    KNOWN.update(objects_of(_pack, external=KNOWN))
    SEED_PACKS.append(_pack)
    SEED_MODELS.append(_model)
KNOWN_OIDS = sorted(KNOWN)

# Limits small enough for the seed packs to reach them: chains of 2, a cache of 64 bytes
# (bases rebuilt), objects and deltas of 4 KiB, 12 entries.
SMALL_LIMITS = Limits(
    delta_chain_depth_max=2,
    pack_base_cache_bytes_max=64,
    object_bytes_max=4096,
    delta_bytes_max=4096,
    pack_objects_max=12,
)

HUGE_SIZES = (1 << 20, (1 << 31) - 1, 1 << 31, 1 << 32, 1 << 40, (1 << 63) - 1, 1 << 64, 1 << 66)


@st.composite
def _delta_for(draw: st.DrawFn, entry: Entry) -> bytes:
    """A delta that applies to the entry's base (or another known object), maybe mutated."""
    base = entry.base_body
    if base is None or draw(st.integers(0, 3)) == 3:
        base = KNOWN[draw(st.sampled_from(KNOWN_OIDS))][1]
    target = draw(st.sampled_from([base[: len(base) // 2], base + b"tail", b"", base * 3]))
    delta = create_delta(base, target)
    return delta if draw(st.booleans()) else draw(mutated([delta], 3))


@st.composite
def _mutate_entry(draw: st.DrawFn, model: PackModel, count: int) -> PackModel:
    entries = list(model.entries)
    if not entries:
        return model
    i = draw(st.integers(0, len(entries) - 1))
    e = entries[i]
    action = draw(st.integers(0, 9))
    if action == 0:
        e = replace(e, data=draw(mutated([e.data], 3)))
    elif action == 1:
        lie = draw(st.sampled_from(HUGE_SIZES) | st.integers(0, len(e.data) + 2))
        e = replace(e, declared=lie)
    elif action == 2:
        e = replace(e, type_num=draw(st.integers(0, 7)))
    elif action == 3:
        shift = draw(st.sampled_from([0, 0, 0, 1, -1, 3]))
        e = replace(
            e, type_num=OBJ_OFS_DELTA, base_index=draw(st.integers(0, count)), ofs_shift=shift
        )
    elif action == 4:
        oid = draw(st.sampled_from(KNOWN_OIDS) | st.binary(min_size=20, max_size=20))
        e = replace(e, type_num=OBJ_REF_DELTA, base_oid=oid)
    elif action == 5 and e.type_num >= OBJ_OFS_DELTA:
        e = replace(e, data=draw(_delta_for(e)))
    elif action == 6:
        stream = zlib.compress(e.data)
        cut = draw(st.sampled_from([stream[:-1], stream[:2], stream + b"junk", stream[2:], b""]))
        e = replace(e, raw_stream=cut)
    elif action == 7:
        entries.insert(draw(st.integers(0, len(entries))), e)
    elif action == 8 and len(entries) > 1:
        del entries[i]
        return replace(model, entries=tuple(entries))
    elif action == 9:
        j = draw(st.integers(0, len(entries) - 1))
        entries[i], entries[j] = entries[j], entries[i]
        return replace(model, entries=tuple(entries))
    entries[i] = e
    return replace(model, entries=tuple(entries))


@st.composite
def pack_models(draw: st.DrawFn) -> PackModel:
    model = draw(st.sampled_from(SEED_MODELS))
    for _ in range(draw(st.integers(0, 3))):
        model = draw(_mutate_entry(model, len(model.entries)))
    if draw(st.integers(0, 9)) == 0:
        model = replace(
            model, count=draw(st.sampled_from([0, 1, 0xFFFFFFFF, len(model.entries) + 1]))
        )
    if draw(st.integers(0, 19)) == 7:
        model = replace(model, version=draw(st.sampled_from([0, 1, 3, 4, 0xFFFFFFFF])))
    if draw(st.integers(0, 9)) == 7:
        model = replace(model, reseal=False)
    return model


def packs() -> st.SearchStrategy[bytes]:
    """Model mutations mostly, byte mutations (trailer fixed or not) and raw bytes too."""
    return st.one_of(
        pack_models().map(build),
        pack_models().map(build),
        pack_models().map(build),
        fuzz_bytes(SEED_PACKS).map(reseal),
        fuzz_bytes(SEED_PACKS),
    )


def reseal(pack: bytes) -> bytes:
    """Make the trailer the SHA-1 of what precedes it (so byte mutations get past it)."""
    if len(pack) < 32:
        return pack
    return pack[:-20] + hashlib.sha1(pack[:-20]).digest()


def edge_cases(model: PackModel, index: int) -> list[PackModel]:
    """Entry ``index`` of ``model`` at each edge compiled code must leave to the reference:
    lying sizes (one off, zero, past 56 and 64 bits), cut, damaged and padded streams, bad
    types, OFS bases off their entry or gone."""
    e = model.entries[index]
    stream = zlib.compress(e.data)
    variants = [
        *(replace(e, declared=d) for d in (len(e.data) - 1, len(e.data) + 1, 0, 1 << 40)),
        *(replace(e, declared=(1 << shift) + len(e.data)) for shift in (56, 57, 60, 63, 66)),
        replace(e, raw_stream=stream[:-4]),
        replace(e, raw_stream=stream[:-1] + bytes([stream[-1] ^ 1])),
        replace(e, raw_stream=stream + b"junk"),
        replace(e, raw_stream=b"\x78\x9c" + bytes(8)),
        replace(e, raw_stream=b""),
        *(replace(e, type_num=t) for t in (0, 5)),
    ]
    if e.type_num == 6:
        variants += [replace(e, ofs_shift=s) for s in (-(1 << 20), 1, 1 << 20)]
        variants.append(replace(e, base_index=None))
    entries = list(model.entries)
    out = []
    for v in variants:
        entries[index] = v
        out.append(replace(model, entries=tuple(entries)))
    return out
