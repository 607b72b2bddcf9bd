"""Layer files: the ``ENRLAYR1`` format, its writer and its reader (seed 004, "Layers").

Byte layout and decisions: ``docs/formats/layer.md``.
"""

from enroute_core.storage.layer.commits import CommitGraph, CommitInfo, CommitRecord, GraphCommit
from enroute_core.storage.layer.format import (
    CHUNK_BYTES,
    REF_EXTERNAL,
    REF_NONE,
    Kind,
    LayerKind,
    layer_key_name,
)
from enroute_core.storage.layer.reader import LayerReader, ObjectRecord, root_of
from enroute_core.storage.layer.writer import (
    EntryRun,
    LayerEntry,
    LayerWriter,
    SealedLayer,
    write_layer,
)

__all__ = [
    "CHUNK_BYTES",
    "REF_EXTERNAL",
    "REF_NONE",
    "CommitGraph",
    "CommitInfo",
    "CommitRecord",
    "EntryRun",
    "GraphCommit",
    "Kind",
    "LayerEntry",
    "LayerKind",
    "LayerReader",
    "LayerWriter",
    "ObjectRecord",
    "SealedLayer",
    "layer_key_name",
    "root_of",
    "write_layer",
]
