"""The gateway's settings: one frozen object, its fields grouped (server, limits, upstream,
models, jobs, security, policy), each with the reason for its default; validated as a whole.

gateway.flags reads it from command-line flags and GATEWAY_* variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1024 * 1024
# Headroom over the payload for the rest of a message (shape, names, model spec).
MESSAGE_OVERHEAD = 1 * MIB


@dataclass(frozen=True)
class Settings:
    # === server: where and how the gateway serves ===
    # Where the gateway listens. 0.0.0.0 serves every interface, as a pod must.
    host: str = "0.0.0.0"
    port: int = 50051
    # The HTTP door (JSON, MessagePack, raw images, multipart; /ping and /invocations for
    # SageMaker-style hosting, which calls port 8080). 0 disables it, and then aiohttp is
    # not even imported.
    http_port: int = 8080
    # Gateway processes sharing the port (SO_REUSEPORT), for more than one core per pod:
    # one process runs Python on one core at a time. 1 serves in this process.
    workers: int = 1
    # Threads for image decoding (CPU-bound, releases the GIL in Pillow).
    decode_threads: int = field(default_factory=lambda: os.cpu_count() or 2)
    # Threads for heavy mapping (masks: Task.map_in_thread), apart from the decode threads.
    map_threads: int = field(default_factory=lambda: max(1, (os.cpu_count() or 2) // 2))
    # Prometheus metrics on http://host:metrics_port/metrics; 0 disables.
    metrics_port: int = 9090
    # How often TF Serving's model status is polled for health checks.
    health_interval: float = 5.0
    # Time in-flight requests get to finish after SIGTERM (pods get 30 s by default).
    shutdown_grace: float = 20.0
    log_level: str = "INFO"

    # === limits: what one request, body or stream may take ===
    # Encoded image size limit. 32 MiB covers any camera JPEG and a 4K PNG with room to spare.
    max_image_bytes: int = 32 * MIB
    # Decoded size limit, checked from the header before decoding (decompression bombs).
    # 50 megapixels is above 8K (33 MP) and keeps one decoded image under 150 MB.
    max_pixels: int = 50_000_000
    # The gateway server's gRPC receive limit; 0: derived from the image limits (see below).
    max_receive_message_bytes: int = 0
    # Ceilings on one request's work (gateway.domain.Cost), which a caller cannot raise; a
    # model's own in [models.NAME.limits]. So the worst request of every built-in task costs
    # about a second of one core (bench/results.md "cost"): detections asked for (1,000 boxes
    # map in a millisecond; more is refused), mask pixels pasted (one 12-megapixel mask) and
    # mask bytes answered (4 MiB, what a gRPC client receives by default); instances past those
    # two are left out, the cut stated in the result.
    max_detections_limit: int = 1000
    max_mask_pixels: int = 12_000_000
    max_answer_bytes: int = 4 * MIB
    # Work units (Cost.units) in flight, shared fairly as max_concurrent_requests is.
    max_concurrent_work: float = 100.0  # the worst single request (~66) and more beside it
    # Requests the gateway works on at once; more are refused with RESOURCE_EXHAUSTED so a
    # burst sheds load instead of queueing decoded images in memory.
    max_concurrent_requests: int = 64
    # Frames of one DetectStream in flight at once; the stream stops reading until the
    # oldest result is sent.
    stream_window: int = 4
    # Time a client gets to send a request's line and headers, counted from the connection's
    # start or the end of its previous response; also how long an idle keep-alive connection
    # stays open. Cuts off clients that trickle headers (slowloris) without a request in
    # flight. 75 s outlives the 60 s idle timeouts of common load balancers (which must close
    # first, or they may reuse a connection the gateway is closing).
    http_header_timeout: float = 75.0
    # Time a request's whole body may take to arrive once its headers are in; a stalled or
    # trickling upload gets 408 and its connection closed. 60 s moves a 32 MiB image at
    # ~5 Mbit/s; the body is read before the request takes a concurrency slot, so a slow
    # client never holds one.
    http_body_timeout: float = 60.0
    # What an HTTP request may carry besides its image, in bytes: options, form fields and a
    # MessagePack body's metadata (which comes back in the result). 64 KiB holds a thousand
    # short keys and values; past it the body is refused (413) before anything is built from
    # the rest.
    http_max_metadata_bytes: int = 64 * 1024
    # Keys of a MessagePack body's metadata. Each becomes objects and a member of the result;
    # 1,000 is far beyond what callers attach (camera, frame, timestamps) and reads in a few
    # milliseconds. A map announcing more is refused from its header, before it is read.
    http_max_metadata_keys: int = 1000

    # === upstream: the TF Serving hop ===
    # TF Serving's gRPC target: host:port, or dns:///headless-service:8500 with
    # upstream_lb=round_robin to spread calls over every pod (a plain ClusterIP Service pins
    # one gateway replica to one TF Serving pod, because gRPC keeps one HTTP/2 connection).
    upstream: str = "127.0.0.1:8500"
    upstream_lb: str = "pick_first"
    # Longest a TF Serving call may take when the client set no shorter deadline. Detection
    # runs 50 ms to a few seconds on CPU; 30 s leaves room for a cold model and a full queue.
    upstream_timeout: float = 30.0
    # Limit on requests to TF Serving; 0: derived from the pixel limit (see below).
    upstream_max_send_bytes: int = 0
    # OD API responses are small once output_filter drops the raw_* tensors; 64 MiB still
    # fits a model that returns masks.
    upstream_max_receive_bytes: int = 64 * MIB
    # Retries towards TF Serving (see README "Reliability"): attempts per call including the
    # first, on UNAVAILABLE (connection or a server shutting down), never on TF Serving's
    # queue-full UNAVAILABLE, always within the caller's deadline. 3 attempts ride out a pod restart
    # or a dropped connection without stretching a real outage.
    upstream_max_attempts: int = 3
    # First retry waits up to this long (full jitter), doubling per attempt, capped at 1 s.
    upstream_retry_backoff: float = 0.05
    # Retries may add at most this fraction of calls (after a reserve of 10), so an outage
    # does not multiply the load on a TF Serving that is coming back.
    upstream_retry_budget: float = 0.1
    # TLS to TF Serving, for clusters without a mesh: the CA that signed its certificate
    # (empty: the system roots), a client certificate and key for mTLS, and the name to check
    # in its certificate when it differs from the target's host.
    upstream_tls: bool = False
    upstream_ca_file: str = ""
    upstream_cert_file: str = ""
    upstream_key_file: str = ""
    upstream_server_name: str = ""

    # === models: models and request defaults ===
    # The default model: used when a detection request names none (unless the model config
    # says otherwise), by readiness, and by the HTTP door's /invocations and /ping.
    model: str = "detector"
    # Per-model config (TOML, gateway/models/): task, labels, input preparation, request
    # defaults. Empty: every model is a detection model with the task's defaults.
    model_config: str = ""
    # Per-model OD API label maps: model name -> label_map.pbtxt.
    label_maps: Mapping[str, Path] = field(default_factory=dict)
    # The operator's values of the request defaults the tasks declare (gateway.api.task's
    # Task.request_defaults: --min-score, --max-detections), by name; not a flag itself
    # (gateway.flags makes one of each). A default missing here is the task's own.
    request_defaults: Mapping[str, float | int] = field(default_factory=dict)

    # === jobs: batch jobs over the API (gateway/jobs) ===
    # Where jobs run: local (inside this process, yielding to online requests) or
    # kubernetes (one Indexed Job per batch job).
    batch_executor: str = "local"
    # Job records, uploads and default outputs: a local directory or any fsspec URI (shared
    # storage such as s3://bucket/jobs when several replicas or the kubernetes executor run).
    job_store: str = "/tmp/detection-gateway-jobs"
    # Output prefixes a caller may name (comma-separated); the job store is always allowed.
    batch_allowed_uris: str = ""
    # Input prefixes a job created through the API may read (comma-separated, with their
    # scheme: s3://bucket/data, /srv/datasets); anything else (http:// too) is PERMISSION_DENIED.
    # Uploads are always allowed. The command-line runner is not limited.
    batch_allowed_input_uris: str = ""
    # Identities (comma-separated, typed: uri:<URI SAN> or cn:<common name>) that see and
    # manage every caller's operations; the runner pods', which may name a job's owner.
    batch_admins: str = ""
    batch_runner_identities: str = ""
    # Callers without an identity (no client certificate, no trusted header) may use jobs and
    # uploads; they are then all one tenant, each seeing the others' work. For development.
    batch_allow_anonymous: bool = False
    # Unfinished jobs at once, in total and per caller.
    batch_max_jobs: int = 32
    batch_max_jobs_per_caller: int = 8
    # Finished operations one caller keeps (until DeleteOperation or GATEWAY_OPERATION_TTL);
    # past it, new jobs are refused, never old results removed behind the caller's back.
    batch_max_finished_per_caller: int = 1000
    # Largest upload (all UploadImages calls of one upload_id together), all of one caller's
    # stored uploads, and one caller's uploads not used by a job yet.
    batch_max_upload_bytes: int = 1024 * MIB
    batch_max_upload_bytes_per_caller: int = 2048 * MIB
    batch_max_uploads_per_caller: int = 16
    # Images in one upload: each is a file of its own in the store, taken in and written at a
    # cost per image whatever its size, so the byte limits alone let tiny images buy CPU
    # cheaply. Datasets larger than this belong in storage the gateway reads (input_uri).
    batch_max_upload_images: int = 10_000
    # Seconds one upload call (UploadImages, POST /v1/uploads) may take in all: a client
    # trickling a byte a minute ends here, not never. 600 s moves 1 GiB at ~15 Mbit/s;
    # larger uploads go in several calls (upload_id).
    batch_upload_timeout: float = 600.0
    # What one job may read, checked before the bytes are read (the image limit above bounds
    # each image, manifest line and TFRecord record too): the files its input lists (the
    # listing stops past it), the manifest lines and TFRecord records it reads (blank lines
    # included; a job over an upload also within batch_max_upload_images, so a manifest
    # cannot buy what uploaded files may not), and the bytes one compressed manifest or
    # TFRecord file may inflate to (a 65 KB gzip can hold gigabytes of zeros).
    batch_max_input_files: int = 100_000
    batch_max_items_per_job: int = 1_000_000
    batch_max_decompressed_bytes: int = 4096 * MIB
    # Everything the gateway writes to its job store (uploads, results kept there); past it,
    # uploads and new jobs are refused until operations are deleted or expire. Size the
    # store's volume from it (k8s/ does).
    job_store_max_bytes: int = 4096 * MIB
    # Seconds an upload no job uses is kept (since its last image), and a finished operation
    # with the results kept in the store (7 days; DeleteOperation frees them sooner).
    upload_ttl: float = 86400.0
    operation_ttl: float = 604800.0
    # A job runs in one gateway process at a time under a lease in the job store, renewed
    # while it runs; when its holder dies, another replica takes the job over this long
    # after the last renewal.
    job_lease_seconds: float = 30.0
    # local executor: jobs running at once, images in flight over all of them, and the
    # number of online images in flight at which batch images are refused (retried later;
    # 0 pauses batch work: jobs are accepted and wait).
    batch_max_running: int = 2
    batch_concurrency: int = 4
    batch_yield_threshold: int = 2
    # local executor: each job's shard runs in a child process with this much address
    # space (RLIMIT_AS; the kernel's OOM killer also picks it before the gateway), so an
    # input that needs more kills the runner, not online serving; a job whose runner dies
    # this many times fails as a poison job instead of being retried forever.
    batch_runner_memory_bytes: int = 1024 * MIB
    batch_runner_max_deaths: int = 3
    # Seconds between the runner's checkpoints (at most this much is redone after a crash).
    batch_checkpoint_seconds: float = 2.0
    # kubernetes executor: namespace (empty: the pod's own), kubeconfig (empty: in-cluster),
    # the runner's image (empty: the gateway pod's own, so runners are the same release), the
    # gateway address its pods call, and their resources.
    batch_namespace: str = ""
    batch_kubeconfig: str = ""
    batch_image: str = ""
    batch_runner_target: str = "detection-gateway:50051"
    batch_parallelism: int = 10
    batch_cpu: str = "250m,1"
    batch_memory: str = "512Mi,1Gi"

    # === security: TLS, caller identity and gRPC connection limits (docs/security.md) ===
    # TLS on the gateway's own port: certificate chain and key; with a client CA, clients
    # must present a certificate it signed (mTLS).
    tls_cert_file: str = ""
    tls_key_file: str = ""
    tls_client_ca_file: str = ""
    # Who is calling is the mTLS client certificate's identity (URI SAN such as a SPIFFE ID,
    # else the subject CN). x-forwarded-client-cert counts only when this is true, and then
    # only its last element (the one the nearest proxy appended after verifying the client's
    # certificate: Istio's sidecar with mTLS); set it only where every request passes such a
    # proxy, otherwise a client could name itself. Neither: "anonymous".
    trust_xfcc: bool = False
    # Calls open at once on one connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS). gRPC
    # clients queue calls beyond it; a client that ignores the setting gets the extra streams
    # refused (REFUSED_STREAM). 100 is HTTP/2's recommended minimum and above the 64 requests
    # the gateway works on at once, so a well-behaved client never waits on it, while one
    # connection cannot make the server keep unbounded per-stream state.
    grpc_max_concurrent_streams: int = 100
    # Shortest time between a client's keepalive pings; after more than two sooner (gRPC's
    # ping strikes; the server sending headers or data forgives them) the connection is closed
    # with GOAWAY ENHANCE_YOUR_CALM "too_many_pings". 10 s is the floor grpc-go and grpc-java
    # put on their clients' keepalive time, so no client within its library's limits is cut,
    # and a ping flood ends at its third ping. Idle connections may be pinged at this rate too,
    # so clients can keep them open through load balancers' idle timeouts.
    grpc_min_ping_interval: float = 10.0
    # Age at which a connection is asked to go away (GOAWAY, with gRPC's +-10 % jitter); the
    # client reconnects for its next call. Long-lived connections then spread over replicas
    # added since, and none is held forever. 30 min costs a client one reconnect (and TLS
    # handshake) per half hour. 0: connections live as long as the client keeps them.
    grpc_max_connection_age: float = 1800.0
    # Time the calls in flight on a connection past its age get to finish; then the connection
    # is closed and they end with UNAVAILABLE (the batch runner, like any streaming client,
    # reopens its stream). 5 min covers any unary call (30 s upstream timeout) many times.
    grpc_max_connection_age_grace: float = 300.0
    # Largest metadata (headers) one call may send, advertised as HTTP/2
    # SETTINGS_MAX_HEADER_LIST_SIZE; larger calls are refused with RESOURCE_EXHAUSTED. 16 KiB
    # is gRPC's own hard limit: room for a mesh's x-forwarded-client-cert with the client
    # certificate, a bearer token and trace headers.
    grpc_max_metadata_bytes: int = 16 * 1024

    # === policy: who may do how much (gateway/policy) ===
    # The quota file (TOML: [default] and [callers."<identity>"] tables with rate, burst and
    # concurrency; gateway/policy/quotas.py), looked at for changes every second. Empty:
    # no per-caller quotas; the concurrency limit is still shared fairly among callers.
    quotas: str = ""
    # Callers the fair share keeps state for (~250 bytes each; policy/fairshare.py says what
    # happens past it). 10,000: far more teams than one gateway serves; a few MiB at most.
    max_callers: int = 10_000
    # Typed identities (uri:..., cn:...) that may read rollout statistics. Empty: anyone
    # while the gateway knows no caller (no client CA, no trusted XFCC), else no one.
    operator_identities: str = ""
    # Secret salting sticky canary hashes, so a caller cannot pick its side; the same on
    # every replica (from a Secret). Empty: a random salt per process.
    rollout_salt: str = ""
    # The payload log (gateway/paylog): each image's request and answer as a CloudEvent, to
    # a file (path or file:///path), object storage (any fsspec URL: s3://bucket/prefix) or
    # an HTTP sink (http(s)://, one POST per event). Empty: off. Operator-set only.
    payload_log: str = ""
    # Which callers' requests are logged and how (TOML, gateway/paylog/sampling.py),
    # reloaded on change. Empty: every request, images as their SHA-256.
    payload_log_config: str = ""
    # Bytes records may hold while queued or being written (whole records); past it records
    # are dropped and counted. 64 MiB: minutes of a stalled sink, a bounded cost in memory.
    payload_log_queue_bytes: int = 64 * MIB
    # Log files rotate, and objects close, at this size (or after 10 s of events).
    payload_log_rotate_bytes: int = 64 * MIB
    # Seconds one POST to an HTTP sink may take in all; then that event is dropped (counted).
    # 5 s outlasts a healthy collector's slowest answer by far.
    payload_log_timeout: float = 5.0

    @property
    def upstream_uses_tls(self) -> bool:
        return self.upstream_tls or bool(self.upstream_ca_file or self.upstream_cert_file)

    @property
    def server_max_receive_bytes(self) -> int:
        """Gateway server receive limit: any image within max_image_bytes fits."""
        return self.max_receive_message_bytes or self.max_image_bytes + MESSAGE_OVERHEAD

    @property
    def http_max_body_bytes(self) -> int:
        """HTTP body limit: any image within max_image_bytes fits, even base64 in JSON.

        The gRPC receive limit plus base64's third (JSON carries the image as base64), so the
        same images pass both doors; bodies over it get 413 before they are buffered.
        """
        return self.server_max_receive_bytes + (self.max_image_bytes + 2) // 3

    @property
    def upstream_send_bytes(self) -> int:
        """Upstream send limit: any image within max_pixels fits as a uint8 tensor."""
        payload = max(3 * self.max_pixels, self.max_image_bytes)
        return self.upstream_max_send_bytes or payload + MESSAGE_OVERHEAD

    def validate(self) -> None:
        if self.upstream_lb not in ("pick_first", "round_robin"):
            raise ValueError(
                f"upstream-lb must be pick_first or round_robin, got {self.upstream_lb!r}"
            )
        # Settings that must be at least 1.
        whole = (
            "max_image_bytes max_pixels max_concurrent_requests max_callers "
            "grpc_max_concurrent_streams http_max_metadata_bytes http_max_metadata_keys "
            "stream_window decode_threads workers batch_max_jobs batch_max_jobs_per_caller "
            "batch_max_finished_per_caller batch_max_upload_bytes "
            "batch_max_upload_bytes_per_caller batch_max_uploads_per_caller "
            "batch_max_upload_images batch_max_input_files batch_max_items_per_job "
            "batch_max_decompressed_bytes job_store_max_bytes batch_max_running batch_concurrency "
            "batch_runner_max_deaths batch_parallelism max_detections_limit max_mask_pixels "
            "max_answer_bytes map_threads"
        )
        for name in whole.split():
            if getattr(self, name) < 1:
                raise ValueError(f"{name.replace('_', '-')} must be at least 1")
        if self.workers > 1 and self.port == 0:
            raise ValueError("workers above 1 need a fixed port (they share it), not port 0")
        if self.http_port < 0 or self.port < 0:
            raise ValueError("port and http-port must be >= 0 (http-port 0 disables HTTP)")
        if self.http_port and self.http_port in (self.port, self.metrics_port):
            raise ValueError(
                f"http-port {self.http_port} is also the gRPC or metrics port; give each its own"
            )
        if self.http_header_timeout <= 0 or self.http_body_timeout <= 0:
            raise ValueError("http-header-timeout and http-body-timeout must be positive")
        for name in (
            "grpc_min_ping_interval",
            "grpc_max_connection_age",
            "grpc_max_connection_age_grace",
        ):
            if getattr(self, name) < 0:
                raise ValueError(f"{name.replace('_', '-')} must be >= 0")
        if self.grpc_max_metadata_bytes < 1024:
            raise ValueError(
                "grpc-max-metadata-bytes must be at least 1024 (a call's own headers take "
                "about 300 bytes)"
            )
        if not self.max_concurrent_work > 0:
            raise ValueError("max-concurrent-work must be a positive number of work units")
        if self.upstream_timeout <= 0 or self.health_interval <= 0:
            raise ValueError("upstream-timeout and health-interval must be positive")
        if self.upstream_max_attempts < 1:
            raise ValueError("upstream-max-attempts must be at least 1 (1 disables retries)")
        if self.upstream_retry_backoff < 0 or self.upstream_retry_budget < 0:
            raise ValueError("upstream-retry-backoff and upstream-retry-budget must be >= 0")
        if bool(self.upstream_cert_file) != bool(self.upstream_key_file):
            raise ValueError("upstream-cert-file and upstream-key-file go together (mTLS)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise ValueError("tls-cert-file and tls-key-file go together")
        if self.tls_client_ca_file and not self.tls_cert_file:
            raise ValueError("tls-client-ca-file needs tls-cert-file and tls-key-file")
        if self.batch_executor not in ("local", "kubernetes"):
            raise ValueError(
                f"batch-executor must be local or kubernetes, got {self.batch_executor!r}"
            )
        if self.batch_yield_threshold < 0:
            raise ValueError("batch-yield-threshold must be >= 0 (0 pauses local batch work)")
        if self.batch_runner_memory_bytes < 256 * MIB:
            raise ValueError(
                "batch-runner-memory-bytes must be at least 268435456 (256 MiB): the runner "
                "process itself takes about 200 MiB of address space"
            )
        if self.batch_checkpoint_seconds <= 0:
            raise ValueError("batch-checkpoint-seconds must be positive")
        if self.batch_upload_timeout <= 0:
            raise ValueError("batch-upload-timeout must be positive")
        if self.upload_ttl <= 0 or self.operation_ttl <= 0 or self.job_lease_seconds <= 0:
            raise ValueError("upload-ttl, operation-ttl and job-lease-seconds must be positive")
        if self.payload_log_queue_bytes < MIB or self.payload_log_rotate_bytes < MIB:
            raise ValueError(
                "payload-log-queue-bytes and payload-log-rotate-bytes must be at least "
                "1048576 (1 MiB)"
            )
        if not self.payload_log_timeout > 0:
            raise ValueError("payload-log-timeout must be positive (seconds)")
        if self.payload_log_config and not self.payload_log:
            raise ValueError(
                "payload-log-config is set but payload-log is not: name where the log goes"
            )
