"""Batch jobs over the API (detection.v1.BatchService + google.longrunning.Operations).

A job is a record in the job store (one JSON file per job holding its JobSpec, written
atomically, on any fsspec filesystem) plus the batch runner's own files under its output
prefix (gateway.batch: checkpointed parts, finished files, shard markers). Everything a
caller sees is derived from those two, never from memory only, so a restarted gateway (or
another replica) lists the same jobs:

- service.py: create, get, list, wait, cancel, delete; owners (gateway.identity);
- admission.py: what creation checks (fields, allowed inputs and outputs, limits, model);
- uploads.py: images uploaded for a job, bounded per upload, per caller and by the store;
- results.py, paging.py: result lines in input order; filters and page tokens;
- records.py, store.py, views.py: the record, the store, what an Operation shows;
- leases.py: which process runs a job (compare-and-swap generations in the store), so any
  replica answers for every job and one works on it;
- expiry.py: finished operations and unused uploads go after their TTLs (one replica at a
  time);
- local.py: the `local` executor, which runs jobs inside the gateway processes sharing the
  store, under their leases, straight on the pipeline, yielding to online requests;
- kube.py: the `kubernetes` executor, one Indexed Job per batch job (the `kubernetes`
  client is imported only there, only when that executor is chosen).
"""
