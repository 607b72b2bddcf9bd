"""The OpenAPI 3.1 document of REST /api/v1, served at /api/v1/openapi.json.

Paths are written whole (``/api/v1/repos``) so a reader needs no server URL to resolve them.
"""

from __future__ import annotations

from typing import Any

_TIME = {"type": "string", "format": "date-time", "example": "2026-12-02T16:48:51.123456Z"}
_OID = {"type": "string", "pattern": "^[0-9a-f]{40}$"}
_ERROR = {
    "description": "error",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}
_NAME = {
    "name": "name", "in": "path", "required": True,
    "description": "repository name; '/' as it is or as %2F",
    "schema": {"type": "string", "maxLength": 256},
}  # fmt: skip


def _json(ref: str, description: str) -> dict[str, Any]:
    schema = {"$ref": f"#/components/schemas/{ref}"}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


OPENAPI: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "Enroute", "version": "1"},
    "servers": [{"url": "/"}],
    "paths": {
        "/api/v1/repos": {
            "post": {
                "summary": "Create a repository (an existing one is answered unchanged)",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CreateRepository"}}}},
                "responses": {"201": _json("Repository", "created"),
                              "200": _json("Repository", "exists"), "400": _ERROR},
            },
            "get": {
                "summary": "List repositories in byte order of names",
                "parameters": [
                    {"name": "limit", "in": "query", "schema": {"type": "integer", "minimum": 0}},
                    {"name": "page_token", "in": "query", "schema": {"type": "string"}},
                ],
                "responses": {"200": _json("RepositoryPage", "one page"), "400": _ERROR},
            },
        },
        "/api/v1/repos/{name}": {
            "parameters": [_NAME],
            "get": {"summary": "Describe a repository",
                    "responses": {"200": _json("Repository", "the repository"),
                                  "404": _ERROR, "400": _ERROR}},
            "delete": {"summary": "Delete a repository (also when missing)",
                       "responses": {"204": {"description": "deleted"}, "400": _ERROR}},
        },
        "/api/v1/repos/{name}/-/refs": {
            "parameters": [_NAME],
            "get": {"summary": "Refs with their update times",
                    "responses": {"200": _json("Refs", "refs"), "404": _ERROR}},
        },
        "/api/v1/repos/{name}/-/commits": {
            "parameters": [_NAME],
            "post": {
                "summary": "Apply a change set and move a branch by compare-and-swap",
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"$ref": "#/components/schemas/CreateCommit"}}}},
                "responses": {"201": _json("Commit", "committed"), "409": _ERROR,
                              "400": _ERROR, "404": _ERROR},
            },
        },
    },
    "components": {"schemas": {
        "Repository": {"type": "object", "properties": {
            "name": {"type": "string"}, "head": {"type": "string"},
            "incarnation": {"type": "integer"}, "last_push": {"oneOf": [_TIME, {"type": "null"}]},
            "deleted": {"type": "boolean"}}},
        "RepositoryPage": {"type": "object", "properties": {
            "repos": {"type": "array", "items": {"$ref": "#/components/schemas/Repository"}},
            "next_page_token": {"type": ["string", "null"]}}},
        "CreateRepository": {"type": "object", "required": ["name"], "properties": {
            "name": {"type": "string"}, "default_branch": {"type": "string"}}},
        "Refs": {"type": "object", "properties": {"refs": {"type": "array", "items": {
            "type": "object", "properties": {"name": {"type": "string"}, "oid": _OID,
                                             "updated_at": _TIME}}}}},
        "Signature": {"type": "object", "required": ["name", "email"], "properties": {
            "name": {"type": "string"}, "email": {"type": "string"}}},
        "CreateCommit": {"type": "object", "required": ["branch", "author", "changes"],
                         "properties": {
            "branch": {"type": "string"}, "expected_oid": {"oneOf": [_OID, {"type": "null"}]},
            "message": {"type": "string"}, "author": {"$ref": "#/components/schemas/Signature"},
            "committer": {"$ref": "#/components/schemas/Signature"},
            "changes": {"type": "array", "items": {"type": "object", "required": ["path"],
                "properties": {"path": {"type": "string"},
                               "content_base64": {"type": ["string", "null"]},
                               "mode": {"type": "string",
                                        "enum": ["100644", "100755", "120000"]}}}}}},
        "Commit": {"type": "object", "properties": {"oid": _OID, "tree": _OID,
            "warnings": {"type": "array", "description": "harmless fsck findings on the "
                         "objects the commit added, one per git fsck message id, as a push "
                         "shows them (remote: warning: ...); docs/security.md",
                         "items": {"type": "object", "properties": {
                "msg_id": {"type": "string", "example": "gitmodulesParse"},
                "count": {"type": "integer", "minimum": 1}, "example": _OID}}}}},
        "Error": {"type": "object", "properties": {"error": {"type": "object", "properties": {
            "code": {"type": "string"}, "message": {"type": "string"},
            "details": {"type": "object"}}}}},
    }},
}  # fmt: skip
