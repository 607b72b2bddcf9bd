"""When a fetch is served from the view as it stands, without a read barrier (DESIGN
"Read path": the ref reads of a fetch need one, the objects of a pack do not), and
the plan kept for an identical request of an unchanged repository."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from enroute_compute.fetch import Fetcher
from enroute_compute.host import RepositoryHost, Snapshot
from enroute_core.base.ids import ObjectId
from enroute_core.protocol import fetch as pfetch
from enroute_core.protocol._common import RefSnapshot
from enroute_core.state import MISSING

HELD = ObjectId(b"\x01" * 20)
LACKING = ObjectId(b"\x02" * 20)


class _View:
    def contains(self, oid: ObjectId) -> bool:
        return oid == HELD


@dataclass
class _Host:
    snap: Snapshot | None
    peeks: list[str] = field(default_factory=list)
    unhost_listeners: list[object] = field(default_factory=list)

    def peek(self, name: str) -> Snapshot | None:
        self.peeks.append(name)
        return self.snap


def _fetcher(snap: Snapshot | None) -> tuple[Fetcher, _Host]:
    host = _Host(snap)
    return Fetcher(cast(RepositoryHost, host)), host


def _snap() -> Snapshot:
    return Snapshot("r", MISSING, cast(Any, _View()))


def test_wants_the_view_holds_need_no_barrier() -> None:
    snap = _snap()
    fetcher, _ = _fetcher(snap)
    assert fetcher._without_barrier("r", pfetch.FetchRequest(wants=(HELD,))) is snap
    assert fetcher._without_barrier("r", pfetch.UploadRequestV0(wants=(HELD,))) is snap


def test_a_want_the_view_lacks_reads_behind_a_barrier() -> None:
    fetcher, _ = _fetcher(_snap())
    assert fetcher._without_barrier("r", pfetch.FetchRequest(wants=(HELD, LACKING))) is None
    assert fetcher._without_barrier("r", pfetch.UploadRequestV0(wants=(LACKING,))) is None


def test_a_repository_not_hosted_yet_reads_behind_a_barrier() -> None:
    fetcher, host = _fetcher(None)
    assert fetcher._without_barrier("r", pfetch.FetchRequest(wants=(HELD,))) is None
    assert host.peeks == ["r"]


def test_requests_naming_refs_read_behind_a_barrier() -> None:
    fetcher, host = _fetcher(_snap())
    want_ref = pfetch.FetchRequest(wants=(HELD,), want_refs=(b"refs/heads/main",))
    deepen_not = pfetch.FetchRequest(wants=(HELD,), deepen=pfetch.Deepen(not_refs=(b"main",)))
    v0_not = pfetch.UploadRequestV0(wants=(HELD,), deepen=pfetch.Deepen(not_refs=(b"main",)))
    for request in (want_ref, deepen_not, v0_not):
        assert fetcher._without_barrier("r", request) is None
    assert host.peeks == [], "ref-naming requests never look at the view as it stands"


def test_the_plan_is_kept_per_state_and_request(monkeypatch: Any) -> None:
    planned: list[object] = []

    def plan_fetch(view: object, wants: list[ObjectId], haves: list[ObjectId], **kw: Any) -> Any:
        planned.append((tuple(wants), tuple(haves)))
        return object()

    monkeypatch.setattr("enroute_compute.fetch.serve.plan_fetch", plan_fetch)
    fetcher, _ = _fetcher(None)
    snap = _snap()
    refs = RefSnapshot((), None)
    request = pfetch.FetchRequest(wants=(HELD,), ofs_delta=True)
    first = fetcher._plan(snap, refs, request, [HELD], [])
    assert fetcher._plan(snap, refs, request, [HELD], []) is first
    assert fetcher._plan(snap, refs, request, [HELD], [LACKING]) is not first  # other haves
    later = Snapshot("r", MISSING.__class__(**_fields(MISSING)), snap.view)  # a new state
    assert fetcher._plan(later, refs, request, [HELD], []) is not first
    assert len(planned) == 3


def _fields(state: Any) -> dict[str, Any]:
    return {name: getattr(state, name) for name in state.__dataclass_fields__}
