// Package kube builds the Kubernetes client configuration every gpuslice
// program uses: a kubeconfig file when one is named (development, tests),
// the pod's service account otherwise (in-cluster). It builds no clientset:
// that links every API group's types into the binary, and the exporter,
// which needs pods only, should not carry them.
package kube

import (
	"fmt"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Config returns the REST config from kubeconfig, or the in-cluster one
// when kubeconfig is empty. userAgent names the program in API server logs
// and audit events.
func Config(kubeconfig, userAgent string) (*rest.Config, error) {
	var cfg *rest.Config
	var err error
	if kubeconfig != "" {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
	} else {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster Kubernetes config (pass --kubeconfig outside a cluster): %w", err)
		}
	}
	cfg.UserAgent = userAgent
	return cfg, nil
}
