"""A fetch's planning stops when its request goes (engine/cancel.py; issue "Bounded
work", item 3: a request's work ends with the request).

The walks check the request's event at each commit and tree they step through:
with the event set, a clone's plan and a deepen plan raise WalkAbandoned at the
first step; with it clear, or outside any request, they plan what they planned.
"""

from __future__ import annotations

import threading

import pytest

from enroute_core.base.ids import ObjectId, oid_from_hex
from enroute_core.engine.cancel import WalkAbandoned, abandoned_when
from enroute_core.engine.serve import plan_fetch
from enroute_core.engine.view import View
from enroute_testing.pushed import rev_parse, three_pushes
from enroute_testing.repogen import GeneratedRepo, RepoSpec, generate_repo

pytestmark = pytest.mark.interop

_SPEC = RepoSpec(seed=24, commits=30, branches=2, merge_every=5, files=12, annotated_tags=1)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> GeneratedRepo:
    return generate_repo(tmp_path_factory.mktemp("walk-cancel") / "full.git", _SPEC)


def _tips(repo: GeneratedRepo) -> list[ObjectId]:
    return [oid_from_hex(v) for v in repo.refs.values()]


def test_plans_stop_once_the_request_has_gone(repo: GeneratedRepo) -> None:
    gone = threading.Event()
    gone.set()
    main = rev_parse(repo.path, "main")
    for wants, deepen in ((_tips(repo), None), ([main], 3)):
        view = View(three_pushes(repo))  # fresh: no tree walk kept from an earlier plan
        with abandoned_when(gone), pytest.raises(WalkAbandoned):
            plan_fetch(view, wants, deepen=deepen)


def test_plans_of_a_request_still_there_are_unchanged(repo: GeneratedRepo) -> None:
    main = rev_parse(repo.path, "main")
    for wants, deepen in ((_tips(repo), None), ([main], 3)):
        with abandoned_when(threading.Event()):
            planned = plan_fetch(View(three_pushes(repo)), wants, deepen=deepen)
        assert planned == plan_fetch(View(three_pushes(repo)), wants, deepen=deepen)
        assert planned.object_count > 0
