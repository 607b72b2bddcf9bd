"""gRPC edge of the ledger: servicers, conversions and the one error mapping."""
