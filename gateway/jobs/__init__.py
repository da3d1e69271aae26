"""Batch jobs over the API (detection.v1.BatchService + google.longrunning.Operations).

A job is a record in the job store (store.py: one JSON file per job, written atomically, on
any fsspec filesystem) plus the batch runner's own files under its output prefix
(gateway.batch: checkpointed parts, finished files, shard markers). Everything a caller
sees is derived from those two, never from memory only, so a restarted gateway (or another
replica) lists the same jobs:

- service.py: creation (checks that fail at once with a clear status), operations (get,
  list, wait, cancel, delete), uploads, reading results in input order;
- progress.py: counts and result lines read from an output prefix;
- local.py: the `local` executor, which runs the runner inside the gateway against a
  loopback lane that yields to online requests;
- kube.py: the `kubernetes` executor, one Indexed Job per batch job (the `kubernetes`
  client is imported only there, only when that executor is chosen).
"""
