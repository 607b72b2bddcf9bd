"""Protobuf messages of the Compute service to and from the shapes gitproto serves.

Protobuf types stop here (STYLE rule 2): the Git handler and the REST API call
these helpers and see plain values. REST shapes: DESIGN.md, "External
interfaces"; times are RFC 3339 UTC with microseconds.
"""

from __future__ import annotations

import base64
import binascii
import datetime
from dataclasses import dataclass
from typing import Any

from enroute_core.base.errors import InvalidArgument
from enroute_proto.gen.enroute.common.v1 import common_pb2
from enroute_proto.gen.enroute.compute.v1 import compute_pb2

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)

SERVICE_UPLOAD_PACK = "git-upload-pack"
SERVICE_RECEIVE_PACK = "git-receive-pack"
_SERVICES = {
    SERVICE_UPLOAD_PACK: compute_pb2.GIT_SERVICE_UPLOAD_PACK,
    SERVICE_RECEIVE_PACK: compute_pb2.GIT_SERVICE_RECEIVE_PACK,
}
FILE_MODES = (0o100644, 0o100755, 0o120000)


def rfc3339_us(time_us: int) -> str:
    """``2026-12-02T16:48:51.123456Z``: exact integer arithmetic, no float rounding."""
    moment = _EPOCH + datetime.timedelta(microseconds=time_us)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# Git streams


@dataclass(frozen=True, slots=True)
class GitHeader:
    """What gitproto learned from the HTTP request (GitRequestHeader)."""

    repo: str
    service: str
    git_protocol: str
    content_encoding: str
    principal: str
    user_agent: str
    content_length_bytes: int | None


@dataclass(frozen=True, slots=True)
class GitResponsePart:
    """One GitResponse: a header (content type, status) or body bytes."""

    content_type: str | None = None
    http_status: int | None = None
    body: bytes | None = None


def git_header_request(header: GitHeader) -> compute_pb2.GitRequest:
    message = compute_pb2.GitRequestHeader(
        repo=header.repo,
        service=_SERVICES[header.service],
        git_protocol=header.git_protocol,
        content_encoding=header.content_encoding,
        principal=header.principal,
        user_agent=header.user_agent,
    )
    if header.content_length_bytes is not None:
        message.content_length_bytes = header.content_length_bytes
    return compute_pb2.GitRequest(header=message)


def git_body_request(chunk: bytes) -> compute_pb2.GitRequest:
    return compute_pb2.GitRequest(body=chunk)


def git_response_part(message: compute_pb2.GitResponse) -> GitResponsePart:
    which = message.WhichOneof("part")
    if which == "header":
        return GitResponsePart(
            content_type=message.header.content_type or None,
            http_status=message.header.http_status or None,
        )
    if which == "body":
        return GitResponsePart(body=message.body)
    return GitResponsePart()


# Repository API


def repository_json(state: common_pb2.RepositoryState) -> dict[str, Any]:
    last_push = rfc3339_us(state.last_push_us) if state.HasField("last_push_us") else None
    return {
        "name": state.name,
        "head": state.head.decode("utf-8", "replace"),
        "incarnation": state.incarnation,
        "last_push": last_push,
        "deleted": state.deleted,
    }


def refs_json(chunks: list[compute_pb2.ListRefsResponse]) -> dict[str, Any]:
    refs = [
        {
            "name": ref.name.decode("utf-8", "replace"),
            "oid": ref.oid.hex(),
            "updated_at": rfc3339_us(ref.set_time_us),
        }
        for chunk in chunks
        for ref in chunk.refs
    ]
    return {"refs": refs}


def create_repository_request(
    name: str, default_branch: str
) -> compute_pb2.CreateRepositoryRequest:
    return compute_pb2.CreateRepositoryRequest(
        repo=name, default_branch=default_branch.encode("utf-8")
    )


def get_repository_request(name: str) -> compute_pb2.GetRepositoryRequest:
    return compute_pb2.GetRepositoryRequest(repo=name)


def delete_repository_request(name: str) -> compute_pb2.DeleteRepositoryRequest:
    return compute_pb2.DeleteRepositoryRequest(repo=name)


def list_repositories_request(limit: int, page_token: str) -> compute_pb2.ListRepositoriesRequest:
    return compute_pb2.ListRepositoriesRequest(limit=limit, page_token=page_token)


def list_repositories_json(response: compute_pb2.ListRepositoriesResponse) -> dict[str, Any]:
    return {
        "repos": [repository_json(state) for state in response.repositories],
        "next_page_token": response.next_page_token or None,
    }


def list_refs_request(name: str) -> compute_pb2.ListRefsRequest:
    return compute_pb2.ListRefsRequest(repo=name)


def _field(body: dict[str, Any], key: str, kind: type, *, required: bool) -> Any:
    value = body.get(key)
    if value is None:
        if required:
            raise InvalidArgument(f"{key!r} is required", field=key)
        return None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise InvalidArgument(f"{key!r} must be a {kind.__name__}", field=key)
    return value


def _signature(body: dict[str, Any], key: str, *, required: bool) -> compute_pb2.Signature | None:
    value = _field(body, key, dict, required=required)
    if value is None:
        return None
    name = _field(value, "name", str, required=True)
    email = _field(value, "email", str, required=True)
    return compute_pb2.Signature(name=name.encode("utf-8"), email=email.encode("utf-8"))


def _oid(value: str, key: str) -> bytes:
    if len(value) != 40 or any(c not in "0123456789abcdefABCDEF" for c in value):
        raise InvalidArgument(f"{key!r} must be 40 hex digits", field=key)
    return bytes.fromhex(value)


def _mode(value: object, path: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise InvalidArgument("'mode' must be an octal string such as \"100644\"", path=path)
    try:
        mode = int(str(value), 8)
    except ValueError:
        mode = -1
    if mode not in FILE_MODES:
        raise InvalidArgument(
            f"mode {value!r} of {path!r} is not 100644, 100755 or 120000", path=path
        )
    return mode


def _change(item: object) -> compute_pb2.FileChange:
    if not isinstance(item, dict):
        raise InvalidArgument("each change must be an object", field="changes")
    path = _field(item, "path", str, required=True)
    change = compute_pb2.FileChange(path=path.encode("utf-8"))
    content = _field(item, "content_base64", str, required=False)
    if content is not None:
        try:
            change.content = base64.b64decode(content, validate=True)
        except (binascii.Error, ValueError):
            raise InvalidArgument(f"content_base64 of {path!r} is not base64", path=path) from None
    if item.get("mode") is not None:
        change.mode = _mode(item["mode"], path)
    return change


def create_commit_request(name: str, body: object) -> compute_pb2.CreateCommitRequest:
    """The CreateCommit call of a REST commit body; InvalidArgument names the bad field."""
    if not isinstance(body, dict):
        raise InvalidArgument("the request body must be a JSON object")
    branch = _field(body, "branch", str, required=True)
    message = _field(body, "message", str, required=False) or ""
    changes = _field(body, "changes", list, required=False) or []
    request = compute_pb2.CreateCommitRequest(
        repo=name,
        branch=branch.encode("utf-8"),
        message=message.encode("utf-8"),
        author=_signature(body, "author", required=True),
        changes=[_change(item) for item in changes],
    )
    expected = _field(body, "expected_oid", str, required=False)
    if expected is not None:
        request.expected_oid = _oid(expected, "expected_oid")
    committer = _signature(body, "committer", required=False)
    if committer is not None:
        request.committer.CopyFrom(committer)
    return request


def create_commit_json(response: compute_pb2.CreateCommitResponse) -> dict[str, Any]:
    """The commit, and the harmless fsck findings on what it added (docs/security.md)."""
    warnings = [
        {"msg_id": w.msg_id, "count": w.count, "example": w.example.hex()}
        for w in response.warnings
    ]
    return {"oid": response.oid.hex(), "tree": response.tree.hex(), "warnings": warnings}
