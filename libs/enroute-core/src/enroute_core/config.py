"""Node configuration: one YAML file plus ``ENROUTE_`` environment overrides.

DESIGN.md "External interfaces", Configuration: the keys named in the seeds
(``node.cache``, ``node.page_cache``, ``node.disk_cache``,
``layers.sweep_retention``, ``layers.sweep_interval``) and the ones DESIGN.md
adds, each overridable by an environment variable whose path is split on
``__`` (``ENROUTE_NODE__PAGE_CACHE=512MiB``). Unknown keys, in the file or in
the environment, are an error at startup: a typo must not silently run with
a default.

Pure: the caller reads the file and passes the environment mapping in
(STYLE rule 7), so tests and simulations build configs without touching the
process. This module sits above the layers of ``enroute_core`` because it
validates settings of several of them; no layer imports it.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.limits import GiB, KiB, MiB
from enroute_core.storage.objectstore.base import StoreOptions

ENV_PREFIX = "ENROUTE_"
_UNITS = {"": 1, "b": 1, "kib": KiB, "mib": MiB, "gib": GiB, "tib": 1024 * GiB,
          "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}  # fmt: skip
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")


def parse_bytes(value: object) -> object:
    """``256MiB``, ``1GiB``, ``500MB`` or a plain integer of bytes."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        m = _SIZE.match(value)
        if m and m.group(2).lower() in _UNITS:
            return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
        raise ValueError(f"not a byte size: {value!r} (use e.g. 256MiB, 1GiB, 4096)")
    return value


def parse_seconds(value: object) -> object:
    """``100ms``, ``30s``, ``5m``, ``1h``, ``7d`` or a plain number of seconds."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m:
            return float(m.group(1)) * _SECONDS[m.group(2)]
        raise ValueError(f"not a duration: {value!r} (use e.g. 100ms, 30s, 5m, 1h)")
    return value


Bytes = Annotated[int, BeforeValidator(parse_bytes), Field(ge=0)]
Seconds = Annotated[float, BeforeValidator(parse_seconds), Field(ge=0)]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NodeConfig(_Section):
    """Seed 004 "Pages and memory" and "Disk budget"."""

    id: str = ""
    data_dir: str = "./.enroute"
    # object cache (3/4) and entry cache (1/4), charged to the page-cache budget
    cache: Bytes = 256 * MiB
    page_cache: Bytes = 256 * MiB
    # None = unbounded: local copies hydrate in the background
    disk_cache: Bytes | None = None


class LayersConfig(_Section):
    """DESIGN "Repository state" (the upload window) and seed 001 (sweep times)."""

    upload_window: int = Field(default=64, ge=1)
    # a pushed layer up to this size travels in the log entry (DESIGN "Repository state")
    inline_max: Bytes = Field(default=512 * KiB, ge=0, le=4 * MiB)
    sweep_retention: Seconds = 3600.0
    sweep_interval: Seconds = 600.0


class LedgerConfig(_Section):
    """DESIGN "Freezing the ledger" and the Raft timing of the ledger voters."""

    checkpoint_entries: int = Field(default=10_000, ge=1)
    checkpoint_interval: Seconds = 300.0
    tick_interval: Seconds = 0.1
    election_ticks: int = Field(default=10, ge=2)
    heartbeat_ticks: int = Field(default=1, ge=1)
    # host:port of every ledger voter's gRPC endpoint (static discovery)
    members: tuple[str, ...] = ()


class ComputeConfig(_Section):
    """Where gitproto finds computes (static discovery); rendezvous hashing picks one."""

    # host:port of every compute's gRPC endpoint
    members: tuple[str, ...] = ()


class StoreConfig(_Section):
    """The object store: a ``file://`` directory or ``s3://bucket/prefix``."""

    url: str = "file://./.enroute/store"
    # fields of StoreOptions (timeouts, retries, credentials, multipart sizes)
    options: dict[str, Any] = Field(default_factory=dict)

    def store_options(self) -> StoreOptions:
        try:
            opts = StoreOptions(**self.options)
        except TypeError as e:
            known = ", ".join(f.name for f in dataclasses.fields(StoreOptions))
            raise InvalidArgument(
                f"store.options: {e}; known keys: {known}", key="store.options"
            ) from None
        opts.check()
        return opts


class AuthConfig(_Section):
    """DESIGN "External interfaces", Auth."""

    anonymous: Literal["none", "read", "write"] = "none"
    tokens_file: str | None = None


class ListenConfig(_Section):
    """Where this process listens; ``:0`` picks a free port."""

    http: str = ""
    grpc: str = ""


class Config(_Section):
    node: NodeConfig = NodeConfig()
    layers: LayersConfig = LayersConfig()
    ledger: LedgerConfig = LedgerConfig()
    compute: ComputeConfig = ComputeConfig()
    store: StoreConfig = StoreConfig()
    auth: AuthConfig = AuthConfig()
    listen: ListenConfig = ListenConfig()


def load_config(text: str | None, env: Mapping[str, str]) -> Config:
    """Validate a YAML document with ``ENROUTE_`` overrides from ``env`` applied on top.

    Raises ``InvalidArgument`` naming the first bad key and what is wrong with it.
    """
    data: object = yaml.safe_load(text) if text else {}
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise InvalidArgument("the configuration file must be a mapping of sections")
    for name, raw in sorted(env.items()):
        if name.startswith(ENV_PREFIX):
            _apply_env(data, name, raw)
    try:
        config = Config.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"])
        raise InvalidArgument(f"config key {key}: {first['msg']}", key=key) from None
    config.store.store_options()
    return config


def _apply_env(data: dict[str, Any], name: str, raw: str) -> None:
    path = [p.lower() for p in name[len(ENV_PREFIX) :].split("__")]
    if len(path) < 2 or not all(path):
        raise InvalidArgument(f"{name}: use ENROUTE_<SECTION>__<KEY>", key=name)
    node = data
    for part in path[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise InvalidArgument(f"{name}: {part} is not a section", key=name)
        node = child
    try:
        node[path[-1]] = yaml.safe_load(raw) if raw.strip() else raw
    except yaml.YAMLError:
        node[path[-1]] = raw
