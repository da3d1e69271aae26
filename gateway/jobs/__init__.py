"""Batch jobs, one wing: every image of a dataset through a task, results as JSON Lines,
started from the command line (`detection-batch`) or through the API (BatchService +
google.longrunning.Operations). Its sub-packages, from the floor up:

- spec/: the job itself. JobSpec (input, output, task, model, the task's options, shards:
  what OUTPUT's job.json and the job store's record hold), the record (records.Job and its
  states), what a caller sees (views: JobView, CreateJob) and the API's messages <-> these
  (conversions, for both doors).
- runner/: what `detection-batch` runs (its command line is runner/__main__): datasets
  (sources, manifest, tfrecord, reading, access), OUTPUT (output, storage, job, progress),
  shards in input order with checkpoints (shard), and the Transport it runs them over
  (transport: queue and failure rules).
- transports/: the Transports: over_grpc (streams to a gateway: the command line and runner
  pods), in_process (this process's pipeline: the local executor), over_pipe (a runner in a
  child process and its gateway).
- control/: the job service behind the doors (service: create, get, list, wait, cancel,
  delete, expire), what creation checks (admission), the store (store, cas, index, tally,
  store_budget), leases, uploads, results and paging; executor: what it asks of executors.
- executors/: local (jobs inside the gateway processes sharing the store, each runner in a
  child process: isolated, held) and kube (one Indexed Job per batch job; the `kubernetes`
  client is imported only there, only when that executor is chosen).

A job is a record in the job store plus the runner's own files under its output prefix;
everything a caller sees is derived from those two, never from memory only, so a restarted
gateway (or another replica) lists the same jobs. tests/test_layers.py holds the arrows
between the sub-packages (WING).
"""
