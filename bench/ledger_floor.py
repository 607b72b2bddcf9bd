"""A Ledger server that answers every ``Propose`` at once: the cost of the call alone.

``bench.ledger`` drives it with the same client as the three voters, so the
difference between the two is what Raft, the store and the state machine add,
and its rate is an upper bound for any ledger that answers one ``Propose`` per
commit on the same machine with the same gRPC stack. Usage (started by
``bench.ledger``): ``python -m bench.ledger_floor --listen 127.0.0.1:PORT``;
prints ``floor ready`` once it serves.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import Any

import grpc

from enroute_core.state import Change, Outcome, OutcomeCode, encode_change
from enroute_proto.gen.enroute.ledger.v1 import ledger_pb2, ledger_pb2_grpc

ANSWER = ledger_pb2.ProposeResponse(effects=encode_change(Change(Outcome(OutcomeCode.OK))))


class FloorLedger(ledger_pb2_grpc.LedgerServicer):
    async def Propose(  # noqa: N802 - the generated name
        self, request: ledger_pb2.ProposeRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> ledger_pb2.ProposeResponse:
        return ANSWER


async def serve(listen: str) -> None:
    server = grpc.aio.server()
    # the other methods answer UNIMPLEMENTED, as the generated base class does
    ledger_pb2_grpc.add_LedgerServicer_to_server(FloorLedger(), server)  # type: ignore[abstract]
    server.add_insecure_port(listen)
    await server.start()
    print("floor ready", flush=True)
    await server.wait_for_termination()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--listen", required=True, help="HOST:PORT")
    asyncio.run(serve(ap.parse_args().listen))


if __name__ == "__main__":
    main()
