// Package e2e proves gpuslice's closed loop on a real control plane:
// kube-apiserver, etcd, kube-scheduler and kube-controller-manager run as
// processes, a fake kubelet (package fakekubelet) registers GPU nodes and
// runs the pods the scheduler binds on simulated GPUs, and gpuslice-plugin,
// gpuslice-exporter, gpuslice-tuner and a real Prometheus evaluating the
// alert rules run as processes around them. The tests are ordinary `go test`
// tests (part of `go test ./...`); they need the binaries in .cache/bin
// (`make test-bins`) and /usr/bin/prometheus.
package e2e
