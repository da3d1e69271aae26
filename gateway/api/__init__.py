"""The API contract, below every door, batch, jobs, the client and check-models: each task's
binding (its messages <-> the pipeline's plain types, `bindings`), the jobs API's conversions
(`jobs`). Protobuf lives here and in the doors; nothing here imports a door, the pipeline,
batch or jobs' service."""
