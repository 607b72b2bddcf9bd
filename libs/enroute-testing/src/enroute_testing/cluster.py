"""A real cluster on 127.0.0.1: three ledger voters, two computes, one gitproto, one S3.

``enroute cluster up|down|status`` and the tests under ``tests/cluster`` both
use :class:`Cluster`. Every process is a separate ``python -m enroute_<role>
--config FILE`` with its own directory ``DIR/<name>`` (config, data, log);
the object store is SeaweedFS (``weed mini``, :mod:`enroute_testing.s3servers`)
with the bucket ``enroute``. Ports are picked before anything starts, so a
restarted process comes back on the same addresses and every config can name
every member.

With ``faults=True`` traffic is routed through proxies the tests switch:

* every ledger voter reaches each peer through its own :class:`TcpProxy`
  (``link("ledger-1", "ledger-2")``), so a voter can be partitioned;
* every compute reaches each voter, and gitproto each compute, through a
  :class:`TcpProxy` too;
* every ledger and compute reaches S3 through its own :class:`FaultProxy`
  (503s, delays, resets; :meth:`Cluster.s3_outage`).

Every process runs the production configuration of internal calls: one
shared token (``DIR/internal-token``, ``auth.internal_token_file``, as
``enroute dev`` writes it; docs/security.md, "Internal calls") on every gRPC
call, and as the admin bearer token of ``/status?repo=``. gitproto's
operator port (``listen.ops``) is a port of its own.

Processes are also killed (SIGKILL), stopped gracefully (SIGTERM: each role
drains, docs/reliability.md "Graceful drain"), paused (SIGSTOP/SIGCONT),
restarted, and have their data directories wiped. ``up`` leaves them running detached
and records pids and ports in ``DIR/cluster.json``; ``down`` stops them by
pid. The proxies live in the process that started the cluster, so a
detached cluster (the CLI) has none.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from enroute_testing.env import service_env
from enroute_testing.faultproxy import FaultKind, FaultProxy, FaultRule, LinkMode, TcpProxy
from enroute_testing.ports import free_port
from enroute_testing.s3servers import (
    _SEAWEED_PORTS,
    ACCESS_KEY_ID,
    REGION,
    SECRET_ACCESS_KEY,
    S3Endpoint,
    create_bucket,
    seaweedfs_command,
    weed_binary,
)

BUCKET = "enroute"
STATE_FILE = "cluster.json"
TOKEN_FILE = "internal-token"
"""Under the cluster directory: the internal token every process reads (mode 0600)."""
READY = re.compile(r"^enroute (\w+) ready: (.*)$", re.MULTILINE)
START_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0
LOG_TAIL_BYTES = 4000
SKEW_ENV = "CLUSTER_CLOCK_SKEW_S"
"""Seconds added to ``time.time``/``time.time_ns`` of a process (see ``_skew/``)."""
_SKEW_DIR = Path(__file__).parent / "_skew"

LEDGERS = ("ledger-1", "ledger-2", "ledger-3")
COMPUTES = ("compute-1", "compute-2")
GITPROTO = "gitproto"
NAMES = (*LEDGERS, *COMPUTES, GITPROTO)


def role_of(name: str) -> str:
    return name.split("-", 1)[0]


@dataclass
class Member:
    """One process of the cluster: its directory, its ports, and the process while it runs."""

    name: str
    directory: Path
    http_port: int
    grpc_port: int = 0
    ops_port: int = 0
    """gitproto only: ``listen.ops`` (/metrics, /status)."""
    pid: int = 0
    process: subprocess.Popen[bytes] | None = None
    skew_s: float = 0.0
    starts: int = 0

    @property
    def role(self) -> str:
        return role_of(self.name)

    @property
    def config_path(self) -> Path:
        return self.directory / "config.yaml"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    @property
    def log_path(self) -> Path:
        return self.directory / "log"

    @property
    def grpc(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    def alive(self) -> bool:
        if self.process is not None:
            return self.process.poll() is None
        return pid_alive(self.pid)

    def log_tail(self) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return "(no log)"
        return data[-LOG_TAIL_BYTES:].decode("utf-8", "replace")


def pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not reaped) is not alive
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


def _pid_runs(pid: int, needle: str) -> bool:
    """The pid is still the process we started (its command line names ``needle``)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return needle.encode() in f.read()
    except OSError:
        return False


def readyz(http: str, timeout_s: float = 2.0) -> int | None:
    """The status code of ``GET /readyz`` (None: no answer)."""
    try:
        with urllib.request.urlopen(f"http://{http}/readyz", timeout=timeout_s) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return None


def get_json(url: str, timeout_s: float = 5.0, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=timeout_s) as r:
        return json.loads(r.read())


def write_token(path: Path) -> None:
    """A fresh internal token at ``path`` unless one is there (kept across restarts)."""
    with contextlib.suppress(FileExistsError):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="ascii") as f:
            f.write(secrets.token_urlsafe(32) + "\n")


def _child_env(skew_s: float) -> dict[str, str]:
    env = service_env(PYTHONUNBUFFERED="1")
    env.pop(SKEW_ENV, None)
    if skew_s:
        env[SKEW_ENV] = repr(skew_s)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(_SKEW_DIR), env.get("PYTHONPATH", "")) if p
        )
    return env


@dataclass
class S3Process:
    directory: Path
    ports: dict[str, int]
    pid: int = 0
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> S3Endpoint:
        return S3Endpoint("seaweedfs", "127.0.0.1", self.ports["s3.port"])

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.directory),
            "TMPDIR": str(self.directory),
            "AWS_ACCESS_KEY_ID": ACCESS_KEY_ID,
            "AWS_SECRET_ACCESS_KEY": SECRET_ACCESS_KEY,
        }
        with open(self.directory / "weed.log", "ab") as log:
            self.process = subprocess.Popen(
                seaweedfs_command(weed_binary(), str(self.directory), self.ports),
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.pid = self.process.pid
        create_bucket(self.endpoint, BUCKET, timeout_s=START_TIMEOUT_S)

    def stop(self) -> None:
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(STOP_GRACE_S)
        elif pid_alive(self.pid) and _pid_runs(self.pid, "weed"):
            os.kill(self.pid, signal.SIGKILL)
        for port in self.ports.values():
            for sock in Path("/tmp").glob(f"seaweedfs-*-{port}.sock"):
                with contextlib.suppress(OSError):
                    sock.unlink()


@dataclass
class Cluster:
    """The processes under ``root``; see the module docstring."""

    root: Path
    faults: bool = False
    members: dict[str, Member] = field(default_factory=dict)
    s3: S3Process | None = None
    links: dict[tuple[str, str], TcpProxy] = field(default_factory=dict)
    s3_proxies: dict[str, FaultProxy] = field(default_factory=dict)
    extra_config: dict[str, dict[str, Any]] = field(default_factory=dict)
    keep_down: set[str] = field(default_factory=set)
    """Members :meth:`ensure_running` leaves down (a voter that cannot rejoin)."""

    # -- set-up

    @classmethod
    def create(
        cls,
        root: Path,
        *,
        faults: bool = False,
        extra_config: dict[str, dict[str, Any]] | None = None,
    ) -> Cluster:
        root = root.resolve()
        root.mkdir(parents=True, exist_ok=True)
        cluster = cls(root, faults, extra_config=extra_config or {})
        cluster.s3 = S3Process(root / "s3", {n: free_port() for n in _SEAWEED_PORTS})
        for name in NAMES:
            grpc = 0 if name == GITPROTO else free_port()
            ops = free_port() if name == GITPROTO else 0
            cluster.members[name] = Member(name, root / name, free_port(), grpc, ops)
        return cluster

    @property
    def token_path(self) -> Path:
        return self.root / TOKEN_FILE

    @property
    def admin_headers(self) -> dict[str, str]:
        """The internal token as a bearer token: ``/status?repo=`` of computes and ledgers."""
        return {"Authorization": f"Bearer {self.token_path.read_text().strip()}"}

    def start(self, *, timeout_s: float = START_TIMEOUT_S) -> Cluster:
        """S3, proxies, configs, then every process; returns once each printed its ready line."""
        assert self.s3 is not None
        try:
            self.s3.start()
            if self.faults:
                self._start_proxies()
            write_token(self.token_path)
            for member in self.members.values():
                member.directory.mkdir(parents=True, exist_ok=True)
                member.data_dir.mkdir(exist_ok=True)
                member.config_path.write_text(
                    yaml.safe_dump(self.config_of(member.name), sort_keys=True)
                )
            for group in (LEDGERS, COMPUTES, (GITPROTO,)):
                for name in group:
                    self._spawn(self.members[name])
                for name in group:
                    self.wait_ready(name, timeout_s)
            self.save()
        except BaseException:
            self.stop()
            raise
        return self

    def _start_proxies(self) -> None:
        assert self.s3 is not None
        pairs = [(a, b) for a in LEDGERS for b in LEDGERS if a != b]
        pairs += [(c, v) for c in COMPUTES for v in LEDGERS]
        pairs += [(GITPROTO, c) for c in COMPUTES]
        for src, dst in pairs:
            target = self.members[dst]
            link = TcpProxy("127.0.0.1", target.grpc_port)
            link.start()
            self.links[(src, dst)] = link
        for name in (*LEDGERS, *COMPUTES):
            proxy = FaultProxy("127.0.0.1", self.s3.ports["s3.port"], connections_max=256)
            proxy.start()
            self.s3_proxies[name] = proxy

    def _addr(self, src: str, dst: str) -> str:
        link = self.links.get((src, dst))
        return link.address if link is not None else self.members[dst].grpc

    def config_of(self, name: str) -> dict[str, Any]:
        """The YAML config of one process (the keys of ``enroute_core.config``)."""
        assert self.s3 is not None
        member = self.members[name]
        s3_url = self.s3_proxies[name].url if name in self.s3_proxies else self.s3.endpoint.url
        store = {
            "url": f"s3://{BUCKET}/cluster",
            "options": {
                "endpoint_url": s3_url,
                "region": REGION,
                "access_key_id": ACCESS_KEY_ID,
                "secret_access_key": SECRET_ACCESS_KEY,
                "connect_timeout_ms": 2000,
                "read_timeout_ms": 5000,
                "attempt_timeout_ms": 10000,
                "attempts_max": 3,
                "backoff_max_ms": 1000,
            },
        }
        listen = {"http": member.http}
        config: dict[str, Any]
        if member.role == "ledger":
            index = LEDGERS.index(name) + 1
            listen["grpc"] = member.grpc
            config = {
                "node": {"id": str(index), "data_dir": str(member.data_dir)},
                "store": store,
                "listen": listen,
                "ledger": {"members": [self._addr(name, v) for v in LEDGERS]},
            }
            # a voter's own entry is never dialled; keep it its real address
            config["ledger"]["members"][index - 1] = member.grpc
        elif member.role == "compute":
            listen["grpc"] = member.grpc
            config = {
                "node": {"id": name, "data_dir": str(member.data_dir)},
                "store": store,
                "listen": listen,
                "ledger": {"members": [self._addr(name, v) for v in LEDGERS]},
            }
        else:
            listen["ops"] = f"127.0.0.1:{member.ops_port}"
            config = {
                "node": {"id": name},
                "compute": {"members": [self._addr(name, c) for c in COMPUTES]},
                "auth": {"anonymous": "write"},
                "listen": listen,
            }
        config.setdefault("auth", {})["internal_token_file"] = str(self.token_path)
        for key, value in self.extra_config.get(member.role, {}).items():
            config.setdefault(key, {}).update(value)
        return config

    # -- processes

    def _spawn(self, member: Member) -> None:
        assert not member.alive(), f"{member.name} runs already"
        member.directory.mkdir(parents=True, exist_ok=True)
        member.data_dir.mkdir(exist_ok=True)
        with open(member.log_path, "ab") as log:
            log.write(f"\n--- start {member.starts + 1} at {time.time():.3f}\n".encode())
            log.flush()
            member.process = subprocess.Popen(
                [sys.executable, "-m", f"enroute_{member.role}", "--config",
                 str(member.config_path)],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_child_env(member.skew_s),
                start_new_session=True,
            )  # fmt: skip
        member.pid = member.process.pid
        member.starts += 1

    def wait_ready(self, name: str, timeout_s: float = START_TIMEOUT_S) -> None:
        """Wait for this start's ready line (the log after the last start marker)."""
        member = self.members[name]
        deadline = time.monotonic() + timeout_s
        marker = f"--- start {member.starts} at".encode()
        while True:
            with contextlib.suppress(OSError):
                data = member.log_path.read_bytes()
                tail = data[data.rfind(marker) :].decode("utf-8", "replace")
                if any(m.group(1) == member.role for m in READY.finditer(tail)):
                    return
            if not member.alive():
                raise RuntimeError(f"{name} exited before ready:\n{member.log_tail()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name} not ready in {timeout_s} s:\n{member.log_tail()}")
            time.sleep(0.05)

    def wait_readyz(self, name: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while readyz(self.members[name].http, 1.0) != 200:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{name}: /readyz not 200 in {timeout_s} s")
            time.sleep(0.1)

    def kill(self, name: str) -> None:
        """SIGKILL (a crash: nothing is flushed, no goodbye to peers)."""
        member = self.members[name]
        self._signal(member, signal.SIGCONT)  # a paused process must die too
        self._signal(member, signal.SIGKILL)
        self._reap(member)

    def terminate(self, name: str, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM, then SIGKILL after ``grace_s``; the exit status (None: killed)."""
        self.begin_stop(name)
        return self.wait_exit(name, grace_s)

    def begin_stop(self, name: str) -> None:
        """SIGTERM only: the process drains (docs/reliability.md, "Graceful drain")."""
        member = self.members[name]
        self._signal(member, signal.SIGCONT)
        self._signal(member, signal.SIGTERM)

    def wait_exit(self, name: str, grace_s: float = STOP_GRACE_S) -> int | None:
        """The exit status once ``name`` ended by itself; SIGKILL after ``grace_s`` (None)."""
        member = self.members[name]
        if member.process is not None:
            try:
                return member.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                pass
        else:
            deadline = time.monotonic() + grace_s
            while member.alive() and time.monotonic() < deadline:
                time.sleep(0.05)
        self.kill(name)
        return None

    def restart(self, name: str, *, wait: bool = True, timeout_s: float = START_TIMEOUT_S) -> None:
        """Start ``name`` again (killing it first if it still runs)."""
        member = self.members[name]
        if member.alive():
            self.kill(name)
        self._spawn(member)
        if wait:
            self.wait_ready(name, timeout_s)
        self.save()

    def pause(self, name: str) -> None:
        self._signal(self.members[name], signal.SIGSTOP)

    def resume(self, name: str) -> None:
        self._signal(self.members[name], signal.SIGCONT)

    def wipe(self, name: str) -> None:
        """Kill ``name`` and remove its data directory (a lost disk); restart is separate."""
        self.kill(name)
        shutil.rmtree(self.members[name].data_dir, ignore_errors=True)

    def set_skew(self, name: str, skew_s: float) -> None:
        """Restart ``name`` with its wall clock ``skew_s`` seconds off (``_skew/sitecustomize``)."""
        self.members[name].skew_s = skew_s
        self.restart(name)

    def _signal(self, member: Member, sig: signal.Signals) -> None:
        if member.alive() and (member.process is not None or _pid_runs(member.pid, "enroute_")):
            with contextlib.suppress(ProcessLookupError):
                os.kill(member.pid, sig)

    def _reap(self, member: Member) -> None:
        if member.process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                member.process.wait(STOP_GRACE_S)
        else:
            deadline = time.monotonic() + STOP_GRACE_S
            while pid_alive(member.pid) and time.monotonic() < deadline:
                time.sleep(0.05)

    # -- faults on the wire

    def link(self, src: str, dst: str) -> TcpProxy:
        assert self.faults, "start the cluster with faults=True"
        return self.links[(src, dst)]

    def partition(self, name: str, mode: LinkMode = LinkMode.CUT) -> None:
        """Cut every link into and out of ``name``."""
        for (src, dst), link in self.links.items():
            if name in (src, dst):
                link.set(mode)

    def s3_proxy(self, name: str) -> FaultProxy:
        assert self.faults, "start the cluster with faults=True"
        return self.s3_proxies[name]

    def s3_outage(self, *, names: tuple[str, ...] | None = None, delay_s: float = 0.0) -> None:
        """Every S3 request of ``names`` (default: all) answers 503, or waits ``delay_s``."""
        for name in names or tuple(self.s3_proxies):
            proxy = self.s3_proxies[name]
            if delay_s:
                proxy.add(FaultRule(FaultKind.DELAY, times=10_000, delay_s=delay_s))
            else:
                proxy.add(FaultRule(FaultKind.STATUS, times=10_000))

    def heal(self) -> None:
        """Every link passes and every S3 proxy forwards; paused processes go on."""
        for link in self.links.values():
            link.heal()
        for proxy in self.s3_proxies.values():
            proxy.clear()
        for member in self.members.values():
            self._signal(member, signal.SIGCONT)

    def ensure_running(self, timeout_s: float = START_TIMEOUT_S) -> None:
        """Heal, then restart whatever is down; wait until every /readyz answers 200."""
        self.heal()
        names = [n for n in NAMES if n not in self.keep_down]
        for name in names:
            if not self.members[name].alive():
                self.restart(name, wait=False)
        for name in names:
            member = self.members[name]
            if member.process is not None and member.starts:
                self.wait_ready(name, timeout_s)
            self.wait_readyz(name, timeout_s)

    # -- inspection

    @property
    def url(self) -> str:
        return f"http://{self.members[GITPROTO].http}"

    def git_url(self, repo: str) -> str:
        return f"{self.url}/{repo}.git"

    def ledger_status(self, name: str, repo: str | None = None) -> dict[str, Any]:
        """A voter's /status; with ``repo``, every group of that repository (the plain
        answer lists only the most active groups)."""
        query = "" if repo is None else "?" + urllib.parse.urlencode({"repo": repo})
        url = f"http://{self.members[name].http}/status{query}"
        status: dict[str, Any] = get_json(url, headers=self.admin_headers)
        return status

    def leader_of(self, repo: str) -> str | None:
        """The voter leading ``repo``'s newest group, as some live voter sees it."""
        for name in LEDGERS:
            if not self.members[name].alive():
                continue
            with contextlib.suppress(OSError, ValueError):
                groups = self.ledger_status(name, repo)["raft_groups"]
                if groups:
                    leader = max(groups, key=lambda g: g["incarnation"])["leader"]
                    if leader:
                        return LEDGERS[int(leader) - 1]
        return None

    def status_rows(self) -> list[tuple[str, int, bool, int | None, str]]:
        """(name, pid, alive, /readyz status, addresses) of every process."""
        rows = []
        for m in self.members.values():
            up = m.alive()
            addresses = f"http={m.http}" + (f" grpc={m.grpc}" if m.grpc_port else "")
            addresses += f" ops=127.0.0.1:{m.ops_port}" if m.ops_port else ""
            rows.append((m.name, m.pid, up, readyz(m.http) if up else None, addresses))
        return rows

    # -- state file and stop

    def save(self) -> None:
        assert self.s3 is not None
        state = {
            "url": self.url,
            "s3": {"pid": self.s3.pid, "ports": self.s3.ports, "dir": str(self.s3.directory)},
            "members": {
                m.name: {
                    "pid": m.pid,
                    "http": m.http_port,
                    "grpc": m.grpc_port,
                    "ops": m.ops_port,
                    "dir": str(m.directory),
                }
                for m in self.members.values()
            },
        }
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        os.replace(tmp, self.root / STATE_FILE)

    @classmethod
    def load(cls, root: Path) -> Cluster:
        """The cluster a detached ``up`` left under ``root`` (no proxies)."""
        root = root.resolve()
        state = json.loads((root / STATE_FILE).read_text())
        cluster = cls(root)
        s3 = state["s3"]
        cluster.s3 = S3Process(Path(s3["dir"]), dict(s3["ports"]), int(s3["pid"]))
        for name, m in state["members"].items():
            cluster.members[name] = Member(
                name,
                Path(m["dir"]),
                int(m["http"]),
                int(m["grpc"]),
                int(m.get("ops", 0)),
                int(m["pid"]),
            )
        return cluster

    def stop(self) -> None:
        """Stop every process (gitproto first), the proxies and S3."""
        for name in reversed(NAMES):
            if name in self.members and self.members[name].alive():
                self.terminate(name)
        for name, member in self.members.items():  # voters added later (cluster_ledger)
            if name not in NAMES and member.alive():
                self.terminate(name)
        for link in self.links.values():
            link.stop()
        for proxy in self.s3_proxies.values():
            proxy.stop()
        self.links.clear()
        self.s3_proxies.clear()
        if self.s3 is not None:
            self.s3.stop()
        with contextlib.suppress(OSError):
            (self.root / STATE_FILE).unlink()


@contextlib.contextmanager
def running_cluster(
    root: Path, *, faults: bool = True, extra_config: dict[str, dict[str, Any]] | None = None
) -> Iterator[Cluster]:
    """A started cluster, always stopped on exit (the pytest fixture's body)."""
    cluster = Cluster.create(root, faults=faults, extra_config=extra_config)
    cluster.start()
    try:
        yield cluster
    finally:
        cluster.stop()
