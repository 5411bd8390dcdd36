// Package kube builds the Kubernetes client configuration every gpuslice
// program uses: a kubeconfig file when one is named (development, tests),
// the pod's service account otherwise (in-cluster).
package kube

import (
	"fmt"

	"k8s.io/client-go/kubernetes"
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

// Client returns a clientset from Config.
func Client(kubeconfig, userAgent string) (*rest.Config, kubernetes.Interface, error) {
	cfg, err := Config(kubeconfig, userAgent)
	if err != nil {
		return nil, nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, nil, fmt.Errorf("kubernetes client: %w", err)
	}
	return cfg, cs, nil
}
