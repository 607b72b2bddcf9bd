"""Repository names (DESIGN, "Object store layout", "External interfaces"; seed 001)."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from enroute_core.base.errors import InvalidName
from enroute_core.state.names import (
    check_repo_name,
    layer_key,
    layers_prefix,
    maintainer_key,
    repo_name_from_storage,
    repo_name_from_url,
    repo_name_problem,
    state_key,
    storage_segment,
    sweep_key,
    trash_key,
    trash_prefix,
)

SEED = int(os.environ.get("ENROUTE_SEED") or secrets.randbelow(2**32))
LAYER_FILE = "0000000000000041-000102030405060708090a0b0c0d0e0f.layer"


@pytest.fixture(autouse=True)
def _show_seed() -> Iterator[None]:
    print(f"ENROUTE_SEED={SEED}")
    yield


VALID = [
    "a",
    "team/app",
    "A-b_c.d",
    "x/y/z",
    "...",
    ".hidden/x",
    "a.git/b",
    "app.gitx",
    "-x",
    "a" * 256,
]
INVALID = {
    "": "is empty",
    "a" * 257: "longer than 256",
    "/a": "empty segment",
    "a/": "empty segment",
    "a//b": "empty segment",
    "./a": "'.' segment",
    "a/..": "'..' segment",
    "a/-/b": "'-' segment",
    "-": "'-' segment",
    "a b": "holds ' '",
    "a%2Fb": "holds '%'",
    "caf\u00e9": "holds",
    "a\\b": "holds",
    "a\n": "holds",
    "app.git": "ends with '.git'",
    "team/app.git": "ends with '.git'",
}


@pytest.mark.parametrize("name", VALID)
def test_design_valid_names(name: str) -> None:
    assert repo_name_problem(name) is None
    assert check_repo_name(name) == name


@pytest.mark.parametrize(("name", "why"), sorted(INVALID.items()))
def test_design_invalid_names_raise_invalid_name_with_details(name: str, why: str) -> None:
    with pytest.raises(InvalidName) as info:
        check_repo_name(name)
    assert why in info.value.details["reason"]  # type: ignore[operator]
    assert info.value.details["name"] == name[:300]
    assert info.value.mapping.http_status == 400


def test_seed001_names_are_at_most_256_bytes() -> None:
    assert check_repo_name("a/" * 127 + "bb") == "a/" * 127 + "bb"  # 256 bytes
    with pytest.raises(InvalidName):
        check_repo_name("a/" * 128 + "b")  # 257 bytes


def test_design_url_strips_one_git_suffix() -> None:
    assert repo_name_from_url("team/app.git") == "team/app"
    assert repo_name_from_url("team/app") == "team/app"
    with pytest.raises(InvalidName):
        repo_name_from_url("team/app.git.git")
    with pytest.raises(InvalidName):
        repo_name_from_url(".git")


def test_storage_segment_is_one_segment_and_keys_follow_the_layout() -> None:
    assert storage_segment("team/app") == "team~app"
    assert state_key("team/app") == "repos/team~app/state"
    assert layers_prefix("team/app") == "repos/team~app/layers/"
    assert layer_key("team/app", LAYER_FILE) == "repos/team~app/layers/" + LAYER_FILE
    assert maintainer_key("a") == "repos/a/maintainer"
    assert sweep_key("a") == "repos/a/sweep"
    assert trash_key("team/app", 3) == "trash/team~app/0000000000000003"
    with pytest.raises(InvalidName):
        layer_key("a", "../state")
    with pytest.raises(InvalidName):
        storage_segment("a/../b")


def test_keys_of_one_repository_never_nest_in_anothers() -> None:
    """``team`` and ``team/layers`` must not share a list prefix (the layer sweep lists)."""
    names = ["team", "team/layers", "team/layers/x", "team/state", "teamx"]
    keys = {
        n: [state_key(n), maintainer_key(n), sweep_key(n), layer_key(n, LAYER_FILE)] for n in names
    }
    for name in names:
        for other in names:
            if other == name:
                continue
            for key in keys[other]:
                assert not key.startswith(layers_prefix(name))
                assert not key.startswith(trash_prefix(name))


@hypothesis_seed(SEED)
@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.text("abcXYZ019-_.", min_size=1, max_size=40).filter(
            lambda s: s not in (".", "..", "-")
        ),
        min_size=1,
        max_size=6,
    )
)
def test_storage_segment_round_trips(segments: list[str]) -> None:
    name = "/".join(segments)
    if repo_name_problem(name) is not None:
        return
    segment = storage_segment(name)
    assert "/" not in segment
    assert repo_name_from_storage(segment) == name


def test_repo_name_from_storage_refuses_what_it_never_makes() -> None:
    for bad in ("a/b", "a~~b", "~a", ""):
        with pytest.raises(InvalidName):
            repo_name_from_storage(bad)


def test_longest_keys_fit_s3_and_every_filesystem() -> None:
    """DESIGN: storage keys encode names so that a 256-byte segment fits any filesystem.
    The key is one segment here; the ``file://`` store's encoding splits it."""
    from enroute_core.storage.objectstore.base import KEY_BYTES_MAX, check_key
    from enroute_core.storage.objectstore.file import encode_key

    worst = ["Z" * 256, "a" * 256, "Q/" * 127 + "QQ", ("A.b-" * 64)[:256].rstrip(".")]
    for name in worst:
        check_repo_name(name)
        for key in (state_key(name), layer_key(name, LAYER_FILE), trash_key(name, 2**64 - 1)):
            check_key(key)
            assert len(key.encode()) <= 325 <= KEY_BYTES_MAX
            for component in encode_key(key):
                assert len(component.encode()) <= 255, component
