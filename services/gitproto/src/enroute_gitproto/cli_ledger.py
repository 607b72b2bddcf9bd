"""``enroute ledger members|add|remove|replace``: the ledger's voters, changed online.

docs/raft.md, "Membership changes". Every command talks to ``/membership`` on the
HTTP port of one voter: ``--ledger HOST:PORT``, or ``--data DIR`` for the local
cluster of ``enroute cluster up`` (its voters' ports and token are read from
``DIR``). A change goes group by group; the command shows its progress and ends
when every group has it. Interrupted anywhere, the same command finishes it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from enroute_core.base.errors import EnrouteError, Unavailable
from enroute_gitproto.cli_api import table

ledger_app = typer.Typer(no_args_is_help=True, help="The ledger's voters: list and change them")

LedgerOption = Annotated[
    str | None, typer.Option("--ledger", help="HTTP (status) address HOST:PORT of a voter")
]
DataOption = Annotated[
    Path | None, typer.Option("--data", help="directory of a local `enroute cluster`")
]
TokenOption = Annotated[
    Path | None,
    typer.Option("--token-file", help="internal token file (auth.internal_token_file)"),
]

_CLUSTER_STATE = "cluster.json"
_CLUSTER_TOKEN = "internal-token"


def _admins(ledger: str | None, data: Path | None, token_file: Path | None) -> list[Any]:
    from enroute_ledger.membership_client import LedgerAdmin  # noqa: PLC0415 (fast `enroute`)

    token_path = token_file
    addresses: list[str] = []
    if ledger:
        addresses.append(ledger)
    elif data is not None:
        try:
            state = json.loads((data / _CLUSTER_STATE).read_text())
        except (OSError, ValueError) as e:
            problem = f"no local cluster in {data}: {e}"
            raise typer.BadParameter(problem, param_hint="--data") from None
        addresses = [
            f"127.0.0.1:{m['http']}"
            for name, m in sorted(state["members"].items())
            if name.startswith("ledger")
        ]
        if token_path is None and (data / _CLUSTER_TOKEN).exists():
            token_path = data / _CLUSTER_TOKEN
    else:
        raise typer.BadParameter("give --ledger HOST:PORT or --data DIR", param_hint="--ledger")
    token = token_path.read_text().strip() if token_path is not None else None
    return [LedgerAdmin(a, token) for a in addresses]


def _first_answering(admins: list[Any]) -> Any:
    """The first voter that answers (a voter may be down: that is why there are several)."""
    last: EnrouteError | None = None
    for admin in admins:
        try:
            admin.members()
            return admin
        except EnrouteError as e:
            last = e
    raise last if last is not None else Unavailable("no voter")


def _run(admins: list[Any], action: Any) -> None:
    try:
        action(_first_answering(admins))
    except EnrouteError as e:
        typer.echo(f"enroute ledger: {e.code}: {e.message}", err=True)
        raise typer.Exit(1) from None


def _say(line: str) -> None:
    typer.echo(line)


@ledger_app.command()
def members(
    ledger: LedgerOption = None,
    data: DataOption = None,
    token_file: TokenOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="print JSON")] = False,
) -> None:
    """List the voters: id, address, health, groups, leaders, lag, and any open change."""

    def show(admin: Any) -> None:
        view = admin.members()
        if as_json:
            typer.echo(json.dumps(view, indent=2, sort_keys=True))
            return
        rows = []
        for m in view["members"]:
            state = "joining" if m["joining"] else "leaving" if m["leaving"] else "voter"
            health = "healthy" if m["healthy"] else "unreported" if m["epoch"] is None else "down"
            rows.append(
                (
                    m["id"],
                    m["address"],
                    state,
                    health,
                    m["groups"],
                    m["leading"],
                    m["apply_lag_entries"],
                    m.get("blank"),
                )
            )
        headers = ("ID", "ADDRESS", "STATE", "HEALTH", "GROUPS", "LEADING", "LAG", "BLANK")
        typer.echo(table(headers, rows))
        record = view["record"]
        typer.echo(f"epoch {record['epoch']}, next id {record['next_id']}")
        if view["change"]:
            typer.echo(f"open change: {view['change']} ({view.get('off_target', 0)} groups left)")

    _run(_admins(ledger, data, token_file), show)


@ledger_app.command()
def add(
    address: Annotated[str, typer.Argument(help="gRPC address HOST:PORT of the new voter")],
    ledger: LedgerOption = None,
    data: DataOption = None,
    token_file: TokenOption = None,
) -> None:
    """Add a voter under a new id to every group, then wait until each group has it."""
    _run(_admins(ledger, data, token_file), lambda a: a.add(address, _say))
    typer.echo(f"added {address}")


@ledger_app.command()
def remove(
    node: Annotated[int, typer.Argument(help="id of the voter (see `enroute ledger members`)")],
    ledger: LedgerOption = None,
    data: DataOption = None,
    token_file: TokenOption = None,
) -> None:
    """Remove a voter from every group (its groups' leaders hand over first); its id retires."""
    _run(_admins(ledger, data, token_file), lambda a: a.remove(node, _say))
    typer.echo(f"removed voter {node}: stop it; its id is never used again")


@ledger_app.command()
def replace(
    old: Annotated[int, typer.Argument(help="id of the voter to replace")],
    address: Annotated[str, typer.Argument(help="gRPC address HOST:PORT of the new machine")],
    *,
    ledger: LedgerOption = None,
    data: DataOption = None,
    token_file: TokenOption = None,
    recover_from: Annotated[
        int | None,
        typer.Option(
            "--recover-from",
            help="two voters only, OLD lost (disk wiped, or the machine gone for good): the "
            "id of the surviving voter, which consents to carry every group alone until the "
            "new machine has caught up (docs/raft.md, 'Recovering a two-voter ledger')",
        ),
    ] = None,
) -> None:
    """Add the new machine under a new id, then remove the old voter (two changes).

    With --recover-from SURVIVOR (a two-voter ledger that lost OLD): OLD retires at
    once and SURVIVOR takes every group over alone, then the new machine joins.
    """
    if recover_from is None:
        _run(_admins(ledger, data, token_file), lambda a: a.replace(old, address, _say))
        typer.echo(f"replaced voter {old} by {address}")
        return
    typer.echo(
        f"two-voter recovery: voter {old} is taken as lost for good; its id retires now "
        f"and never votes again. Voter {recover_from} holds every committed entry (with "
        "two voters each commit is on both) and leads every group alone, then the new "
        f"machine at {address} joins under a new id. Writes only voter {old} held, never "
        f"acknowledged, are dropped. Do not start voter {old} again with its data."
    )
    _run_on_survivor(
        _admins(ledger, data, token_file),
        lambda a: a.recover(old, address, recover_from, _say),
    )
    typer.echo(f"recovered: voter {old} replaced by {address}; voter {old} stays retired")


def _run_on_survivor(admins: list[Any], action: Any) -> None:
    """Run ``action`` on the voter that consents: the survivor (another voter says it is
    not, and the next is asked; a lost voter may still answer)."""
    from enroute_ledger.membership import NOT_THE_SURVIVOR  # noqa: PLC0415 (fast `enroute`)

    last: EnrouteError = Unavailable("no voter answers")
    for admin in admins:
        try:
            action(admin)
            return
        except EnrouteError as e:
            last = e
            if isinstance(e, Unavailable) or NOT_THE_SURVIVOR in e.message:
                continue
            break
    typer.echo(f"enroute ledger: {last.code}: {last.message}", err=True)
    raise typer.Exit(1)
