// Package integration runs gpuslice's programs as real processes against
// real parts: a kube-apiserver with etcd, a fake kubelet serving the real
// PodResources gRPC API over a unix socket, and the simulated GPU node.
package integration
