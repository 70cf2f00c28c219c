# mpsd — build, test, lint. `make help` lists the targets.
SHELL := /bin/bash
GO ?= go
export CGO_ENABLED := 1
export CGO_CFLAGS := -O2 -g -Wno-deprecated-declarations
# Where hack/fetch-nvidia-mps.sh caches NVIDIA's real control daemons (outside the repo).
export MPSD_NVIDIA_MPS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mpsd/nvidia-mps
# Where hack/fetch-prometheus.sh caches promtool and prometheus (outside the repo).
export MPSD_PROMETHEUS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mpsd/prometheus
# Where hack/build-kubelet.sh caches the kubelet it builds (outside the repo).
export MPSD_KUBELET_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mpsd/kubelet
# Where hack/build-apiserver.sh caches the kube-apiserver and etcd it builds (outside the repo).
export MPSD_APISERVER_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mpsd/apiserver
# Where hack/build-control-plane.sh caches kube-scheduler, kube-controller-manager and containerd 1.7 (outside the repo).
export MPSD_CONTROLPLANE_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mpsd/controlplane
# Where hack/fetch-image-debs.sh caches the Debian packages of the image's user space.
export MPSD_IMAGE_DEBS_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/mpsd/image-debs
# Where make package-deb and package-image write what they build; the
# tests that install or run an artifact find it there.
export MPSD_DIST_DIR ?= $(CURDIR)/dist

BIN := bin
EMU := $(BIN)/emu
GOBIN_DIR := $(shell $(GO) env GOPATH)/bin
STATICCHECK ?= $(GOBIN_DIR)/staticcheck
STATICCHECK_VERSION := v0.8.2
TEST_TIMEOUT ?= 9m

.PHONY: all build build-dra programs emu demo chaos test test-go lint fmt vet staticcheck fetch-mps fetch-prometheus conformance clean help check-leftovers testrun man chart

all: build

help:
	@echo "make build        build everything; binaries in $(BIN)/, MPS emulator in $(EMU)/"
	@echo "make demo         build, then show two tenant groups sharing simulated GPUs: a crash, an Xid, requeues (about 20 s, plus 1-3 min of compiling on a first build; cgroups as root)"
	@echo "make bench        build, run the benchmarks against their baselines (< 10 min; root), write bench/REPORT.md and bench/report.json"
	@echo "make chaos        the chaos soak for CHAOS_DURATION (default 10m): random faults, invariants checked; CHAOS_SEED replays a run; a failed run keeps mpsd's log under chaos-out/"
	@echo "make test         fetch NVIDIA's real MPS control daemons and promtool (if reachable), run go test -race ./..., check for this run's leftovers, list the skipped tests"
	@echo "make lint         gofmt, go vet, staticcheck (architecture rules run as tests)"
	@echo "make fetch-mps    fetch NVIDIA's real nvidia-cuda-mps-control into $(MPSD_NVIDIA_MPS_CACHE)"
	@echo "make fetch-prometheus  fetch promtool and prometheus (Debian package) into $(MPSD_PROMETHEUS_CACHE)"
	@echo "make fetch-kubelet  build the kubelet (k8s.io/kubernetes, 5-10 min cold) into $(MPSD_KUBELET_CACHE)"
	@echo "make fetch-apiserver  build kube-apiserver and etcd (5-10 min cold, after the kubelet) into $(MPSD_APISERVER_CACHE)"
	@echo "make fetch-control-plane  build kube-scheduler, kube-controller-manager and containerd 1.7 (3 min cold, after the API server) into $(MPSD_CONTROLPLANE_CACHE)"
	@echo "make conformance  print the emulator-vs-real conformance table"
	@echo "make man          regenerate the man pages (docs/man) and the bash and zsh completions (docs/completion) from the programs' definitions"
	@echo "make chart        copy examples/prometheus's alert rules and examples/grafana's dashboard into the Helm chart (deploy/helm/mpsd/files) again, and its golden render"
	@echo "make package      make package-deb, make package-image and make package-chart"
	@echo "make package-chart  write dist/mpsd-<chart version>.tgz: the Helm chart, its default image the one make package-image writes"
	@echo "make package-deb  build, then dist/mpsd_<version>_<arch>.deb (internal/debpkg; reproducible from the commit and toolchain)"
	@echo "make package-image  build, then write dist/mpsd-image.tar: mpsd's container image (mpsd:<version>), the same bytes from the same commit and toolchain"
	@echo "make build-dra    build, then $(BIN)/mpsd-dra: mpsd with its Kubernetes DRA driver (--kubelet-dra; go build -tags dra), some 40 MiB more resident memory"
	@echo "make programs     build only bin/mpsd, bin/mpsctl and bin/mps-launch, stamped (what the package and the image hold)"
	@echo "make clean        remove $(BIN)/"

# mps-launch is built without cgo: a static binary reaches main about 1 ms
# sooner than one linked with libc, on every launch's critical path, and
# runs in any container. mpsd and mpsctl keep cgo (go-nvml, os/user).
# The binaries get their version and commit from hack/ldflags.sh (git
# describe, or a release tarball's VERSION file), stamped with -X: the go
# command's own VCS stamping misses a git worktree (.git is a file there)
# and is off wherever GOFLAGS says -buildvcs=false, and it would fail the
# build where git refuses the repository (safe.directory), so it is off.
# -trimpath keeps the checkout's and the module cache's paths out of the
# binaries, so that the package and the image built from one commit are
# the same bytes wherever it is checked out (with the same Go toolchain
# and C compiler). make programs builds only bin/'s three programs, what
# the package and the image hold.
build: emu programs
	$(GO) build ./...

.PHONY: programs
programs:
	@ldflags=$$(hack/ldflags.sh) && \
	if [ -n "$$(ls -d cmd/*/ 2>/dev/null)" ]; then $(GO) build -trimpath -buildvcs=false -ldflags "$$ldflags" -o $(BIN)/ $$($(GO) list ./cmd/... | grep -v '/cmd/mps-launch$$'); fi && \
	if [ -d cmd/mps-launch ]; then CGO_ENABLED=0 $(GO) build -trimpath -buildvcs=false -ldflags "$$ldflags" -o $(BIN)/ ./cmd/mps-launch; fi

# mpsd with its DRA driver (cmd/mpsd/dra_on.go): client-go and the
# Kubernetes API types, linked only with the tag dra, as mpsd-dra beside
# the default mpsd (docs/cluster.md).
build-dra: build
	@ldflags=$$(hack/ldflags.sh) && $(GO) build -tags dra -trimpath -buildvcs=false -ldflags "$$ldflags" -o $(BIN)/mpsd-dra ./cmd/mpsd

# The emulator programs carry the real binaries' names so they drop in via PATH.
# A first build (no bin/mpsd yet, or an empty Go build cache) compiles the
# dependencies too, which takes minutes and prints nothing; it says so first.
emu:
	@if [ ! -x $(BIN)/mpsd ] || [ -z "$$(ls -A "$$($(GO) env GOCACHE)" 2>/dev/null)" ]; then \
		echo "make: compiling mpsd, its tools and the MPS emulator; a first build with an empty Go build cache takes a few minutes (later ones seconds)"; fi
	@mkdir -p $(EMU)
	@if [ -d internal/mpsemu/cmd ]; then $(GO) build -o $(EMU)/ ./internal/mpsemu/cmd/...; fi

fetch-mps:
	@hack/fetch-nvidia-mps.sh || echo "make: real MPS daemons unavailable; tests that need them will say so and skip"

fetch-prometheus:
	@hack/fetch-prometheus.sh || echo "make: promtool unavailable; the alert rule tests will say so and skip"

# The kubelet end-to-end test (examples/kubernetes) runs it on containerd and runc.
.PHONY: fetch-kubelet
fetch-kubelet:
	@hack/build-kubelet.sh || echo "make: kubelet unavailable; the kubelet end-to-end test will say so and skip"

# The admission policy test on a real API server (examples/kubernetes) runs
# kube-apiserver on etcd. make test runs it after fetch-kubelet, whose
# wrapper module and Go build cache it shares.
.PHONY: fetch-apiserver
fetch-apiserver:
	@hack/build-apiserver.sh || echo "make: kube-apiserver or etcd unavailable; the admission policy test on a real API server will say so and skip"

# The control-plane end-to-end test (examples/kubernetes) runs a one-node
# cluster: etcd and kube-apiserver (fetch-apiserver), kube-scheduler,
# kube-controller-manager and the kubelet (fetch-kubelet) on containerd 1.7
# with CDI. make test runs it after fetch-apiserver, whose wrapper module
# and Go build cache it shares.
.PHONY: fetch-control-plane
fetch-control-plane:
	@hack/build-control-plane.sh || echo "make: kube-scheduler, kube-controller-manager or containerd 1.7 unavailable; the control-plane end-to-end test will say so and skip"

demo: build
	bash hack/demo.sh

CHAOS_DURATION ?= 10m
chaos: build testrun
	@mkdir -p chaos-out
	MPSEMU_BIN_DIR=$(CURDIR)/$(EMU) MPSD_BIN_DIR=$(CURDIR)/bin MPSD_CHAOS_DURATION=$(CHAOS_DURATION) $(if $(CHAOS_SEED),MPSD_CHAOS_SEED=$(CHAOS_SEED)) \
		GO=$(GO) $(TESTRUN) -race -count=1 -timeout 60m -artifacts -outputdir $(CURDIR)/chaos-out -run '^TestChaosSoak$$' -v ./mpsd

# One go test per benchmark, each with its own -benchtime (its number of
# samples); bench/report reads their output and writes the report. A
# failed benchmark does not stop the others; the report says what is
# missing and make fails.
BENCH_RUNS ?= LaunchOverhead=500x MPSSetup=30x Failover=100x Admission=10000x Footprint=1x Scrape=500x

.PHONY: bench
bench: fetch-mps build
	@$(GO) build -o $(BIN)/bench-report ./bench/report
	@set -o pipefail; (rc=0; for r in $(BENCH_RUNS); do \
		cmd="MPSEMU_BIN_DIR=\$$PWD/$(EMU) MPSD_BIN_DIR=\$$PWD/$(BIN) $(GO) test -run '^\$$' -bench '^Benchmark$${r%%=*}\$$' -benchtime $${r#*=} -benchmem ./mpsd"; \
		echo "bench-command: $$cmd"; eval "$$cmd" || rc=1; \
	done; exit $$rc) 2>&1 | $(BIN)/bench-report -tee -md bench/REPORT.md -json bench/report.json; rc=$$?; \
	echo "make bench: report in bench/REPORT.md and bench/report.json"; exit $$rc

# make test's runner (internal/testrun/cmd/testrun): go test -json on a
# fresh test run, shown as go test shows it; then the check for what this
# run alone left behind (removed, and the run fails); last, every skipped
# test with its reason. Its exit status is go test's (or 1 for leftovers).
TESTRUN := $(BIN)/testrun
testrun:
	@$(GO) build -o $(TESTRUN) ./internal/testrun/cmd/testrun

test: fetch-kubelet fetch-apiserver fetch-control-plane
test: package-image

test: package-deb
test: package-chart

test: fetch-mps fetch-prometheus build testrun
	MPSEMU_BIN_DIR=$(CURDIR)/$(EMU) MPSD_BIN_DIR=$(CURDIR)/bin GO=$(GO) $(TESTRUN) -race -timeout $(TEST_TIMEOUT) ./...

# The Debian package of what make build built (internal/debpkg,
# deploy/deb's maintainer scripts), stamped with hack/ldflags.sh's
# version; its files carry the commit's time, so one commit gives the same
# bytes (with the same Go toolchain and C compiler: see build). The systemd end-to-end test installs it with dpkg.
# The artifacts: the Debian package, the container image and the Helm chart.
.PHONY: package
package: package-deb package-image package-chart

.PHONY: package-deb
package-deb: build
	@$(GO) build -o $(BIN)/mkdeb ./internal/debpkg/cmd/mkdeb
	@ldflags=$$(hack/ldflags.sh) && \
	version=$$(sed -n 's/.*buildinfo\.version=\([^ ]*\).*/\1/p' <<<"$$ldflags") && \
	ctime=$$(sed -n 's/.*buildinfo\.commitTime=\([^ ]*\).*/\1/p' <<<"$$ldflags") && \
	rm -f $(MPSD_DIST_DIR)/mpsd_*.deb && \
	$(BIN)/mkdeb -version "$$version" -commit-time "$$ctime" -bin $(BIN) -root . -out $(MPSD_DIST_DIR)

# Checks the run named by MPSD_TEST_RUN (make test and make chaos check
# their own runs).
check-leftovers:
	@hack/check-leftovers.sh

# Prints scenario × driver generation: identical / DIFFERS (details above the table).
conformance: fetch-mps emu
	@table=$$(mktemp); \
	MPSEMU_BIN_DIR=$(CURDIR)/$(EMU) MPSD_CONFORMANCE_TABLE=$$table $(GO) test -count=1 -run 'TestConformance$$' ./internal/mpsemu/conformance/; rc=$$?; \
	echo; echo "NVIDIA's nvidia-cuda-mps-control vs the emulator in that generation's mode:"; cat $$table; rm -f $$table; exit $$rc

# The man pages and completion scripts are generated from the programs'
# own definitions by the tests that check them (TestManual in each
# package that owns a program's flags or the config schema); -update
# rewrites them. Commit what changed.
MAN_PACKAGES := ./internal/mpsctl ./launcher ./cmd/mpsd ./policy
man:
	$(GO) test -count=1 -run '^TestManual$$' $(MAN_PACKAGES) -args -update
	$(GO) test -count=1 -run '^TestShipped' ./internal/manpage

# The Helm chart (deploy/helm/mpsd) carries copies of the alert rules and
# the dashboard of examples/, as a packaged chart must; deploy/helm's
# TestChartCopiesExamples fails when they drift, TestDefaultRender when the
# default render leaves testdata/default.yaml. -update rewrites both.
# Commit what changed.
chart:
	$(GO) test -count=1 -run '^(TestChartCopiesExamples|TestDefaultRender)$$' ./deploy/helm -args -update

lint: fmt vet staticcheck

fmt:
	@out=$$(find . -name '*.go' -not -path './.git/*' -print0 | xargs -0 gofmt -l); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

vet:
	$(GO) vet ./...
	$(GO) vet -tags dra ./cmd/mpsd

staticcheck:
	@[ -x $(STATICCHECK) ] || $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION)
	$(STATICCHECK) ./...

# The container image archive (internal/ociimage): the programs as make
# build stamped them at /usr/bin, on the host's libc6 and libgcc-s1
# (hack/fetch-image-debs.sh), entrypoint /usr/bin/mpsd, tagged
# mpsd:<version>. Reproducible: the same commit and packages give the same
# bytes (with the same Go toolchain and C compiler: see build). Import it with `ctr -n k8s.io images import dist/mpsd-image.tar`.
.PHONY: package-image
package-image: build
	@mkdir -p $(MPSD_DIST_DIR)
	@$(GO) build -o $(BIN)/mpsd-image ./internal/ociimage/cmd/mpsd-image
	@base=$$(hack/fetch-image-debs.sh) && ldflags=$$(hack/ldflags.sh) && \
	$(BIN)/mpsd-image -out $(MPSD_DIST_DIR)/mpsd-image.tar -bin $(BIN) -ldflags "$$ldflags" $$(for b in $$base; do printf -- '-base %s -status %s ' "$$b" "$${b%.tar}.control"; done)

# The Helm chart (deploy/helm/mpsd, internal/helmchart) packaged as
# dist/mpsd-<chart version>.tgz with Helm's library: its version a SemVer
# of hack/ldflags.sh's version (v1.2.0-3-g<commit> is 1.2.0+3.g<commit>),
# its appVersion, the default image tag, the tag make package-image gives
# the image, so the packaged chart runs that image; its files dated the
# commit's time, so one commit gives the same bytes.
.PHONY: package-chart
package-chart:
	@mkdir -p $(MPSD_DIST_DIR) $(BIN)
	@$(GO) build -o $(BIN)/mkchart ./internal/helmchart/cmd/mkchart
	@ldflags=$$(hack/ldflags.sh) && rm -f $(MPSD_DIST_DIR)/mpsd-*.tgz && \
	$(BIN)/mkchart -chart deploy/helm/mpsd -ldflags "$$ldflags" -out $(MPSD_DIST_DIR)

clean:
	rm -rf $(BIN)
