"""``enroute cluster up|down|status``: a multi-process cluster on loopback for trying faults.

``up`` starts SeaweedFS (S3), three ledger voters, two computes and one
gitproto, each a separate process with its own config, data and log under
``--data DIR/<name>``, prints the Git URL and returns, leaving them running;
pids and ports are in ``DIR/cluster.json``. ``status`` prints every process
and its ``/readyz``; ``down`` stops them all. The cluster is the one the
reliability tests drive (``enroute_testing.cluster``, docs/reliability.md),
and it is offered to the ``enroute`` command through the ``enroute.commands``
entry point of this package, so it exists where the test kit is installed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(no_args_is_help=True, help="A local multi-process cluster (S3, 3+2+1)")

DataOption = Annotated[Path, typer.Option(help="cluster directory")]
DEFAULT_DATA = Path(".enroute-cluster")


@app.command()
def up(
    data: DataOption = DEFAULT_DATA,
    start_timeout: Annotated[float, typer.Option(help="seconds each process may take")] = 60.0,
) -> None:
    """Start the cluster detached and print its Git URL."""
    from enroute_testing.cluster import STATE_FILE, Cluster  # noqa: PLC0415 (keeps `enroute` fast)

    if (data / STATE_FILE).exists():
        old = Cluster.load(data)
        if any(m.alive() for m in old.members.values()):
            typer.echo(f"a cluster runs already in {data}; `enroute cluster down` first", err=True)
            raise typer.Exit(1)
        old.stop()
    cluster = Cluster.create(data)
    try:
        cluster.start(timeout_s=start_timeout)
    except (RuntimeError, TimeoutError) as error:
        typer.echo(f"enroute cluster: {error}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"enroute cluster ready: {cluster.url}")
    typer.echo(f"git clone {cluster.git_url('REPO')}")


@app.command()
def status(data: DataOption = DEFAULT_DATA) -> None:
    """Print each process, its pid and its /readyz; exit 1 unless every one is ready."""
    from enroute_testing.cluster import STATE_FILE, Cluster  # noqa: PLC0415 (keeps `enroute` fast)

    if not (data / STATE_FILE).exists():
        typer.echo(f"no cluster in {data}", err=True)
        raise typer.Exit(1)
    cluster = Cluster.load(data)
    all_ready = True
    for name, pid, alive, ready, addresses in cluster.status_rows():
        shown = "down" if not alive else f"readyz={ready if ready is not None else 'no answer'}"
        all_ready = all_ready and ready == 200
        typer.echo(f"{name:<10} pid={pid:<8} {shown:<18} {addresses}")
    s3 = cluster.s3
    if s3 is not None:
        typer.echo(f"{'s3':<10} pid={s3.pid:<8} {'up' if _alive(s3.pid) else 'down':<18} "
                   f"{s3.endpoint.url}")  # fmt: skip
    typer.echo(f"git: {cluster.url}")
    raise typer.Exit(0 if all_ready else 1)


@app.command()
def down(data: DataOption = DEFAULT_DATA) -> None:
    """Stop every process of the cluster (SIGTERM, then SIGKILL) and S3."""
    from enroute_testing.cluster import STATE_FILE, Cluster  # noqa: PLC0415 (keeps `enroute` fast)

    if not (data / STATE_FILE).exists():
        typer.echo(f"no cluster in {data}")
        return
    Cluster.load(data).stop()
    typer.echo("enroute cluster stopped")


def _alive(pid: int) -> bool:
    from enroute_testing.cluster import pid_alive  # noqa: PLC0415

    return pid_alive(pid)


def _loaded(data: Path) -> Any:
    from enroute_testing.cluster import STATE_FILE, Cluster  # noqa: PLC0415 (keeps `enroute` fast)

    if not (data / STATE_FILE).exists():
        typer.echo(f"no cluster in {data}", err=True)
        raise typer.Exit(1)
    return Cluster.load(data)


@app.command("ledger-add")
def ledger_add(data: DataOption = DEFAULT_DATA) -> None:
    """Start one more ledger voter under a new id and add it to every group."""
    from enroute_testing import cluster_ledger  # noqa: PLC0415

    name = cluster_ledger.ledger_add(_loaded(data), typer.echo)
    typer.echo(f"{name} added")


@app.command("ledger-remove")
def ledger_remove(
    node: Annotated[int, typer.Argument(help="voter id (enroute ledger members)")],
    data: DataOption = DEFAULT_DATA,
) -> None:
    """Remove voter NODE from every group, then stop its process."""
    from enroute_testing import cluster_ledger  # noqa: PLC0415

    name = cluster_ledger.ledger_remove(_loaded(data), node, typer.echo)
    typer.echo(f"{name} removed and stopped")


@app.command("ledger-replace")
def ledger_replace(
    node: Annotated[int, typer.Argument(help="voter id (enroute ledger members)")],
    data: DataOption = DEFAULT_DATA,
    recover_from: Annotated[
        int | None,
        typer.Option("--recover-from", help="two voters, NODE lost: the surviving voter's id"),
    ] = None,
) -> None:
    """Start a new voter under a new id in place of voter NODE, then stop NODE for good."""
    from enroute_testing import cluster_ledger  # noqa: PLC0415

    c = _loaded(data)
    name = cluster_ledger.ledger_replace(c, node, typer.echo, recover_from=recover_from)
    typer.echo(f"voter {node} replaced by {name}")


@app.command("ledger-wipe")
def ledger_wipe(
    node: Annotated[int, typer.Argument(help="voter id (enroute ledger members)")],
    data: DataOption = DEFAULT_DATA,
) -> None:
    """Stop voter NODE, delete its data directory and start it again (a lost disk)."""
    from enroute_testing import cluster_ledger  # noqa: PLC0415

    name = cluster_ledger.ledger_wipe(_loaded(data), node, typer.echo)
    typer.echo(f"{name} wiped and started again")
