"""Configuration: YAML plus ENROUTE_ overrides; unknown keys are errors (DESIGN "Configuration")."""

from __future__ import annotations

from pathlib import Path

import pytest

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.limits import DEFAULT_LIMITS, MiB
from enroute_core.config import load_config, parse_bytes, parse_seconds, render_config_reference


def test_defaults_match_the_seeds() -> None:
    c = load_config(None, {})
    assert c.node.page_cache == 256 * MiB  # seed 004: default 256 MiB
    assert c.node.disk_cache is None  # seed 004: default unbounded
    assert c.layers.upload_window == 64  # DESIGN: default 64
    assert c.auth.anonymous == "none"


def test_file_and_environment_override() -> None:
    text = "node:\n  page_cache: 1GiB\nlayers:\n  sweep_retention: 2h\n"
    c = load_config(text, {"ENROUTE_NODE__PAGE_CACHE": "512MiB", "HOME": "/x"})
    assert c.node.page_cache == 512 * MiB
    assert c.layers.sweep_retention == 7200.0
    c = load_config(None, {"ENROUTE_LEDGER__MEMBERS": "[a:7000, b:7000]"})
    assert c.ledger.members == ("a:7000", "b:7000")


@pytest.mark.parametrize(
    ("text", "env", "key"),
    [
        ("node:\n  page_cahce: 1GiB\n", {}, "node.page_cahce"),
        ("nodes: {}\n", {}, "nodes"),
        (None, {"ENROUTE_NODE__PAGECACHE": "1"}, "node.pagecache"),
        ("node:\n  page_cache: lots\n", {}, "node.page_cache"),
        ("auth:\n  anonymous: everyone\n", {}, "auth.anonymous"),
        ("layers:\n  sweep_interval: soon\n", {}, "layers.sweep_interval"),
    ],
)
def test_unknown_or_bad_keys_are_errors(text: str | None, env: dict[str, str], key: str) -> None:
    with pytest.raises(InvalidArgument) as info:
        load_config(text, env)
    assert info.value.details["key"] == key


def test_store_options_are_checked() -> None:
    c = load_config("store:\n  url: s3://b/p\n  options: {attempts_max: 3}\n", {})
    assert c.store.store_options().attempts_max == 3
    with pytest.raises(InvalidArgument):
        load_config("store:\n  options: {attempts: 3}\n", {})
    with pytest.raises(InvalidArgument):
        load_config("- a\n- b\n", {})
    with pytest.raises(InvalidArgument):
        load_config(None, {"ENROUTE_NODE": "x"})


def test_units() -> None:
    assert parse_bytes("4KiB") == 4096 and parse_bytes("1MB") == 1_000_000
    assert parse_bytes(10) == 10
    assert parse_seconds("100ms") == pytest.approx(0.1) and parse_seconds("5m") == 300.0
    with pytest.raises(ValueError):
        parse_bytes("12 parsecs")


DOC = Path(__file__).resolve().parents[4] / "docs" / "configuration.md"


def test_configuration_reference_is_current() -> None:
    assert DOC.read_text() == render_config_reference(), (
        "docs/configuration.md is stale: python -m enroute_core.config > docs/configuration.md"
    )


def test_limits_section_overrides_named_limits_with_sizes() -> None:
    config = load_config("limits:\n  ingest_pack_bytes_max: 2GiB\n  protocol_haves_max: 10\n", {})
    limits = config.resource_limits()
    assert limits.ingest_pack_bytes_max == 2 * 1024**3
    assert limits.protocol_haves_max == 10
    assert limits.object_bytes_max == DEFAULT_LIMITS.object_bytes_max


def test_limits_section_refuses_unknown_and_negative_limits() -> None:
    with pytest.raises(InvalidArgument, match="unknown limit"):
        load_config("limits:\n  haves_max: 10\n", {})
    with pytest.raises(InvalidArgument, match="non-negative"):
        load_config("limits:\n  protocol_haves_max: -1\n", {})
    env = {"ENROUTE_LIMITS__PROTOCOL_WANTS_MAX": "7"}
    assert load_config(None, env).resource_limits().protocol_wants_max == 7


def test_limits_section_refuses_a_deflate_level_zlib_lacks() -> None:
    """zlib's levels are 0-9 (zlib.h, ``deflateInit``): a larger one would fail the first
    fetch that rewrites a delta, so the configuration is refused instead."""
    assert (
        load_config("limits:\n  serve_deflate_level: 9\n", {}).resource_limits().serve_deflate_level
        == 9
    )
    with pytest.raises(InvalidArgument, match="not a zlib level"):
        load_config("limits:\n  serve_deflate_level: 10\n", {})
