# syntax=docker/dockerfile:1
#
# The one gpuslice image: gpuslice-exporter, gpuslice-tuner and
# gpuslice-plugin in /usr/local/bin. The Helm chart (deploy/helm/gpuslice)
# runs each as its container's command. Build from the repository root:
#
#   docker build -t ghcr.io/gpuslice/gpuslice:0.1.0 .
#
# go-nvml needs cgo, so the programs link glibc dynamically and the runtime
# image is a glibc one. NVML itself (libnvidia-ml.so.1) is not in the image:
# it belongs to the node's driver, and the NVIDIA container runtime mounts it
# into the exporter and plugin (the chart's runtimeClassName and
# NVIDIA_VISIBLE_DEVICES) under /usr/lib/x86_64-linux-gnu, which Debian's
# loader searches; go-nvml dlopens it at start.
#
# `make image` builds the same image with no container engine and no
# registry (hack/image.sh: the programs built here plus the libraries they
# link, in one layer); deploy/image_test.go (TestLocalImage) keeps its
# layout, USER, ENV, EXPOSE and labels equal to this file's.
# deploy/deploy_test.go (TestDockerfile) checks this file against the chart:
# the binaries are where the chart's commands find them, the user agrees with
# the chart's securityContexts, and the sources copied are all the programs
# import.

ARG GO_IMAGE=golang:1.26-bookworm
# Debian 12's glibc, as in the build image.
ARG BASE_IMAGE=gcr.io/distroless/base-debian12:nonroot

FROM ${GO_IMAGE} AS build
WORKDIR /src
ENV CGO_ENABLED=1 CGO_CFLAGS=-Wno-deprecated-declarations
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY cmd/ cmd/
COPY internal/ internal/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    go build -trimpath -ldflags="-s -w" -o /out/gpuslice-exporter ./cmd/exporter && \
    go build -trimpath -ldflags="-s -w" -o /out/gpuslice-tuner ./cmd/tuner && \
    go build -trimpath -ldflags="-s -w" -o /out/gpuslice-plugin ./cmd/plugin

FROM ${BASE_IMAGE}
# The chart's appVersion; `make image-docker` passes --build-arg VERSION.
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpuslice" \
      org.opencontainers.image.description="Safe NVIDIA GPU time-slicing on Kubernetes: gpuslice-exporter, gpuslice-tuner, gpuslice-plugin" \
      org.opencontainers.image.source="https://github.com/gpuslice/gpuslice" \
      org.opencontainers.image.url="https://github.com/gpuslice/gpuslice" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/ /usr/local/bin/
ENV PATH=/usr/local/bin:/usr/bin:/bin
# distroless's nonroot user, the tuner's uid in the chart. The exporter and
# plugin read and write the kubelet's root-owned files, so the chart runs them
# with runAsUser 0 (and no capabilities); every component's pod sets its uid,
# the image's USER decides nothing there.
USER 65532:65532
EXPOSE 9846 9847 9848
