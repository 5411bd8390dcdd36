//go:build tools

// Package tools pins the Kubernetes binaries that the integration and
// end-to-end tests run for real (kube-apiserver, kube-scheduler,
// kube-controller-manager, and the kubelet of the real test node). It is a separate module so the
// main module does not depend on k8s.io/kubernetes.
package tools

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
