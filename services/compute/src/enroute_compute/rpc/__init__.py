"""The compute's gRPC surface: servicer, conversions and the error mapping."""
