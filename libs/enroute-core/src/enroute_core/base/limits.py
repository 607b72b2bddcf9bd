"""One frozen value that bounds every parser, queue, cache, stream and retry.

STYLE rule 5: units last in names; over a bound raises
:class:`~enroute_core.base.errors.LimitExceeded`, never grows without end.
"""

from __future__ import annotations

from dataclasses import dataclass

from enroute_core.base.errors import LimitExceeded

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


@dataclass(frozen=True, slots=True)
class Limits:
    # git: objects
    object_bytes_max: int = 2 * GiB
    object_header_bytes_max: int = 64
    tree_entries_max: int = 1_000_000
    commit_parents_max: int = 100_000
    ref_name_bytes_max: int = 4096
    # git: pkt-line (gitprotocol-common: 65520 bytes with the 4-byte length)
    pkt_line_bytes_max: int = 65520
    # git: packs and deltas
    pack_objects_max: int = 100_000_000
    pack_bytes_max: int = 64 * GiB
    delta_bytes_max: int = 4 * GiB
    delta_chain_depth_max: int = 10_000
    # repositories (seed 001, "Limits": names are at most 256 bytes)
    repo_name_bytes_max: int = 256
    # layers (seed 004, "Stable object numbering": a 32-bit id space)
    layer_objects_max: int = 2**32 - 1
    # storage.layer: metadata is pinned in memory while a layer is open
    layer_meta_bytes_max: int = 16 * GiB
    # git/packindexer.py: inflated delta bases kept while resolving a pack
    # (git's core.deltaBaseCacheLimit is 96 MiB)
    pack_base_cache_bytes_max: int = 96 * MiB
    # git/packindexer.py: threads indexing a pack (git's pack.threads): the calling one reads
    # and inflates in order, the others apply deltas and hash without the interpreter lock;
    # at most the machine's cores; 1 indexes in the calling thread alone (docs/native.md)
    pack_index_threads_max: int = 4
    # state/codec.py: log commands and checkpoints of the repository state
    state_command_bytes_max: int = 64 * MiB
    state_checkpoint_bytes_max: int = 4 * GiB
    state_ref_updates_max: int = 1_000_000
    state_refs_max: int = 100_000_000
    state_layers_max: int = 1_000_000
    state_change_bytes_max: int = 128 * MiB
    # enroute_ledger.storage: the ledger's log and state stores
    ledger_record_bytes_max: int = 64 * MiB + 64 * KiB
    ledger_state_key_bytes_max: int = 64 * KiB
    ledger_commit_bytes_max: int = 64 * MiB
    ledger_commit_batches_max: int = 4096
    ledger_queue_batches_max: int = 65536
    # SQLite's page cache, per connection of a voter's store (two). The file's pages stay
    # in the kernel's page cache anyway; SQLite's default (2,000 KiB) filled as the store
    # grew to about 2,000 repositories and showed as RSS per idle repository (issue 19)
    ledger_store_page_cache_bytes: int = 256 * KiB
    # RPC between Enroute processes (enroute_proto.channels): one gRPC message, sent or
    # received. gRPC's own default (4 MiB) is below what the bounds above let through
    # (a log command or record, a subscribed change, an API commit's contents), so that
    # a legal request would fail as RESOURCE_EXHAUSTED; the bounds above bind first.
    rpc_message_bytes_max: int = 160 * MiB
    # engine/ingest.py: one pushed pack turned into one pushed layer (seed 004 "Pages and
    # memory": a 128 MiB cache per concurrent ingest)
    ingest_objects_max: int = 50_000_000
    ingest_pack_bytes_max: int = 16 * GiB
    ingest_body_cache_bytes_max: int = 128 * MiB
    ingest_segment_members_max: int = 500_000_000
    # enroute_compute.push: pushes whose ingest starts at the pack's first chunk and indexes
    # it as it arrives (git's index-pack --stdin; docs/ingest.md, "Speed"), each holding an
    # ingest thread while its client sends (at most half of them; 0 turns streaming off);
    # one whose pack is not all in within the deadline is cut off and ingests once it is
    ingest_streams_max: int = 4
    ingest_stream_receive_ms_max: int = 600_000
    # protocol: lists in one wire-protocol request (advertise, ls-refs, fetch, receive)
    protocol_wants_max: int = 100_000
    protocol_haves_max: int = 100_000
    protocol_shallows_max: int = 100_000
    protocol_deepen_nots_max: int = 1024
    protocol_ref_prefixes_max: int = 65536
    protocol_capabilities_max: int = 256
    protocol_server_options_max: int = 256
    protocol_push_commands_max: int = 100_000
    protocol_push_options_max: int = 256
    # storage/heap.py: glibc's malloc thresholds in the compute and gitproto, fixed
    # (0: glibc's own, which maps each block over 128 KiB afresh and gives a heap's top
    # back at once): pack pieces of 256-512 KiB cost page faults per piece otherwise
    # (issue 25, docs/serving.md). Blocks under the first come from the heap; up to the
    # second of free memory stays at a heap's top.
    heap_mmap_threshold_bytes: int = 4 * MiB
    heap_trim_threshold_bytes: int = 32 * MiB
    # glibc's malloc arenas (0: glibc's own, 8 per core). Fewer keep less free memory
    # around what threads leave alive, and make the threads wait on each other's
    # arenas: with 2, a compute kept 92-116 MiB after the large profile's push instead
    # of 136-145, and spent 8% more CPU on a large clone (docs/ingest.md, "Memory").
    heap_arenas_max: int = 0
    # engine/view.py: the object and entry caches of a view built outside a host (a
    # compute's views share the node's, sized by node.cache: docs/buffer-pool.md)
    view_body_cache_bytes_max: int = 64 * MiB
    # enroute_compute.host: the views a compute keeps open are a cache (issue 19,
    # docs/fleet.md): a view unused for view_idle_ms_max is evicted and its ledger
    # subscription ended, and while more than views_open_max are open or their bytes
    # (layer metadata, inline layers and a fixed cost each) pass views_bytes_max, the
    # least recently used go. The next request opens the view again (a subscribe and a
    # state fetch).
    views_open_max: int = 10_000
    views_bytes_max: int = 256 * MiB
    view_idle_ms_max: int = 600_000
    # storage/machines.py, engine/serve.py (seed 004, "Never waiting on the object
    # store"): entry bytes the pack writer loads ahead of what it writes (one batch is
    # written while the next loads; both stay pinned), and the load rounds one read
    # may take (a tree walk takes one per level of trees)
    serve_read_ahead_bytes: int = 4 * MiB
    read_load_rounds_max: int = 4096
    # engine/view.py: the zlib level (0-9) of the full entry a fetch sends for a stored delta
    # whose base it does not send (gitformat-pack). Deflating is nearly all of such a
    # fetch's CPU: a depth-1 clone of the `large` profile rewrites 9,949 deltas, 261 MB
    # inflated, in 14 s at zlib's default (6, git's pack.compression) and in 3 s at 1,
    # for a pack 13% larger (docs/serving.md, "Rewritten deltas")
    serve_deflate_level: int = 1
    # storage/pool.py EntrySpill: bytes of such full entries a large fetch (a scan) keeps
    # in one file under node.data_dir for the next fetch of the same tips; past it the
    # file starts afresh (0: none kept). A repeated depth-1 clone of the `large` profile
    # reads its 155 MB of them instead of deflating them again. Under node.disk_cache the
    # compute keeps it within a quarter of that budget.
    serve_entry_spill_bytes_max: int = 1 * GiB
    # enroute_ledger.machine: request ids a group remembers, by log index, so that a
    # re-proposed copy of an entry applies once (docs/raft.md, "Applying each id once").
    # Part of the replicated state: every voter must use the same value.
    ledger_dedup_window_entries: int = 1024
    # enroute_ledger.rpc.servicer: unanswered proposals one ProposeStream holds; past it
    # the member reads no more of that stream until some are answered (docs/rpc.md,
    # ProposeStream), so one compute cannot queue unbounded work on a member
    ledger_stream_proposals_max: int = 1024
    # storage/maintenance.py: files a sweep record lists, and layer keys one sweep lists
    sweep_record_entries_max: int = 1_000_000
    sweep_listed_keys_max: int = 10_000_000
    # validation (git/fsck.py, engine/ingest.py): pushed objects checked as git fsck does.
    # Tree nesting (git's core.maxTreeDepth is 2048) and one name's length (fsck's
    # largePathname, 4096 bytes).
    tree_depth_max: int = 2048
    tree_entry_name_bytes_max: int = 4096
    # A pack entry that inflates to more than pack_inflate_free_bytes must inflate at most
    # pack_inflate_ratio_max times its deflated bytes (a zlib bomb is refused while inflating;
    # 0 turns the ratio check off).
    pack_inflate_ratio_max: int = 256
    pack_inflate_free_bytes: int = 16 * MiB
    # The result sizes the deltas of one pack declare, added up as each delta is read and
    # before any is applied, may pass pack_delta_expansion_free_bytes by at most
    # pack_delta_expansion_ratio_max bytes per byte of the pack (a delta bomb: a few KiB of
    # copy instructions declaring GiBs; 0 turns the ratio check off). Ingest caps the free
    # bytes at its memory budget, ingest_body_cache_bytes_max. docs/security.md has the
    # ratios of real packs.
    pack_delta_expansion_ratio_max: int = 1024
    pack_delta_expansion_free_bytes: int = 128 * MiB
    # A full blob entry of a pushed pack that inflates to more than this is hashed as it
    # inflates and copied into the layer as it is, never held whole (git's
    # core.bigFileThreshold; docs/ingest.md, "Delta bombs and large objects"). A delta or a
    # delta base over it is still resolved whole.
    pack_stream_threshold_bytes: int = 16 * MiB
    # A .gitmodules blob is read whole to be checked; a larger one is refused (gitmodulesLarge).
    gitmodules_bytes_max: int = 1 * MiB
    # The .gitmodules blobs one push's trees name, added up before each is parsed: git's config
    # syntax costs up to ~2 s of CPU per MiB to read (bare keys), and a history can name
    # thousands of versions of the file (typical ones parse at ~0.5 s per MiB). A history over
    # it pushes in parts (docs/security.md, "Limits").
    ingest_gitmodules_bytes_max: int = 16 * MiB
    # A .gitattributes blob is read whole to be checked; a larger one is refused
    # (gitattributesLarge). Git's clients refuse to read one over 100 MiB (ATTR_MAX_FILE_SIZE):
    # a larger setting lets through what every client refuses.
    gitattributes_bytes_max: int = 100 * MiB


DEFAULT_LIMITS = Limits()


def check_limit(limit: str, value: int, maximum: int) -> None:
    """Raise ``LimitExceeded`` naming ``limit`` when ``value`` is over ``maximum``."""
    if value > maximum:
        raise LimitExceeded(limit, value, maximum)
