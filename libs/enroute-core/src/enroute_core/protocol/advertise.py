"""Ref and capability advertisements: v0/v1 for both services, v2 for upload-pack.

Layouts (Git ``Documentation/gitprotocol-http.txt``, "Smart Clients";
``gitprotocol-pack.txt``, "Reference Discovery"; ``gitprotocol-v2.txt``,
"Capability Advertisement"):

    smart-HTTP preamble   PKT-LINE("# service=git-<service>" LF) flush-pkt   (v0/v1 only)
    v1 marker             PKT-LINE("version 1" LF)
    first ref             PKT-LINE(oid SP name NUL capability-list LF)
    other refs            PKT-LINE(oid SP name LF)
    peeled tag            PKT-LINE(oid SP name "^{}" LF)          (upload-pack only)
    no refs               PKT-LINE(zero-id SP "capabilities^{}" NUL capability-list LF)
    end                   flush-pkt

    v2                    PKT-LINE("version 2" LF) *PKT-LINE(capability LF) flush-pkt

HEAD comes first when it resolves, with ``symref=HEAD:<target>`` among the
capabilities; an unborn HEAD is left out (gitprotocol-pack: "HEAD MUST NOT
appear in the advertisement list at all"). Receive-pack lists neither HEAD nor
peeled lines, as git's receive-pack does.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final, Literal

from enroute_core.base.ids import ZERO_OID
from enroute_core.git.pktline import FLUSH_PKT, pkt_text
from enroute_core.protocol._common import AGENT, OBJECT_FORMAT, Ref, RefSnapshot, hex_oid

__all__ = [
    "RECEIVE_PACK_CAPABILITIES",
    "UPLOAD_PACK_CAPABILITIES",
    "Service",
    "encode_v0_advertisement",
    "encode_v2_capabilities",
    "receive_pack_capabilities",
    "service_preamble",
    "upload_pack_capabilities",
]

Service = Literal["git-upload-pack", "git-receive-pack"]

UPLOAD_PACK_CAPABILITIES: Final[tuple[bytes, ...]] = (
    b"multi_ack_detailed",
    b"no-done",
    b"side-band-64k",
    b"ofs-delta",
    b"thin-pack",
    b"shallow",
    b"deepen-since",
    b"deepen-not",
    b"deepen-relative",
    b"no-progress",
    b"include-tag",
    b"allow-tip-sha1-in-want",
    b"allow-reachable-sha1-in-want",
    b"filter",
)
RECEIVE_PACK_CAPABILITIES: Final[tuple[bytes, ...]] = (
    b"report-status",
    b"report-status-v2",
    b"delete-refs",
    b"side-band-64k",
    b"quiet",
    b"atomic",
    b"ofs-delta",
    b"push-options",
)


def upload_pack_capabilities(snapshot: RefSnapshot, *, agent: bytes = AGENT) -> tuple[bytes, ...]:
    """The v0/v1 upload-pack list; ``symref=HEAD:`` only when HEAD resolves (as git does)."""
    symref: tuple[bytes, ...] = ()
    if snapshot.head is not None and snapshot.head_ref is not None:
        symref = (b"symref=HEAD:" + snapshot.head,)
    return (
        *UPLOAD_PACK_CAPABILITIES,
        *symref,
        b"object-format=" + OBJECT_FORMAT,
        b"agent=" + agent,
    )


def receive_pack_capabilities(*, agent: bytes = AGENT) -> tuple[bytes, ...]:
    return (*RECEIVE_PACK_CAPABILITIES, b"object-format=" + OBJECT_FORMAT, b"agent=" + agent)


def service_preamble(service: Service) -> bytes:
    """What smart HTTP puts before a v0/v1 advertisement (gitprotocol-http, "Smart Clients")."""
    return pkt_text(b"# service=" + service.encode("ascii")) + FLUSH_PKT


def encode_v0_advertisement(
    snapshot: RefSnapshot,
    service: Service,
    *,
    capabilities: Sequence[bytes] | None = None,
    version1: bool = False,
    smart_http: bool = True,
    agent: bytes = AGENT,
) -> bytes:
    """The whole v0 (or v1) advertisement of ``snapshot`` for ``service``."""
    upload = service == "git-upload-pack"
    if capabilities is None:
        capabilities = (
            upload_pack_capabilities(snapshot, agent=agent)
            if upload
            else receive_pack_capabilities(agent=agent)
        )
    refs: list[Ref] = []
    head = snapshot.head_ref
    if upload and head is not None:
        refs.append(head)
    refs.extend(snapshot.refs)
    out = [service_preamble(service)] if smart_http else []
    if version1:
        out.append(pkt_text(b"version 1"))
    caps = b" ".join(capabilities)
    if not refs:
        out.append(pkt_text(hex_oid(ZERO_OID) + b" capabilities^{}\x00" + caps))
    for index, ref in enumerate(refs):
        line = hex_oid(ref.oid) + b" " + ref.name
        out.append(pkt_text(line + b"\x00" + caps if index == 0 else line))
        if upload and ref.peeled is not None:
            out.append(pkt_text(hex_oid(ref.peeled) + b" " + ref.name + b"^{}"))
    out.append(FLUSH_PKT)
    return b"".join(out)


def encode_v2_capabilities(*, agent: bytes = AGENT, object_info: bool = False) -> bytes:
    """The v2 capability advertisement of upload-pack (no smart-HTTP preamble in v2)."""
    lines = [
        b"version 2",
        b"agent=" + agent,
        b"ls-refs=unborn",
        b"fetch=shallow wait-for-done filter",
        b"server-option",
        b"object-format=" + OBJECT_FORMAT,
    ]
    if object_info:
        lines.append(b"object-info")
    return b"".join(pkt_text(line) for line in lines) + FLUSH_PKT
