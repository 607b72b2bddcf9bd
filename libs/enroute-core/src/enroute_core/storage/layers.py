"""The storage service facade: open, load and publish layers by repository and key.

Seed 004, "Storage service": the engine asks storage to read a stored layer
wherever it is, to load bytes before reading them, and to publish a sealed
layer (put in the object store and keep a local copy). "Files and tiers": one
opener per layer, opened layers kept for reuse; a copy is found in the node
catalog first. "Linked local copies": on a ``file://`` store the copy is a
hard link (made under scratch, renamed into place), read-only, with every
chunk, outside the disk budget; EXDEV turns linking off for the process. A
copy recorded as linked is trusted only while it shares the stored file's
inode. An inline layer opens only after its bytes match its root
(:func:`open_inline`).
"Metadata is always local": a remote open is one ranged read of
``[meta_base, file_size)``, ``meta_base`` being ``file_size - meta_size``
rounded down to the 1 MiB chunk, as :meth:`LayerReader.open` expects.
"Disk budget": without one, an incomplete copy is hydrated in the background;
with one, nothing loads in the background, only what is loaded is fetched, and
every non-linked copy is a :class:`BudgetedCopy` of the node's one
:class:`DiskBudget` (linked copies are registered as linked: outside it). A
load pins its chunks before it fetches and returns the pins (:class:`LoadPins`)
for the reader to release after reading ("Pins"); metadata chunks stay pinned
while the layer is open; entry reads take an ``intent`` ("Intent steers
eviction") and every pread is epoch-checked ("Races").
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import hashlib
import logging
import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from enroute_core.base.errors import (
    CorruptData,
    InvalidArgument,
    NotLocal,
    PreconditionFailed,
    Unavailable,
)
from enroute_core.base.limits import DEFAULT_LIMITS, Limits
from enroute_core.git.source import BytesSource
from enroute_core.storage.budgeted import BudgetedCopy, LoadPins
from enroute_core.storage.catalog import Catalog
from enroute_core.storage.diskbudget import (
    CHUNK_BYTES,
    ChunkPins,
    DiskBudget,
    DiskBudgetStats,
    chunk_count_of,
    chunks_of_bitmap,
)
from enroute_core.storage.layer.reader import LayerReader, root_of
from enroute_core.storage.loads import ChunkLoader, LoadGate, coalesce
from enroute_core.storage.localcopy import LocalCopy
from enroute_core.storage.localfile import (
    ScratchFile,
    hole_punch_supported,
    remove_scratch_leftovers,
    scratch_name,
)
from enroute_core.storage.objectstore.base import ObjectStore
from enroute_core.storage.pool import DEFAULT_PAGE_CACHE_BYTES, BufferPool, Intent

log = logging.getLogger(__name__)

_PUBLISHED_KEPT = 4096
"""Names LayerService keeps of linked layers it published and has not opened (about 100
bytes each): enough for the pushes between a publish and the view's open of it."""

LOAD_KIND: contextvars.ContextVar[str] = contextvars.ContextVar("load_kind", default="other")
"""The kind of request whose reads load chunks (fetch, plan, refs, push, api): what
``/status`` and the metrics count loads by. Set by the request's driver; tasks it
spawns inherit it."""


@dataclass(frozen=True, slots=True)
class LayerStats:
    links: int
    hydrations: int
    hydrations_active: int
    loads_in_flight: int
    gets: int
    bytes_fetched: int
    chunks_fetched: int
    chunks_dropped: int
    hash_retries: int
    linking: bool
    disk_budget: DiskBudgetStats | None = None
    loaded_chunks: dict[str, int] | None = None
    """Chunks reads loaded (seed 004, "Machines"), by request kind (:data:`LOAD_KIND`)."""
    loaded_bytes: dict[str, int] | None = None
    layers_open: int = 0
    """Stored layers open here (reader, metadata, pool file): what an idle node holds."""
    layers_closed: int = 0
    """Stored layers closed by :meth:`LayerService.close_layer` (their views went)."""


class OpenLayer:
    """A layer opened by the service: its reader reads local bytes only."""

    def __init__(
        self,
        name: str,
        key: str,
        reader: LayerReader,
        copy: LocalCopy,
        loader: ChunkLoader,
        *,
        budget: DiskBudget | None = None,
    ) -> None:
        self.name = name
        self.key = key
        self.reader = reader
        self.copy = copy
        self.loader = loader
        self.budget = budget

    @property
    def linked(self) -> bool:
        return self.copy.linked

    def chunks_needed(self, offset: int, length: int) -> list[int]:
        """Chunks a read would need that are not local, without reading ("Residency")."""
        return self.copy.missing(self.reader.data_chunks_for(offset, length))

    def entry_chunks(self, local_index: int) -> range:
        rec = self.reader.record(local_index)
        return self.reader.data_chunks_for(rec.offset, rec.length)

    def entry_bytes(self, local_index: int, intent: Intent = Intent.POINT) -> bytes:
        """The stored entry; ``NotLocal`` when it was not loaded first (or was evicted).

        "Intent steers eviction": a point read marks its chunks referenced
        before the (epoch-checked) preads; a scan leaves them cold.
        """
        if self.budget is not None and isinstance(self.copy, BudgetedCopy):
            rec = self.reader.record(local_index)
            chunks = self.reader.data_chunks_for(rec.offset, rec.length)
            self.budget.touch(self.name, chunks, intent)
            # -- pool: a page still in the pool must not hide a chunk that left the disk
            # ("Never waiting on the object store": reading what was not loaded fails).
            missing = self.copy.missing(chunks)
            if missing:
                raise NotLocal(f"{self.name}: chunks {missing[:8]} are not local")
            # -- end pool
        return self.reader.entry_bytes(local_index, intent)  # pool: intent


class LayerService:
    """Local copies under ``data_dir`` of layers in ``store``; one instance per node."""

    def __init__(
        self,
        store: ObjectStore,
        data_dir: str | os.PathLike[str],
        *,
        disk_budget_bytes: int | None = None,
        gate: LoadGate | None = None,
        disk_budget: DiskBudget | None = None,
        page_cache_bytes: int = DEFAULT_PAGE_CACHE_BYTES,
        pool: BufferPool | None = None,
    ) -> None:
        # -- pool: one buffer pool per node (seed 004, "Pages and memory", node.page_cache);
        # every opened layer reads through it and closing the layer closes its pool file.
        self.pool = pool if pool is not None else BufferPool(page_cache_bytes)
        # -- end pool
        self._store = store
        self._dir = os.fspath(data_dir)
        self._copies = os.path.join(self._dir, "copies")
        self._scratch = os.path.join(self._dir, "scratch")
        os.makedirs(self._copies, exist_ok=True)
        os.makedirs(self._scratch, exist_ok=True)
        self.scratch_leftovers = remove_scratch_leftovers(self._scratch)
        """(files, bytes) of scratch files an earlier run left, removed at start."""
        if self.scratch_leftovers[0]:
            log.info(
                "removed %d scratch files (%d bytes) an earlier run left in %s",
                *self.scratch_leftovers, self._scratch,
            )  # fmt: skip
        self.catalog = Catalog(self._dir)
        self._budget = disk_budget_bytes
        self.budget: DiskBudget | None = disk_budget
        if self.budget is None and disk_budget_bytes is not None:
            self.budget = DiskBudget(disk_budget_bytes)
        if self.budget is not None:
            self._budget = self.budget.budget_bytes
            if self._budget is not None and not hole_punch_supported(self._copies):
                self.budget.stop_evicting()
                log.warning(
                    "node.disk_cache is %d bytes, but the filesystem of %s cannot punch "
                    "holes: the disk budget will not evict, and local copies can grow past it",
                    self._budget, self._copies,
                )  # fmt: skip
        self._gate = gate or LoadGate()
        self._opening: dict[str, asyncio.Future[OpenLayer]] = {}
        self._hydrating: set[asyncio.Task[None]] = set()
        self._linking = True
        self._links = 0
        self._published: dict[str, None] = {}
        """Linked layers this process published and has not opened since: their stored
        file holds bytes written here (LocalCopy.known). The first open takes the name
        out; the oldest goes past _PUBLISHED_KEPT (a layer another compute serves)."""
        self._hydrations = 0
        self._closed = 0
        self.loaded_chunks: Counter[str] = Counter()
        """Chunks :meth:`load` found missing and fetched, by request kind (:data:`LOAD_KIND`)."""
        self.loaded_bytes: Counter[str] = Counter()

    # -- names ------------------------------------------------------------------------------

    @staticmethod
    def name_of(repo: str, key: str) -> str:
        """A file name for a layer of ``repo`` ("Files and tiers": named by repository and id)."""
        if not repo or "/" in repo or repo.startswith("."):
            raise InvalidArgument("repository name is not a safe file name", repo=repo)
        return f"{repo}/{hashlib.sha256(key.encode()).hexdigest()[:40]}"

    def path_of(self, name: str) -> str:
        return os.path.join(self._copies, name)

    # -- open -------------------------------------------------------------------------------

    async def open_layer(self, repo: str, key: str, file_size: int, meta_size: int) -> OpenLayer:
        """The open layer; concurrent opens of one layer share one opener."""
        name = self.name_of(repo, key)
        fut = self._opening.get(name)
        if fut is None:
            fut = asyncio.get_running_loop().create_future()
            self._opening[name] = fut
            try:
                fut.set_result(await self._open(name, key, file_size, meta_size))
            except BaseException as e:
                del self._opening[name]
                fut.set_exception(e)
                fut.exception()  # retrieved: the opener re-raises below
                raise
        return await asyncio.shield(fut)

    async def _open(self, name: str, key: str, file_size: int, meta_size: int) -> OpenLayer:
        path = self.path_of(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        copy = await self._existing(name, key, path, file_size, meta_size)
        if copy is None and self._linking and await self._link(name, key, path, file_size):
            copy = self._linked(name, path, file_size)
        if copy is not None:
            reader = await self._open_reader(copy, meta_size, name)
            if reader is None:
                self._discard(name, copy)
                copy = None
        if copy is None or reader is None:
            if self.budget is not None:
                meta = _meta_chunks(file_size, meta_size)
                copy = BudgetedCopy.create_budgeted(self.budget, name, path, file_size, meta)
            else:
                copy = LocalCopy.create_sparse(path, file_size)
            try:
                await self._fetch_meta(key, copy, meta_size)
            except BaseException:
                self._discard(name, copy)
                raise
            self.catalog.put(name, file_size, copy.bitmap(), False)
            try:
                reader = await asyncio.to_thread(self._reader_of, copy, meta_size, name)
            except BaseException:
                self._discard(name, copy)
                raise
        layer = self._layer(name, key, reader, copy)
        if self._budget is None and not copy.complete():
            self._hydrate(layer)
        return layer

    def _discard(self, name: str, copy: LocalCopy) -> None:
        """Close a copy that failed to open; it leaves the budget (BudgetedCopy.close)."""
        copy.close()
        if copy.linked and self.budget is not None:
            self.budget.unregister(name)

    def _linked(self, name: str, path: str, size: int) -> LocalCopy:
        copy = LocalCopy.open_linked(path, size)
        copy.known = name in self._published
        self._published.pop(name, None)
        if self.budget is not None:  # outside the budget ("Linked local copies")
            self.budget.register(name, path, size, linked=True)
        return copy

    async def _existing(
        self, name: str, key: str, path: str, size: int, meta_size: int
    ) -> LocalCopy | None:
        rec = self.catalog.get(name)
        if rec is None or rec.length != size or not os.path.exists(path):
            return None
        if rec.linked:
            return await self._relinked(name, key, path, size)
        present = chunks_of_bitmap(rec.bitmap, chunk_count_of(size))
        if self.budget is not None:
            return BudgetedCopy.open_budgeted(
                self.budget,
                name,
                path,
                size,
                _meta_chunks(size, meta_size),
                present=present,
                checked=self.catalog.written_here(rec),
            )
        return LocalCopy.open_existing(
            path, size, present=present, checked=self.catalog.written_here(rec)
        )

    # -- pool: readers open on the node's pool
    def _reader_of(self, copy: LocalCopy, meta_size: int, name: str) -> LayerReader:
        return LayerReader.open(copy, meta_size=meta_size, pool=self.pool, name=name)

    # -- end pool

    async def _open_reader(self, copy: LocalCopy, meta_size: int, name: str) -> LayerReader | None:
        """Open on local metadata; the reader checks its chunks and crc ("Layers")."""
        meta = range(_meta_base(copy.size, meta_size) // CHUNK_BYTES, copy.chunk_count)
        if any(not (copy.is_present(c) or copy.is_unchecked(c)) for c in meta):
            return None
        unchecked = [c for c in meta if copy.is_unchecked(c)]
        copy.mark_present(meta)
        try:
            return await asyncio.to_thread(self._reader_of, copy, meta_size, name)
        except CorruptData:
            if copy.linked:
                raise  # the store holds the same bytes ("Linked local copies")
            if isinstance(copy, BudgetedCopy):
                return None  # the caller discards the whole copy and starts sparse
            for c in unchecked:
                copy.drop(c)
            return None

    async def _relinked(self, name: str, key: str, path: str, size: int) -> LocalCopy | None:
        """A copy recorded as linked, trusted only after an inode comparison.

        "Linked local copies": "if a link cannot be made again but the old one
        shares the inode of the stored file, the node opens it as linked, never
        for writing". One that shares it is the link already; one that does not
        (the copy was written over, the store was replaced) is never read: it is
        linked again, or else it goes and the layer opens as any other copy.
        """
        if await self._store.same_file(key, path):
            self._links += 1  # the link is there already
            return self._linked(name, path, size)
        if self._linking and await self._link(name, key, path, size):
            return self._linked(name, path, size)
        log.warning("%s: the linked copy is not the stored file any more; it goes", name)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        self.catalog.remove(name)
        return None

    async def _link(self, name: str, key: str, path: str, size: int) -> bool:
        """Link the stored file to ``path`` and record it; False when it cannot be.
        Opening the link is the caller's (:meth:`_linked`): a publish does not open it
        (it held a descriptor and a budget registration per published layer for good)."""
        scratch = os.path.join(self._scratch, scratch_name("link"))
        try:
            if not await self._store.link_local(key, scratch):
                if not getattr(self._store, "linking", False):
                    self._linking = False  # EXDEV, or a store that cannot link at all
                return False
            os.replace(scratch, path)
        finally:
            # a link made before a failure or a cancellation (shutdown) goes; so does the
            # name a rename between two links of one file leaves (it keeps both names)
            with contextlib.suppress(FileNotFoundError):
                os.unlink(scratch)
        self.catalog.put(name, size, b"", True)
        self._links += 1
        return True

    async def _fetch_meta(self, key: str, copy: LocalCopy, meta_size: int) -> None:
        """One ranged read of the metadata into the sparse copy ("Metadata is always local")."""
        if not 0 < meta_size <= copy.size:
            raise CorruptData(f"metadata size {meta_size} does not fit", section="footer")
        base = _meta_base(copy.size, meta_size)
        data = await self._store.get(key, start=base, end=copy.size)
        self._gate.stats.gets += 1
        self._gate.stats.bytes_fetched += len(data)
        if len(data) != copy.size - base:
            raise CorruptData(f"{key}: short metadata read", section="footer", key=key)
        await asyncio.to_thread(copy.write_chunks, base, data)
        copy.mark_present(range(base // CHUNK_BYTES, copy.chunk_count))

    def _layer(self, name: str, key: str, reader: LayerReader, copy: LocalCopy) -> OpenLayer:
        def recorded() -> None:
            if not copy.linked:
                self.catalog.update_bitmap(name, copy.bitmap())

        hashed = _meta_base(copy.size, copy.size - reader.data_end) // CHUNK_BYTES
        loader = ChunkLoader(
            self._store,
            key,
            copy,
            chunk_hash=reader.chunk_hash,
            hashed_chunks=hashed,
            gate=self._gate,
            on_written=recorded,
        )
        budget = self.budget if isinstance(copy, BudgetedCopy) else None
        return OpenLayer(name, key, reader, copy, loader, budget=budget)

    # -- loads ------------------------------------------------------------------------------

    def layer_named(self, name: str) -> OpenLayer | None:
        """The open layer of a file name (:attr:`LayerReader.name`), or None when it is
        not open here (closed since: a retired copy)."""
        fut = self._opening.get(name)
        if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
            return None
        return fut.result()

    async def load_named(
        self, name: str, *, local_indexes: Iterable[int] = (), chunks: Iterable[int] = ()
    ) -> LoadPins:
        """:meth:`load` by file name, as tickets name layers (``storage.machines``)."""
        layer = self.layer_named(name)
        if layer is None:  # closed meanwhile (its copy was reclaimed): the client retries
            raise Unavailable(f"{name}: the layer is not open here any more", file=name)
        return await self.load(layer, local_indexes=local_indexes, chunks=chunks)

    async def load(
        self,
        layer: OpenLayer,
        *,
        local_indexes: Iterable[int] = (),
        ranges: Iterable[tuple[int, int]] = (),
        chunks: Iterable[int] = (),
    ) -> LoadPins:
        """Make the entries and byte ranges local ("Storage service", Load).

        "Disk budget", "Pins": the chunks are pinned before anything is
        fetched (pinning waits out an eviction in flight, which lasts one
        local punch), so neither present nor freshly written chunks can be
        evicted before the caller reads them. The caller releases the
        returned pins once it has read; without a budget they hold nothing.
        """
        wanted: set[int] = set(chunks)
        for i in local_indexes:
            wanted.update(layer.entry_chunks(i))
        for offset, length in ranges:
            wanted.update(layer.reader.data_chunks_for(offset, length))
        if not wanted or layer.copy.settled():
            return LoadPins()  # a linked or complete copy: nothing to load or pin
        pins = LoadPins(self._pin(layer, wanted))
        try:
            missing = layer.copy.missing(sorted(wanted))
            if missing:
                kind = LOAD_KIND.get()
                self.loaded_chunks[kind] += len(missing)
                self.loaded_bytes[kind] += sum(
                    min(CHUNK_BYTES, layer.copy.size - c * CHUNK_BYTES) for c in missing
                )
                await layer.loader.load(missing)
        except BaseException:
            pins.release()
            raise
        return pins

    def _pin(self, layer: OpenLayer, chunks: set[int]) -> list[ChunkPins]:
        if layer.budget is None:
            return []
        pins: list[ChunkPins] = []
        try:
            for run in coalesce(chunks, layer.copy.chunk_count or 1):
                pins.append(layer.budget.pin_chunks(layer.name, run))
        except BaseException:
            for p in pins:
                p.release()
            raise
        return pins

    def _hydrate(self, layer: OpenLayer) -> None:
        self._hydrations += 1
        task = asyncio.create_task(
            layer.loader.load(range(layer.copy.chunk_count)), name=f"hydrate:{layer.name}"
        )
        self._hydrating.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._hydrating.discard(t)
            if not t.cancelled():
                t.exception()  # a failed hydration leaves the chunks to loads

        task.add_done_callback(done)

    async def wait_hydrated(self) -> None:
        """Wait for background hydrations (tests, shutdown)."""
        while self._hydrating:
            await asyncio.gather(*self._hydrating, return_exceptions=True)

    # -- scratch ----------------------------------------------------------------------------

    def scratch_file(self, prefix: str) -> ScratchFile:
        """A new file under this node's scratch directory, for one operation ("Storage service").

        Pushes spool their pack here and build their layer here; a layer file
        that :meth:`publish` takes is moved (or linked) into place, not copied
        into memory.
        """
        return ScratchFile(self._scratch, prefix)

    # -- publish ----------------------------------------------------------------------------

    async def publish(self, repo: str, key: str, sealed: bytes | str | os.PathLike[str]) -> None:
        """Put a sealed layer in the store (create only) and keep a local copy of every chunk."""
        name = self.name_of(repo, key)
        path = self.path_of(name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        size = len(sealed) if isinstance(sealed, bytes) else os.stat(sealed).st_size
        wrote = False
        try:
            if isinstance(sealed, bytes):
                await self._store.put(key, sealed, if_none_match=True)
            else:
                await self._store.put_file(key, sealed, if_none_match=True)
        except PreconditionFailed:
            # The key names the layer's root (layer_key_name): a file already there with
            # the same size is this very layer, published by a concurrent push of the
            # same objects against the same snapshot. Anything else is refused.
            found = await self._store.head(key)
            if found is None or found.size != size:
                raise
        else:
            wrote = True
        if self._linking and await self._link(name, key, path, size):
            if wrote:  # the stored file holds the bytes written here
                self._published[name] = None
                if len(self._published) > _PUBLISHED_KEPT:
                    del self._published[next(iter(self._published))]
            with contextlib.suppress(FileNotFoundError):
                if not isinstance(sealed, bytes):
                    os.unlink(sealed)
            return
        if isinstance(sealed, bytes):
            tmp = os.path.join(self._scratch, scratch_name("pub"))
            try:
                await asyncio.to_thread(_write_file, tmp, sealed)
                os.replace(tmp, path)
            except BaseException:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
                raise
        else:
            os.replace(sealed, path)
        count = chunk_count_of(size)
        self.catalog.put(name, size, bytes([0xFF]) * (count // 8) + _tail_bits(count), False)

    # -- removal ----------------------------------------------------------------------------

    async def remove_copy(self, repo: str, key: str) -> int | None:
        """Delete this node's local copy of a layer: close it, unlink the file, drop its
        catalog record ("Files and tiers": a copy is derivable data). Answers the bytes
        the file held on disk (0 when there was none), or None while the layer is being
        opened (the caller tries again later). The caller makes sure that no reader uses
        the layer any more."""
        name = self.name_of(repo, key)
        fut = self._opening.get(name)
        if fut is not None:
            if not fut.done():
                return None
            del self._opening[name]
            if not fut.cancelled() and fut.exception() is None:
                self._close_open(name, fut.result(), record=False)
        return self._unlink(name)

    def close_layer(self, repo: str, key: str) -> bool:
        """Close an open stored layer whose views went; answers False while it is being
        opened (the caller tries again later), True when it is closed or was not open.

        Seed 004, "Files and tiers": storage keeps opened layers for reuse, and "a
        local copy can go a while after its layer closes"; "Metadata is always
        local" holds for open layers only, so a closed one holds no memory here
        (reader, metadata, pool file, loader) and a later :meth:`open_layer` loads
        its metadata again: from the local copy, or by one ranged read.

        The copy stays on disk with its catalog record, except under a disk budget:
        closing takes a copy out of the budget ("Disk budget": what it counts is
        what is on disk), so a budgeted copy goes with its layer and a re-open
        starts it sparse again. Linked copies are outside the budget and stay.

        The caller makes sure that no reader uses the layer any more (read pins,
        loads in flight): a closed reader's reads fail.
        """
        name = self.name_of(repo, key)
        fut = self._opening.get(name)
        if fut is None:
            return True
        if not fut.done():
            return False
        del self._opening[name]
        if fut.cancelled() or fut.exception() is not None:
            return True
        layer = fut.result()
        budgeted = isinstance(layer.copy, BudgetedCopy)
        self._close_open(name, layer, record=not budgeted)
        self._closed += 1
        if budgeted:
            self._unlink(name)
        return True

    def _close_open(self, name: str, layer: OpenLayer, *, record: bool = True) -> None:
        """Close a layer taken out of ``_opening``: its hydration stops, its pool pages
        go and its copy leaves the budget, its bitmap recorded when ``record``."""
        for task in list(self._hydrating):
            if task.get_name() == f"hydrate:{name}":
                task.cancel()
        layer.reader.close()  # pool: its pages go
        if record and isinstance(layer.copy, BudgetedCopy):
            self.catalog.update_bitmap(name, layer.copy.bitmap())
        self._discard(name, layer.copy)

    def _unlink(self, name: str) -> int:
        """Delete a closed copy's file and catalog record; answers the bytes freed."""
        path = self.path_of(name)
        freed = 0
        try:
            st = os.stat(path)
            # A linked copy shares its blocks with the store's file: nothing is freed here.
            freed = 0 if st.st_nlink > 1 else st.st_blocks * 512
            os.unlink(path)
        except FileNotFoundError:
            pass
        self.catalog.remove(name)
        return freed

    def leftover_copies(self, repo: str, keep: Iterable[str]) -> list[str]:
        """Names of ``repo``'s local copies that a previous run of this node recorded
        (catalog writer is not this process), that this process has not opened, and
        that are not among the layer keys ``keep``: copies of layers that left the
        manifest while the node was down or before it could delete them."""
        directory = self.name_of(repo, "-").rsplit("/", 1)[0]
        kept = {self.name_of(repo, k) for k in keep}
        return [
            name
            for name in self.catalog.foreign_in(directory)
            if name not in kept and name not in self._opening
        ]

    def remove_leftover(self, name: str) -> int:
        """Delete a copy named by :meth:`leftover_copies` (never opened here)."""
        if name in self._opening:
            return 0
        return self._unlink(name)

    # -- status -----------------------------------------------------------------------------

    def stats(self) -> LayerStats:
        s = self._gate.stats
        return LayerStats(
            links=self._links,
            hydrations=self._hydrations,
            hydrations_active=len(self._hydrating),
            loads_in_flight=s.loads_in_flight,
            gets=s.gets,
            bytes_fetched=s.bytes_fetched,
            chunks_fetched=s.chunks_fetched,
            chunks_dropped=s.chunks_dropped,
            hash_retries=s.hash_retries,
            linking=self._linking,
            disk_budget=None if self.budget is None else self.budget.stats(),
            loaded_chunks=dict(self.loaded_chunks),
            loaded_bytes=dict(self.loaded_bytes),
            layers_open=self.layers_open,
            layers_closed=self._closed,
        )

    @property
    def layers_open(self) -> int:
        """Stored layers open here, or being opened."""
        return len(self._opening)

    async def close(self) -> None:
        for t in list(self._hydrating):
            t.cancel()
        await asyncio.gather(*self._hydrating, return_exceptions=True)
        for name, fut in self._opening.items():
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._close_open(name, fut.result())
        self._opening.clear()
        self.catalog.close()


def open_inline(
    data: bytes, root: bytes, meta_size: int, *, limits: Limits = DEFAULT_LIMITS
) -> LayerReader:
    """An inline layer's reader, opened only after its bytes match ``root``.

    Seed 004, "Storage service", Read: storage opens "an inline layer from its
    bytes in the log, after it checks them against the root". The bytes come
    from a ledger (a change, a snapshot's pinned entries) that this node did not
    write; a mismatch is ``CorruptData`` and the bytes are never read.
    """
    source = BytesSource(data)
    found = root_of(source)
    if found != root:
        raise CorruptData(
            f"inline layer {root.hex()[:16]}: its bytes hash to {found.hex()[:16]}",
            section="inline",
            root=root.hex(),
        )
    return LayerReader.open(source, meta_size=meta_size, limits=limits)


def _meta_base(file_size: int, meta_size: int) -> int:
    data_end = file_size - meta_size
    return data_end - data_end % CHUNK_BYTES


def _meta_chunks(file_size: int, meta_size: int) -> range:
    """The chunks "Metadata is always local" keeps pinned while the layer is open."""
    if not 0 < meta_size <= file_size:
        raise CorruptData(f"metadata size {meta_size} does not fit", section="footer")
    return range(_meta_base(file_size, meta_size) // CHUNK_BYTES, chunk_count_of(file_size))


def _tail_bits(count: int) -> bytes:
    return bytes([(1 << (count % 8)) - 1]) if count % 8 else b""


def _write_file(path: str, data: bytes) -> None:
    with open(path, "wb") as f:
        f.write(data)


__all__ = ["LayerService", "LayerStats", "LoadPins", "NotLocal", "OpenLayer", "open_inline"]
