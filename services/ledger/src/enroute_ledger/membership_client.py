"""The operator's side of a membership change: ``/membership`` of any voter, over HTTP.

``enroute ledger members|add|remove|replace`` (docs/raft.md, "Membership changes")
and the local cluster's ``ledger-add``/``ledger-remove`` call this. A change is
opened, then followed until every voter of the target reports no group left to
change, then closed; each step is idempotent, so a command interrupted anywhere
(a crash, Ctrl-C) is finished by running it again.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

from enroute_core.base.errors import InvalidArgument, Unavailable

POLL_S = 1.0
CHANGE_TIMEOUT_S = 3600.0
"""A change of every group of a large ledger takes minutes; beyond an hour, say so."""


class LedgerAdmin:
    """``http://HOST:PORT/membership`` of one voter; ``token``: the internal token."""

    def __init__(self, http_addr: str, token: str | None, *, timeout_s: float = 30.0) -> None:
        self.url = f"http://{http_addr}/membership"
        self.token = token
        self.timeout_s = timeout_s

    def _call(self, body: dict[str, Any] | None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.url, data=data, method="GET" if body is None else "POST")
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as r:
                doc: dict[str, Any] = json.loads(r.read())
                return doc
        except urllib.error.HTTPError as e:
            text = e.read().decode(errors="replace")
            if e.code == 409:
                err = json.loads(text)
                raise InvalidArgument(err.get("message", text)) from None
            raise Unavailable(f"{self.url}: HTTP {e.code}: {text.strip()}") from None
        except (OSError, ValueError) as e:
            raise Unavailable(f"{self.url}: {e}") from None

    def members(self) -> dict[str, Any]:
        return self._call(None)

    def begin_add(self, address: str) -> int:
        """Open (or find open) "add ``address``"; the new voter's id."""
        return int(self._call({"op": "add", "address": address})["id"])

    def begin_remove(self, node: int) -> None:
        self._call({"op": "remove", "id": node})

    def finish(self, progress: Callable[[str], None], timeout_s: float = CHANGE_TIMEOUT_S) -> None:
        """Follow the open change until every group has it, then close it."""
        deadline = time.monotonic() + timeout_s
        shown = ""
        while True:
            view = self.members()
            record = view["record"]
            if record["target"] is None:
                return
            waiting: list[str] = view.get("waiting", [])
            line = f"epoch {record['epoch']}: {view['change']}: " + (
                f"{view.get('off_target', 0)} groups to change; " + "; ".join(waiting)
                if waiting
                else "every group changed, closing"
            )
            if line != shown:
                progress(line)
                shown = line
            if not waiting:
                try:
                    self._call({"op": "finish", "epoch": record["epoch"]})
                except InvalidArgument as e:  # a voter fell behind meanwhile: follow on
                    progress(f"not closed yet: {e.message}")
                continue
            if time.monotonic() > deadline:
                raise Unavailable(f"the change has not reached every group: {'; '.join(waiting)}")
            time.sleep(POLL_S)

    def add(self, address: str, progress: Callable[[str], None]) -> int:
        nid = self.begin_add(address)
        progress(_start_line(nid, address))
        self.finish(progress)
        return nid

    def remove(self, node: int, progress: Callable[[str], None]) -> None:
        self.begin_remove(node)
        self.finish(progress)

    def recover(
        self,
        old: int,
        address: str,
        survivor: int,
        progress: Callable[[str], None],
        timeout_s: float = CHANGE_TIMEOUT_S,
    ) -> int:
        """Two-voter recovery (docs/raft.md, "Recovering a two-voter ledger"): this voter,
        the survivor, consents; ``old`` retires, the survivor leads every group alone,
        then the new voter at ``address`` joins. Refused (InvalidArgument) when unsafe."""
        answer = self._call(
            {"op": "recover", "lost": old, "address": address, "survivor": survivor}
        )
        nid = int(answer["id"])
        progress(_start_line(nid, address))
        self.finish(progress, timeout_s)
        return nid

    def replace(self, old: int, address: str, progress: Callable[[str], None]) -> int:
        """Add the new voter, then remove the old one: two single-server changes.

        Refused when ``address`` is the old voter's own (a StatefulSet pod keeps its
        name): one address cannot be two voters at once, so that machine leaves first
        and comes back blank under a new id (the refusal names the commands)."""
        record = self.members()["record"]
        view = record["target"] or record["voters"]
        if view.get(str(old)) == address:
            raise InvalidArgument(
                f"{address} is voter {old}'s own address: one address cannot be two voters "
                f"at once. Run `enroute ledger remove {old}`, stop that machine and wipe its "
                f"data directory, then `enroute ledger add {address}` and start it again: it "
                "comes back under a new id (docs/raft.md, 'Membership changes')",
                id=old,
                address=address,
            )
        nid = self.add(address, progress)
        self.remove(old, progress)
        return nid


def _start_line(nid: int, address: str) -> str:
    """Tells the operator how the new voter gets its id: by its address, on a blank disk."""
    return (
        f"voter {nid} at {address}: start it if it is not running, with a blank data "
        f"directory and {address} as its address (ledger.advertise, or listen.grpc): it "
        f"takes id {nid}"
    )
