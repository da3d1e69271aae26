"""The runner's Transports (gRPC, in-process, pipe): see gateway.jobs."""
