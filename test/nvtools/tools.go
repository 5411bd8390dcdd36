//go:build tools

// Package nvtools pins NVIDIA's own Kubernetes components that the real-node
// tests run against gpuslice's simulated libnvidia-ml (nvidia-device-plugin
// and config-manager from github.com/NVIDIA/k8s-device-plugin), and the
// NVIDIA container runtime in CDI mode (nvidia-container-runtime.cdi from
// github.com/NVIDIA/nvidia-container-toolkit, the runtime behind k3s's
// nvidia-cdi RuntimeClass), which injects CDI devices for the test node's
// containerd 1.6 (that has no CDI support of its own). It is a separate
// module so NVIDIA's dependency tree stays out of the main go.mod.
package nvtools

import (
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/config-manager"
	_ "github.com/NVIDIA/k8s-device-plugin/cmd/nvidia-device-plugin"
	_ "github.com/NVIDIA/nvidia-container-toolkit/cmd/nvidia-container-runtime.cdi"
)
