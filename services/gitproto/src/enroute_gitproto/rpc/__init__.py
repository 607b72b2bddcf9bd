"""The gRPC edge of gitproto: protobuf conversion and error mapping (docs/rpc.md)."""
