# gpuslice — build, test and demo. `make help` lists the targets.
SHELL := /usr/bin/env bash
GO ?= go
export CGO_CFLAGS ?= -Wno-deprecated-declarations
# envtest and the e2e tests find kube-apiserver, etcd, kube-scheduler and
# kube-controller-manager here (built once by hack/test-bins.sh).
export KUBEBUILDER_ASSETS ?= $(CURDIR)/.cache/bin
BIN := bin
# As the image builds them (Dockerfile): no symbol table or DWARF, a third
# smaller and fewer pages to map.
LDFLAGS ?= -s -w
COMMANDS := exporter tuner plugin
GOTEST_FLAGS ?= -count=1 -timeout 45m
VERSION ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/helm/gpuslice/Chart.yaml)

.PHONY: help build test test-deps unit bench bench-scrape test-gpu test-gpu-bundle demo lint fmt vet golangci-lint dashboards manifests test-bins image image-import image-docker clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

build: ## build bin/gpuslice-{exporter,tuner,plugin}
	@mkdir -p $(BIN)
	@for c in $(COMMANDS); do $(GO) build -trimpath -ldflags="$(LDFLAGS)" -o $(BIN)/gpuslice-$$c ./cmd/$$c || exit 1; done

demo: build ## run the exporter on a simulated GPU node (no GPU, no cluster)
	$(GO) run ./test/demo --exporter $(BIN)/gpuslice-exporter

test-bins: ## install the Debian packages, build the real Kubernetes binaries, helm, NVIDIA's plugin and the simulated libnvidia-ml the tests run (cached)
	@bash hack/test-deps.sh
	@bash hack/test-bins.sh >/dev/null
	@bash hack/helm.sh >/dev/null
	@bash hack/nvidia-bins.sh >/dev/null
	@bash hack/libnvml.sh >/dev/null

# The whole suite. The Kubernetes binaries come first (most packages start a
# control plane); helm, NVIDIA's binaries and the simulated libnvidia-ml build
# in the background meanwhile, since the real-node tests spend most of their
# time waiting on the kubelet: tests that need one of them call its script,
# which waits for the build in progress (a lock in each script); the real node
# waits for NVIDIA's container runtime before it starts. For the same
# reason the real-node package, the longest by far, starts at once beside the
# rest instead of last in `go test ./...`'s queue; its output is kept in
# .cache/realnode-test.log and printed after the rest.
test: test-deps ## the whole suite: unit, integration, real node, alerts, dashboards, chart
	@bash hack/test-bins.sh >/dev/null
	@mkdir -p .cache; ( bash hack/libnvml.sh && bash hack/nvidia-bins.sh && bash hack/helm.sh ) >.cache/background-builds.log 2>&1 & bg=$$!; \
	  $(GO) test $(GOTEST_FLAGS) ./test/realnode/ >.cache/realnode-test.log 2>&1 & rn=$$!; \
	  rc=0; \
	  $(GO) vet ./... || rc=1; \
	  bash hack/golangci-lint.sh || rc=1; \
	  unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; rc=1; fi; \
	  [ $$rc -ne 0 ] || $(GO) test $(GOTEST_FLAGS) $$($(GO) list ./... | grep -v '/test/realnode$$') || rc=1; \
	  wait $$rn || rc=1; cat .cache/realnode-test.log; \
	  wait $$bg || { echo "background builds failed:"; tail -30 .cache/background-builds.log; rc=1; }; \
	  exit $$rc

test-deps:
	@bash hack/test-deps.sh

unit: ## fast tests only (-short skips the control-plane tests)
	$(GO) test -count=1 -short ./internal/...

bench: test-bins ## Go benchmarks (ns/op, B/op, allocs/op)
	$(GO) test -run '^$$' -bench . -benchmem -count=1 ./internal/... ./test/bench/...

NODE_EXPORTER ?= /usr/bin/prometheus-node-exporter
SCRAPES ?= 1000
# e.g. SCRAPE_FLAGS=-as-prometheus (OpenMetrics and gzip, as Prometheus
# asks), -procs 4, -replicas 4.
SCRAPE_FLAGS ?=

bench-scrape: build ## gpuslice-exporter's CPU and memory per scrape next to node_exporter's, in one run
	@command -v $(NODE_EXPORTER) >/dev/null || { apt-get update -qq && apt-get install -y -qq prometheus-node-exporter >/dev/null; } || \
		{ echo "bench-scrape: $(NODE_EXPORTER) is missing and apt-get could not install prometheus-node-exporter"; exit 1; }
	$(GO) run ./test/bench/scrapecost -exporter $(BIN)/gpuslice-exporter -node-exporter $(NODE_EXPORTER) -scrapes $(SCRAPES) $(SCRAPE_FLAGS)

test-gpu: ## on a machine with an NVIDIA GPU (root, cgroup v2, Python with PyTorch; JAX/CuPy optional): real processes in pod cgroups against the exporter and plugin; elsewhere says why it did not run
	$(GO) run ./test/gpu $(TEST_GPU_FLAGS)

test-gpu-bundle: ## build test-gpu, the programs and node_exporter into .gpu/ for a GPU machine without Go: run `.gpu/test-gpu -bin .gpu -node-exporter .gpu/node_exporter` there, in the repository's root
	@mkdir -p .gpu
	$(GO) build -trimpath -ldflags="-s -w" -o .gpu/test-gpu ./test/gpu
	@for c in exporter plugin; do $(GO) build -trimpath -ldflags="-s -w" -o .gpu/gpuslice-$$c ./cmd/$$c || exit 1; done
	$(GO) build -trimpath -ldflags="-s -w" -o .gpu/nvmlcost ./hack/nvmlcost
	@ne=$$(command -v $(NODE_EXPORTER) || true); if [ -n "$$ne" ]; then cp "$$ne" .gpu/node_exporter; else echo "no $(NODE_EXPORTER): the cost check will skip node_exporter"; fi

lint: fmt vet golangci-lint ## gofmt, go vet and golangci-lint (.golangci.yml)

fmt:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi

vet:
	$(GO) vet ./...

golangci-lint: ## golangci-lint alone (installed once from the Go module proxy into .cache/bin)
	@bash hack/golangci-lint.sh

dashboards: ## regenerate dashboards/*.json from the Go code
	$(GO) run ./dashboards/cmd/gendashboards

manifests: dashboards test-bins ## re-render deploy/manifests and the chart's copies of rules and dashboards
	$(GO) test -count=1 ./deploy -run '^(TestChartCopies|TestManifests)$$' -update

IMAGE ?= ghcr.io/gpuslice/gpuslice:$(VERSION)
IMAGE_TAR ?= .cache/image/gpuslice.tar
# The test node's containerd (test/realnode/scripts/up.sh); on k3s use
# `sudo k3s ctr images import $(IMAGE_TAR)` instead.
CONTAINERD_SOCK ?= /tmp/gpuslice-realnode/containerd/containerd.sock

image: ## build the image $(IMAGE) as $(IMAGE_TAR) on this machine: no container engine, no registry, nothing pulled
	@VERSION=$(VERSION) IMAGE=$(IMAGE) bash hack/image.sh $(IMAGE_TAR)

image-import: image ## import the image into the test node's containerd (CONTAINERD_SOCK)
	ctr --address $(CONTAINERD_SOCK) -n k8s.io images import $(IMAGE_TAR)

image-docker: ## build the same image from the Dockerfile (needs a Docker engine and registry access)
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

clean:
	rm -rf $(BIN)
