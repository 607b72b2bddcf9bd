"""Audit lines of what the ledger changed for this compute (docs/logging.md, "Audit lines").

Every ref change, push or API, and every repository create and delete goes
through :class:`~enroute_compute.ledger_client.GrpcLedger`, which calls these
with the ledger's answer: the lines say what was applied (the ledger's
``RefChanged`` effects, old and new values as they were), not what was asked.
Who asked comes from the request's log context (the ``user`` gitproto sends,
enroute_proto.logs), with its ``request_id``.
"""

from __future__ import annotations

from enroute_compute.ledger_port import Activated, RepoSummary
from enroute_core.state import Command, Commit, RefChanged
from enroute_core.state.effects import Change
from enroute_proto.logs import audit

ZERO_HEX = "0" * 40
"""An absent ref, as git's ``<old> <new>`` lines write it."""


def audit_change(name: str, command: Command, change: Change, proposal_id: bytes) -> None:
    """One ``ref.update`` line per ref the ledger set or deleted for ``command``.

    ``proposal_id`` is the ledger's id of the proposal (``ProposeRequest.request_id``),
    which the ledger's line of it carries: proposals share one stream to a member, so
    that id, not the call's metadata, joins the two.
    """
    via = "push" if isinstance(command, Commit) and command.is_push else "api"
    for effect in change.effects:
        if isinstance(effect, RefChanged):
            audit(
                "ref.update",
                repo=name,
                ref=effect.name.decode("utf-8", "replace"),
                old=effect.old.oid.hex() if effect.old is not None else ZERO_HEX,
                new=effect.new.oid.hex() if effect.new is not None else ZERO_HEX,
                via=via,
                proposal_id=proposal_id.hex(),
            )


def audit_activated(name: str, activated: Activated) -> None:
    """A ``repo.create`` line when the activation created the repository (API or push)."""
    if activated.created:
        audit(
            "repo.create",
            repo=name,
            incarnation=activated.state.incarnation,
            head=activated.state.head.decode("utf-8", "replace"),
        )


def audit_deleted(name: str, summary: RepoSummary | None) -> None:
    """A ``repo.delete`` line when the ledger deleted an incarnation."""
    if summary is not None:
        audit("repo.delete", repo=name, incarnation=summary.incarnation)
