"""The v2 ``ls-refs`` command: its arguments and its response.

Layout (Git ``Documentation/gitprotocol-v2.txt``, "ls-refs"):

    arguments   "symrefs" | "peel" | "unborn" | "ref-prefix" SP <prefix>
    output      *ref-line flush-pkt
    ref-line    PKT-LINE(obj-id-or-unborn SP refname *(SP ref-attribute) LF)
    ref-attribute = "symref-target:" <target> | "peeled:" <oid>
    obj-id-or-unborn = obj-id | "unborn"

HEAD comes first, then the refs in byte order. A ref is listed when no
prefix was given or its name starts with one of them. ``unborn HEAD`` is sent
only when the client asked for ``unborn`` and HEAD names a missing branch.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from enroute_core.base.errors import ProtocolError
from enroute_core.base.limits import Limits
from enroute_core.git.pktline import DELIM_PKT, FLUSH_PKT, pkt_text
from enroute_core.protocol._common import (
    AGENT,
    OBJECT_FORMAT,
    Ref,
    RefSnapshot,
    agent_of,
    bounded_append,
    hex_oid,
    server_options,
)

__all__ = [
    "LsRefsBuilder",
    "LsRefsRequest",
    "encode_ls_refs_request",
    "encode_ls_refs_response",
]


@dataclass(frozen=True, slots=True)
class LsRefsRequest:
    symrefs: bool = False
    peel: bool = False
    unborn: bool = False
    ref_prefixes: tuple[bytes, ...] = ()
    agent: bytes | None = None
    server_options: tuple[bytes, ...] = ()


class LsRefsBuilder:
    """Collects ``ls-refs`` arguments one line at a time, bounding the prefixes."""

    __slots__ = ("_caps", "_flags", "_limits", "_prefixes")

    def __init__(self, capabilities: tuple[bytes, ...], limits: Limits) -> None:
        self._caps = capabilities
        self._limits = limits
        self._flags: set[bytes] = set()
        self._prefixes: list[bytes] = []

    def add(self, line: bytes) -> None:
        if line in (b"symrefs", b"peel", b"unborn"):
            self._flags.add(line)
        elif line.startswith(b"ref-prefix "):
            bounded_append(
                self._prefixes,
                line[len(b"ref-prefix ") :],
                "protocol_ref_prefixes_max",
                self._limits.protocol_ref_prefixes_max,
            )
        else:
            raise ProtocolError(f"ls-refs: unexpected argument {line[:80]!r}")

    def finish(self) -> LsRefsRequest:
        return LsRefsRequest(
            symrefs=b"symrefs" in self._flags,
            peel=b"peel" in self._flags,
            unborn=b"unborn" in self._flags,
            ref_prefixes=tuple(self._prefixes),
            agent=agent_of(self._caps),
            server_options=server_options(self._caps, self._limits),
        )


def _wanted(name: bytes, prefixes: tuple[bytes, ...]) -> bool:
    return not prefixes or any(name.startswith(p) for p in prefixes)


def _ref_line(ref: Ref, request: LsRefsRequest, symref_target: bytes | None) -> bytes:
    line = hex_oid(ref.oid) + b" " + ref.name
    if request.symrefs and symref_target is not None:
        line += b" symref-target:" + symref_target
    if request.peel and ref.peeled is not None:
        line += b" peeled:" + hex_oid(ref.peeled)
    return pkt_text(line)


def encode_ls_refs_response(request: LsRefsRequest, snapshot: RefSnapshot) -> bytes:
    out: list[bytes] = []
    if snapshot.head is not None and _wanted(b"HEAD", request.ref_prefixes):
        head = snapshot.head_ref
        if head is not None:
            out.append(_ref_line(head, request, snapshot.head))
        elif request.unborn:
            line = b"unborn HEAD"
            if request.symrefs:
                line += b" symref-target:" + snapshot.head
            out.append(pkt_text(line))
    out.extend(
        _ref_line(ref, request, None)
        for ref in snapshot.refs
        if _wanted(ref.name, request.ref_prefixes)
    )
    out.append(FLUSH_PKT)
    return b"".join(out)


def encode_ls_refs_request(request: LsRefsRequest, *, agent: bytes = AGENT) -> bytes:
    """A client's ``ls-refs`` request, in the order git writes it."""
    caps: list[bytes] = [b"command=ls-refs", b"agent=" + (request.agent or agent)]
    caps.extend(b"server-option=" + o for o in request.server_options)
    caps.append(b"object-format=" + OBJECT_FORMAT)
    args: list[bytes] = []
    for flag, name in (
        (request.peel, b"peel"),
        (request.symrefs, b"symrefs"),
        (request.unborn, b"unborn"),
    ):
        if flag:
            args.append(name)
    args.extend(b"ref-prefix " + p for p in request.ref_prefixes)
    return _join(caps) + DELIM_PKT + _join(args) + FLUSH_PKT


def _join(lines: Iterable[bytes]) -> bytes:
    return b"".join(pkt_text(line) for line in lines)
