//go:build tools

// Package nvtools pins NVIDIA's own Kubernetes components that the real-node
// tests run against gpuslice's simulated libnvidia-ml (nvidia-device-plugin
// and config-manager from github.com/NVIDIA/k8s-device-plugin). It is a
// separate module so NVIDIA's dependency tree stays out of the main go.mod.
package nvtools

import (
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/config-manager"
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
)
