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
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args, get_origin

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from enroute_core.base.errors import InvalidArgument
from enroute_core.base.limits import DEFAULT_LIMITS, GiB, KiB, Limits, MiB
from enroute_core.git.fsck import (
    FSCK_RULES,
    GIT_ATTR_FILE_BYTES_MAX,
    RECEIVE_POLICY,
    FsckMsg,
    FsckPolicy,
    Severity,
)
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

    id: str = Field(default="", description="This node's name in /status, metrics and the ledger.")
    data_dir: str = Field(default="./.enroute", description="Local state: log, layer copies.")
    cache: Bytes = Field(
        default=256 * MiB,
        description="Object cache (3/4) and entry cache (1/4), shared by every view; their "
        "bytes are charged to the buffer pool, whose budget is page_cache + cache.",
    )
    page_cache: Bytes = Field(
        default=256 * MiB,
        ge=1,
        description="Buffer pool of layer pages; the pool's budget adds node.cache, so pages "
        "keep at least this much.",
    )
    disk_cache: Bytes | None = Field(
        default=None,
        description="Disk budget of local layer copies; unset: unbounded, hydrated in the "
        "background.",
    )

    @property
    def pool_bytes(self) -> int:
        """The buffer pool's one budget (seed 004, "Why a pool": one global limit): pages
        plus the object and entry caches, which are capped at ``cache`` together, so
        pages always keep ``page_cache`` (docs/buffer-pool.md)."""
        return self.page_cache + self.cache


class LayersConfig(_Section):
    """DESIGN "Repository state" (the upload window) and seed 001 (sweep times)."""

    upload_window: int = Field(
        default=64, ge=1, description="Upload generations a published layer stays committable."
    )
    inline_max: Bytes = Field(
        default=512 * KiB,
        ge=0,
        le=4 * MiB,
        description="A pushed layer up to this size travels in the log entry, not the store.",
    )
    sweep_retention: Seconds = Field(
        default=3600.0, description="How long an unnamed layer file is kept before deletion."
    )
    sweep_interval: Seconds = Field(default=600.0, description="How often the layer sweep runs.")
    # enroute_compute.maintainer (issue "Layer maintenance")
    maintenance_interval: Seconds = Field(
        default=5.0,
        description="How often a compute looks for flushes and compactions in the repositories "
        "it hosts; 0 turns layer maintenance off.",
    )
    lease_duration: Seconds = Field(
        default=60.0,
        gt=0,
        description="How long a repository's maintenance lease lasts; renewed while held.",
    )
    lease_margin: Seconds = Field(
        default=10.0,
        description="A lease holder stops acting this long before the lease expires (clock skew "
        "between computes); less than lease_duration.",
    )
    merge_concurrency: int = Field(
        default=1, ge=1, description="Repositories one compute maintains (merges) at a time."
    )
    compaction_factor: int = Field(
        default=2,
        ge=2,
        description="Geometric compaction: each layer holds at least this many times the "
        "objects of the next newer one.",
    )
    flush_layers_min: int = Field(
        default=1, ge=1, description="Consecutive inline layers a flush waits for."
    )
    merge_objects_max: int = Field(
        default=0, ge=0, description="Most objects one compaction merges (0: no bound)."
    )

    @model_validator(mode="after")
    def _margin_fits(self) -> LayersConfig:
        if self.lease_margin >= self.lease_duration:
            raise ValueError("layers.lease_margin must be less than layers.lease_duration")
        return self


class DiscoveryConfig(_Section):
    """Members from the EndpointSlices of a Kubernetes Service (enroute_core.discovery)."""

    service: str = Field(min_length=1, description="Name of the Service whose endpoints to use.")
    namespace: str = Field(
        default="", description="Namespace of the Service; empty: this pod's own namespace."
    )
    port_name: str = Field(
        default="grpc", description="Name of the EndpointSlice port; empty: the first port."
    )
    api_url: str = Field(
        default="",
        description="Kubernetes API URL without credentials (e.g. kubectl proxy); empty: the "
        "in-cluster service account.",
    )
    watch_timeout: Seconds = Field(
        default=300.0, gt=0, description="Longest single watch request before it is renewed."
    )


class LedgerConfig(_Section):
    """DESIGN "Freezing the ledger" and the Raft timing of the ledger voters."""

    checkpoint_entries: int = Field(
        default=10_000, ge=1, description="Applied entries between checkpoints of a group."
    )
    checkpoint_interval: Seconds = Field(
        default=300.0, description="Longest time between checkpoints of a changed group."
    )
    tick_interval: Seconds = Field(default=0.1, description="One Raft tick.")
    election_ticks: int = Field(default=10, ge=2, description="Election timeout, in ticks.")
    heartbeat_ticks: int = Field(default=1, ge=1, description="Heartbeat interval, in ticks.")
    hibernate_after: Seconds = Field(
        default=3.0,
        ge=0,
        description="An idle group quiet this long keeps only a compact record in memory and is "
        "rebuilt from the log on use; 0 keeps every group in memory.",
    )
    trim_heap_after: int = Field(
        default=64,
        ge=0,
        description="Groups hibernated since the last trim after which a voter with no group "
        "awake returns its free C heap to the system (malloc_trim, logged); 0 never.",
    )
    members: tuple[str, ...] = Field(
        default=(), description="host:port of every ledger voter's gRPC endpoint."
    )
    advertise: str = Field(
        default="",
        description="host:port the other voters reach this voter's gRPC at, as given to "
        "`enroute ledger add`: a voter with a blank data directory takes the id the "
        "ledger's membership record gives this address; empty: listen.grpc.",
    )
    discovery: DiscoveryConfig | None = Field(
        default=None,
        description="Find ledger members in the EndpointSlices of a Service instead (keys: "
        "service, namespace, port_name, api_url, watch_timeout); used by computes.",
    )
    call_timeout: Seconds = Field(
        default=10.0,
        gt=0,
        description="Longest a compute waits for the ledger to answer one call (a Propose, a "
        "Barrier, a read), over every member it tries; then the call fails with a timeout.",
    )
    attempt_timeout: Seconds = Field(
        default=2.0,
        gt=0,
        description="A Propose or Barrier unanswered this long by one member is also sent to "
        "the next (same request id, so it applies once); at most call_timeout.",
    )
    drain_grace: Seconds = Field(
        default=25.0,
        ge=0,
        description="On SIGTERM a voter stops taking proposals (UNAVAILABLE: the compute asks "
        "another member), hands the groups it leads to other voters and waits this long, the "
        "hand-over included, for the proposals it took; Raft traffic flows until it exits. "
        "Default: Kubernetes' 30 s grace less 5 s to exit; the chart derives it from the pod's "
        "terminationGracePeriodSeconds less its preStop hook.",
    )


class ComputeConfig(_Section):
    """Where gitproto finds computes (rendezvous hashing picks one) and how a compute stops."""

    members: tuple[str, ...] = Field(
        default=(), description="host:port of every compute's gRPC endpoint."
    )
    discovery: DiscoveryConfig | None = Field(
        default=None,
        description="Find computes in the EndpointSlices of a Service instead (keys as "
        "ledger.discovery).",
    )
    drain_grace: Seconds = Field(
        default=25.0,
        ge=0,
        description="On SIGTERM, how long a compute waits for in-flight Git calls after it "
        "stops taking new ones (UNAVAILABLE: gitproto moves them to another compute). "
        "Default: Kubernetes' 30 s grace less 5 s to exit; the chart derives it from the pod's "
        "terminationGracePeriodSeconds.",
    )
    pack_writers: int = Field(
        default=64,
        ge=1,
        description="Packs one compute streams to clients at once; each holds a thread of its "
        "own while its client reads, so slow clients never starve other work. More wait for one.",
    )
    failover_wait: Seconds = Field(
        default=3.0,
        description="When every compute refused a call as unavailable, how long gitproto waits "
        "for a channel to one of them to connect before it tries them once more; only then "
        "does the client see the error (a restarting compute delays a request, not fails it).",
    )


class StoreConfig(_Section):
    """The object store: a ``file://`` directory or ``s3://bucket/prefix``."""

    url: str = Field(
        default="file://./.enroute/store", description="file://DIR or s3://bucket/prefix."
    )
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields of StoreOptions: timeouts, retries, credentials, multipart sizes.",
    )

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


INTERNAL_TOKEN_CHARS_MIN = 16
"""A shorter internal token is refused: a placeholder or a typo, not a secret."""


class AuthConfig(_Section):
    """DESIGN "External interfaces", Auth."""

    anonymous: Literal["none", "read", "write"] = Field(
        default="none",
        description="What a request without a token may do: none, read, or write (dev mode: "
        "every scope).",
    )
    tokens_file: str | None = Field(
        default=None,
        description="YAML file of hashed tokens (docs/access-control.md); re-read on change, "
        "Secret volume symlink swaps included.",
    )
    internal_token_file: str | None = Field(
        default=None,
        description="File holding the shared secret every internal gRPC call carries and every "
        "gRPC server requires (gitproto->compute, compute->ledger, ledger<->ledger); also the "
        "admin token of /status?repo= on computes and ledgers. Read at start; unset: internal "
        'calls unauthenticated (docs/security.md, "Internal calls").',
    )

    def internal_token(self) -> str | None:
        """The token of ``internal_token_file`` (a Secret's trailing newline dropped)."""
        path = self.internal_token_file
        if path is None:
            return None
        key = "auth.internal_token_file"
        try:
            with open(path, encoding="ascii") as f:
                token = f.read().strip()
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidArgument(f"{key} {path}: {error}", key=key) from None
        if len(token) < INTERNAL_TOKEN_CHARS_MIN or not token.isprintable() or " " in token:
            raise InvalidArgument(
                f"{key} {path}: the token must be at least {INTERNAL_TOKEN_CHARS_MIN} printable "
                "characters without spaces",
                key=key,
            )
        return token


# --- gitproto transport limits (enroute_gitproto.app / githttp; docs/access-control.md) ---
class TransportConfig(_Section):
    """Bounds gitproto enforces on every HTTP request before a compute spends anything
    (docs/access-control.md, "Hostile transport input")."""

    git_body_max: Bytes = Field(
        default=16 * GiB,
        description="Largest Git request body (a pushed pack), after gzip inflation; a larger "
        "Content-Length is refused before the body is read.",
    )
    api_body_max: Bytes = Field(
        default=64 * MiB, description="Largest /api/v1 request body (commits with file contents)."
    )
    gzip_ratio_max: int = Field(
        default=100,
        ge=1,
        description="A gzip request body may inflate to at most this many times its deflated "
        "size (plus gzip_slack); more is refused as a deflate bomb.",
    )
    gzip_slack: Bytes = Field(
        default=1 * MiB, description="Inflated bytes allowed beyond gzip_ratio_max (small bodies)."
    )
    negotiation_pkt_lines_max: int = Field(
        default=400_000,
        ge=1,
        description="Most pkt-lines in one git-upload-pack request body (wants, haves, "
        "arguments) and in the command list of a git-receive-pack body.",
    )
    requests_max: int = Field(
        default=256,
        ge=1,
        description="Git and API requests this node serves at once; more get 503 with Retry-After.",
    )
    repo_requests_max: int = Field(
        default=32,
        ge=1,
        description="Git and API requests one repository is served at once on this node; more "
        "get 503 with Retry-After.",
    )
    retry_after: Seconds = Field(
        default=5.0, description="The Retry-After a request refused for concurrency is given."
    )
    request_timeout: Seconds = Field(
        default=3600.0,
        gt=0,
        description="Longest time one Git or API request may take, body and answer included.",
    )
    body_idle_timeout: Seconds = Field(
        default=60.0,
        gt=0,
        description="Longest wait for the next bytes of a request body (slow-loris bodies).",
    )
    shutdown_grace: Seconds = Field(
        default=25.0,
        ge=0,
        description="On SIGTERM gitproto stops accepting connections and answers /readyz "
        "with 503; requests in flight may run this long, then they are cut. Keep it under "
        "the pod's terminationGracePeriodSeconds (the chart derives it from that).",
    )
    connections_max: int = Field(
        default=1024,
        ge=1,
        description="Open HTTP connections on this node. When reached, the connection waiting "
        "longest for a request head is closed for a new one; if every connection is busy with "
        "a request, the new one gets 503 at once.",
    )
    client_connections_max: int = Field(
        default=256,
        ge=0,
        description="Open HTTP connections from one client address (behind a proxy: the "
        "proxy's); more get 503 at once. 0: no bound.",
    )
    client_requests_max: int = Field(
        default=128,
        ge=0,
        description="Git and API requests in flight from one client address (behind a proxy: "
        "the proxy's); more get 503 with Retry-After. 0: no bound.",
    )
    header_timeout: Seconds = Field(
        default=20.0,
        gt=0,
        description="Longest wait for a whole request head, from the connection's start or the "
        "end of its previous request; then the connection is closed (408 if a head had begun).",
    )
    header_max: Bytes = Field(
        default=16 * KiB,
        ge=1024,
        description="Largest request head (request line and header fields); larger gets 431.",
    )


# --- end gitproto transport limits ---


# --- receive: checks of pushed objects (enroute_core.git.fsck; docs/security.md) ---
_FSCK_SEVERITIES = {"error": Severity.ERROR, "warn": Severity.WARN, "ignore": Severity.IGNORE}


def _fsck_section(value: object) -> object:
    """git's ``receive.fsck.<msg-id>``: ids matched without regard to case, as git does.
    Refused: an id git does not know (git dies), one git knows but not checked here (the
    setting would silently do nothing), and a ``fixed`` one set below ``error``."""
    if not isinstance(value, Mapping):
        return value
    ids = {m.value.lower(): m for m in FsckMsg}
    known = {msg_id.lower(): msg_id for msg_id in FSCK_RULES}
    out: dict[str, str] = {}
    for key, raw in value.items():
        msg = ids.get(str(key).lower())
        if msg is None:
            if str(key).lower() in known:
                raise ValueError(
                    f"{known[str(key).lower()]} is a git fsck message id Enroute does not "
                    "check; docs/security.md lists the ids and which are checked"
                )
            raise ValueError(f"{key!r} is not a git fsck message id; docs/security.md lists them")
        if raw not in _FSCK_SEVERITIES:
            raise ValueError(f"receive.fsck.{key} must be error, warn or ignore, not {raw!r}")
        if msg.rule.fixed and raw != "error":
            why = (
                "fatal in git"
                if msg.default_severity is Severity.FATAL
                else "an object Enroute cannot read"
            )
            raise ValueError(f"receive.fsck.{key}: {msg.value} is {why} and cannot be lowered")
        out[msg.value] = str(raw)
    return out


class ReceiveConfig(_Section):
    """How pushed objects are checked (docs/security.md, "Object checks")."""

    fsck: Annotated[dict[str, str], BeforeValidator(_fsck_section)] = Field(
        default_factory=dict,
        description="git fsck message id -> error, warn or ignore (git's receive.fsck.<msg-id>), "
        "over each id's class: errors refuse a push, harmless ids are accepted with a warning. "
        "E.g. {badTimezone: error} refuses what is harmless by default, {hasDotgit: warn} lets "
        "such trees in. Ids git marks fatal, and those of objects Enroute cannot read "
        "(missingTree, badTree, ...), cannot be lowered.",
    )

    def fsck_policy(self) -> FsckPolicy:
        """The :class:`FsckPolicy` pushes are checked with (the classes, these overrides)."""
        if not self.fsck:
            return RECEIVE_POLICY
        overrides = {key: _FSCK_SEVERITIES[raw] for key, raw in self.fsck.items()}
        return FsckPolicy(overrides=MappingProxyType(overrides))


# --- end receive ---


class LogConfig(_Section):
    """What this process logs and how (docs/logging.md)."""

    format: Literal["json", "text"] = Field(
        default="json",
        description="json: one JSON object per line (containers, log collectors); text: "
        "TIME LEVEL LOGGER MSG key=value, for a terminal (`enroute dev` writes text).",
    )
    level: Literal["debug", "info", "warning", "error"] = Field(
        default="info",
        description="The least severe level written. info holds one access line per HTTP "
        "request (gitproto) and the audit lines; debug adds health and metrics probes.",
    )


class ListenConfig(_Section):
    """Where this process listens; ``:0`` picks a free port."""

    http: str = Field(
        default="",
        description="HOST:PORT of /status, /metrics, /healthz, /readyz; on gitproto, of Git "
        "and the probes only (listen.ops).",
    )
    grpc: str = Field(default="", description="HOST:PORT of the gRPC services.")
    ops: str = Field(
        default="",
        description="gitproto only: HOST:PORT of /metrics and /status (default :9090), apart "
        "from Git so that an Ingress routing listen.http never exposes them; the Git port "
        'answers 404 for them (docs/security.md, "Operator endpoints").',
    )


def _limits_section(value: object) -> object:
    """Each key a field of :class:`Limits`; sizes may be written ``64MiB``."""
    if not isinstance(value, Mapping):
        return value
    known = {f.name for f in dataclasses.fields(Limits)}
    out: dict[str, int] = {}
    for key, raw in value.items():
        if key not in known:
            raise ValueError(f"unknown limit {key!r}; docs/configuration.md lists them")
        parsed = parse_bytes(raw)
        if not isinstance(parsed, int) or isinstance(parsed, bool) or parsed < 0:
            raise ValueError(f"limit {key} must be a non-negative integer or size")
        if key == "serve_deflate_level" and parsed > 9:
            raise ValueError(f"limit serve_deflate_level {parsed} is not a zlib level (0-9)")
        if key == "gitattributes_bytes_max" and parsed > GIT_ATTR_FILE_BYTES_MAX:
            raise ValueError(
                f"limit gitattributes_bytes_max {parsed} is over git's {GIT_ATTR_FILE_BYTES_MAX}"
                " (100MiB, ATTR_MAX_FILE_SIZE): git's clients refuse to read a larger"
                " .gitattributes, so a push must not bring one"
            )
        out[str(key)] = parsed
    return out


LimitsSection = Annotated[dict[str, int], BeforeValidator(_limits_section)]


class Config(_Section):
    node: NodeConfig = NodeConfig()
    layers: LayersConfig = LayersConfig()
    ledger: LedgerConfig = LedgerConfig()
    compute: ComputeConfig = ComputeConfig()
    store: StoreConfig = StoreConfig()
    auth: AuthConfig = AuthConfig()
    transport: TransportConfig = TransportConfig()
    receive: ReceiveConfig = ReceiveConfig()
    listen: ListenConfig = ListenConfig()
    log: LogConfig = LogConfig()
    limits: LimitsSection = Field(
        default_factory=dict, description="Overrides of the resource limits listed below."
    )

    def resource_limits(self) -> Limits:
        """The bounds every parser, queue and cache of this process enforces."""
        return dataclasses.replace(DEFAULT_LIMITS, **self.limits)


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


def render_config_reference() -> str:
    """The generated ``docs/configuration.md``: every key, its default and what it does."""
    lines = [
        "# Configuration",
        "",
        "Generated by `python -m enroute_core.config > docs/configuration.md`; a test keeps it",
        "current. Every process reads one YAML file (`--config FILE`). Any key can be set",
        "from the environment as `ENROUTE_<SECTION>__<KEY>` (`ENROUTE_NODE__PAGE_CACHE=512MiB`).",
        "Sizes take `KiB`, `MiB`, `GiB` (or `KB`, `MB`, `GB`); durations take `ms`, `s`, `m`,",
        "`h`, `d`. Unknown keys are an error at start-up.",
    ]
    for section, field in Config.model_fields.items():
        model = field.annotation
        if not (isinstance(model, type) and issubclass(model, _Section)):
            continue
        lines += ["", f"## `{section}`", "", (model.__doc__ or "").strip(), ""]
        lines += ["| key | default | meaning |", "|---|---|---|"]
        for key, sub in model.model_fields.items():
            default = sub.get_default(call_default_factory=True)
            size = _takes_size(sub.annotation) or any(_is_size_parser(m) for m in sub.metadata)
            shown = "unset" if default is None else f"`{_show(default, size=size)}`"
            lines.append(f"| `{section}.{key}` | {shown} | {sub.description or ''} |")
    lines += [
        "",
        "## `limits`",
        "",
        "Each bound of a parser, queue, cache or stream (`enroute_core.base.limits.Limits`);",
        "over a bound the request is refused with `LIMIT_EXCEEDED` (docs/errors.md) before",
        "more is spent. Set any of them under `limits:`. `ledger_dedup_window_entries` is",
        "part of the replicated state: every ledger voter must use the same value.",
        "",
        "| key | default |",
        "|---|---|",
    ]
    for f in dataclasses.fields(Limits):
        shown = _show(getattr(DEFAULT_LIMITS, f.name), size="bytes" in f.name)
        lines.append(f"| `limits.{f.name}` | `{shown}` |")
    return "\n".join(lines) + "\n"


def _is_size_parser(meta: object) -> bool:
    return getattr(meta, "func", None) is parse_bytes


def _takes_size(annotation: object) -> bool:
    """Whether a field's type is :data:`Bytes` (alone or in a union), so its default
    reads best in KiB/MiB/GiB; a count of 1024 is not "1KiB"."""
    if get_origin(annotation) is Annotated:
        return any(_is_size_parser(m) for m in get_args(annotation)[1:])
    return any(_takes_size(a) for a in get_args(annotation))


def _show(value: object, *, size: bool = False) -> str:
    """A default as the reference shows it: sizes in the largest whole unit, other
    integers with ``_`` between thousands from 10,000 on."""
    if value == "":
        return '""'
    if isinstance(value, tuple):
        return str(value) if value else "[]"
    if isinstance(value, bool) or not isinstance(value, int):
        return str(value)
    if size:
        for unit, scale in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
            if value >= scale and value % scale == 0:
                return f"{value // scale}{unit}"
    return f"{value:,}".replace(",", "_") if value >= 10_000 else str(value)


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_config_reference())
