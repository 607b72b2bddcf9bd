"""HEAD: the kept default branch, and the repair of a push-created repository's HEAD.

Seed 001, "Creation": "A kept HEAD is the fixed default branch of the
repository. HEAD stays on its branch while that branch is unborn [...] It also
stays on its branch after the branch is deleted. A repository that a push
created is different: Enroute repairs its HEAD to an existing branch (main,
then master, then the first) when its branch is gone." DESIGN, "External
interfaces" (HEAD rules): the first branch is the first in byte order of ref
names.

"Gone" means "not an existing ref": a push-created repository starts with HEAD
on ``refs/heads/main``, so a first push of only ``dev`` moves HEAD to ``dev``.
With no branch at all HEAD stays where it is (unborn).
"""

from __future__ import annotations

from collections.abc import Mapping

from enroute_core.base.errors import InvalidRefName
from enroute_core.git.refname import branch_name_problem
from enroute_core.state.model import BRANCH_PREFIX, REFS_PREFIX, branch_problem
from enroute_core.state.refmap import RefMap

IMPLICIT_HEAD = b"refs/heads/main"
"""HEAD of a repository that a push created, until it is repaired."""
REPAIR_PREFERENCE = (b"refs/heads/main", b"refs/heads/master")


def repair_head(head: bytes, head_kept: bool, refs: Mapping[bytes, object]) -> bytes:
    """The HEAD after a change of ``refs`` (rule ``head.repair``)."""
    if head_kept or head in refs:
        return head
    for preferred in REPAIR_PREFERENCE:
        if preferred in refs:
            return preferred
    if isinstance(refs, RefMap):  # sorted: the first branch without a scan of every ref
        first = refs.first_from(BRANCH_PREFIX)
        return first if first is not None and first.startswith(BRANCH_PREFIX) else head
    branches = [name for name in refs if name.startswith(BRANCH_PREFIX)]
    return min(branches) if branches else head


def branch_ref(name: bytes) -> bytes:
    """A default branch as the API takes it (DESIGN: ``main`` or ``refs/heads/main``), as a
    full ref; raise :class:`InvalidRefName` for anything that is not a valid branch.

    Valid means what ``git check-ref-format --branch`` takes for the part after
    ``refs/heads/``, so neither ``HEAD`` nor a name beginning with ``-`` (git/refname.py).
    """
    full = name if name.startswith(REFS_PREFIX) else BRANCH_PREFIX + name
    problem = branch_problem(full)
    if problem is None:
        problem = branch_name_problem(full[len(BRANCH_PREFIX) :])
    if problem is not None:
        shown = name[:200].decode("utf-8", "replace")
        raise InvalidRefName(f"invalid branch {shown!r}: {problem}", name=shown, reason=problem)
    return full
