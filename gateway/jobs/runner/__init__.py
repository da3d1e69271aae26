"""The batch runner (`detection-batch`): every image of a dataset through a task, results as
JSON Lines.

Modules, in data-flow order: the job's spec (gateway.jobs.spec: JobSpec) -> sources (what
INPUT holds: images, manifests, TFRecords via tfrecord; output files and shards; access:
where a job started through the API may read) -> shard (answers back in input order,
checkpoints) over a transport (transport: the shared rules; gateway.jobs.transports: gRPC to
a gateway, this process's pipeline, a pipe) -> job (job.json, markers, summary) -> output
(OUTPUT's layout, the one reader of committed parts) over storage (fsspec, atomic writes);
progress reads a job's progress back. The command line is __main__ (`detection-batch`).

Exactly once, resumable. Every output file is written whole, once, atomically (temporary
name + rename on a local disk, one PUT on an object store), so it exists only when complete.
While it is being produced, the answered lines are committed in input order as immutable
part files, `_batch/parts/<output>/<A>-<B>.jsonl` holding lines [A, B) and a header with
their counts, at least every `--checkpoint-seconds` (2 s). Answers that arrive out of
order wait in memory until the lines before them are answered; nothing is committed past a
gap. A restart (same arguments; SIGKILL at any instant is fine) takes, per output file:
- the output exists: done (parts left over from a kill after the output was written are
  deleted);
- else the parts that chain from line 0 with the right number of lines: lines [0, B) are
  kept and reading resumes at input item B; parts off the chain (a duplicate pod cutting
  its parts elsewhere) and temporaries are deleted.
So a restart redoes at most the last few seconds of answers, and each input item ends up
on exactly one line, at its position. The finished file is the concatenation of the chain,
written only once the input has been read to its end and every line is answered.

Arguments: `_batch/job.json` holds the JobSpec (input, task, model, options, shards) and a
SHA-256 of the input listing (keys and sizes). A run with other values, or over a changed
input, is refused; the gateway address, TLS, concurrency and timeouts may change between
restarts.

Shards: shard I of N takes the I-th contiguous block of the sorted input files (images,
or whole manifest / TFRecord files) and writes only its own output files and
`_SUCCESS.IIIII`. The shard that finds every marker present after writing its own writes
`summary.json` and `_SUCCESS` (also `detection-batch finalize OUTPUT`). N and I default
to $BATCH_SHARD_COUNT and Kubernetes' $JOB_COMPLETION_INDEX. Two processes on one shard
(Kubernetes may start a duplicate pod) write the same lines to the same names; one may
delete a part the other still needs and fail, and its restart resumes from what is left.
"""
