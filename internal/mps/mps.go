// Package mps holds what gpuslice-plugin and gpuslice-exporter both need to
// know about CUDA MPS: the client environment variables, the format of the
// pinned memory limit, how a replica's limit and SM share are computed, and
// the directory layout of NVIDIA's mps-control-daemon. The plugin writes
// these into a container's allocation; the exporter reads them back from the
// container's processes, so both sides must agree on one definition.
package mps

import (
	"fmt"
	"math"
	"path/filepath"
	"strconv"
	"strings"
)

// CUDA MPS clients read these from their environment. The pinned limit is
// what makes MPS worth choosing over time-slicing: a client that passes it
// gets a clean out-of-memory while the other clients keep their memory.
const (
	// EnvPipeDirectory is where the client finds the control daemon's
	// pipes.
	EnvPipeDirectory = "CUDA_MPS_PIPE_DIRECTORY"
	// EnvPinnedMemLimit caps the device memory the client may allocate:
	// "<ordinal>=<limit>" pairs separated by commas, such as "0=12288M".
	// Ordinals are the client's own CUDA device numbers.
	EnvPinnedMemLimit = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
	// EnvThreadPercentage caps the share of the SMs the client's kernels
	// may occupy, in percent.
	EnvThreadPercentage = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
)

// ServerComm is the command name (/proc/<pid>/comm) of the MPS server, the
// one process that holds the GPU for all of a daemon's clients.
const ServerComm = "nvidia-cuda-mps-server"

// The directory layout of NVIDIA's mps-control-daemon (v0.19,
// cmd/mps-control-daemon/mps root.go and daemon.go), kept so that NVIDIA's
// daemon and our chart's daemon serve gpuslice-plugin alike: under a host
// root (its chart's mps.root, /run/nvidia/mps), one directory per resource
// name holding pipe/ and log/, a .started file written once the daemon runs
// with its limits set, and shm/ shared by all resources. Containers see the
// root at /mps and the shm directory at /dev/shm.
const (
	// DefaultRoot is NVIDIA's chart default for mps.root.
	DefaultRoot = "/run/nvidia/mps"
	// ContainerRoot is where a container sees the MPS root.
	ContainerRoot = "/mps"
	// ShmContainerDir is where a container sees the shm directory.
	ShmContainerDir = "/dev/shm"
)

// PipeDir is the pipe directory of resource's daemon under root.
func PipeDir(root, resource string) string { return filepath.Join(root, resource, "pipe") }

// LogDir is the log directory of resource's daemon under root.
func LogDir(root, resource string) string { return filepath.Join(root, resource, "log") }

// StartedFile is the file a daemon writes once it serves resource.
func StartedFile(root, resource string) string { return filepath.Join(root, resource, ".started") }

// ShmDir is the host directory mounted at /dev/shm in MPS clients.
func ShmDir(root string) string { return filepath.Join(root, "shm") }

const mib = 1 << 20

// MemoryLimit is one MPS replica's pinned memory: the GPU's memory divided
// by its replicas, rounded down to MiB, as NVIDIA's daemon computes its
// default limit (perDevicePinnedDeviceMemoryLimits, "%vM").
func MemoryLimit(total uint64, replicas int) uint64 {
	return total / uint64(max(replicas, 1)) / mib * mib
}

// ThreadPercentage is one replica's share of the SMs: 100/replicas,
// NVIDIA's activeThreadPercentage, and at least 1: past 100 replicas the
// division gives 0, which is no share a client can run with.
func ThreadPercentage(replicas int) int { return max(100/max(replicas, 1), 1) }

// FormatPinnedLimit writes limit (rounded down to MiB) for ordinals
// 0..gpus-1.
func FormatPinnedLimit(gpus int, limit uint64) string {
	parts := make([]string, gpus)
	for i := range parts {
		parts[i] = strconv.Itoa(i) + "=" + strconv.FormatUint(limit/mib, 10) + "M"
	}
	return strings.Join(parts, ",")
}

// ParsePinnedLimit reads a CUDA_MPS_PINNED_DEVICE_MEM_LIMIT value into
// bytes per device key (an ordinal, or whatever the client wrote). Units
// are CUDA's: a number with K, M, G or T (binary multiples, a trailing B
// allowed) or none (bytes).
func ParsePinnedLimit(s string) (map[string]uint64, error) {
	out := map[string]uint64{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		key, val, ok := strings.Cut(part, "=")
		if !ok || key == "" || val == "" {
			return nil, fmt.Errorf("pinned memory limit %q: want <device>=<limit>", part)
		}
		if len(val) > 1 && (val[len(val)-1] == 'B' || val[len(val)-1] == 'b') && (val[len(val)-2] < '0' || val[len(val)-2] > '9') {
			val = val[:len(val)-1] // "512MB"
		}
		mult := uint64(1)
		switch val[len(val)-1] {
		case 'K', 'k':
			mult = 1 << 10
		case 'M', 'm':
			mult = 1 << 20
		case 'G', 'g':
			mult = 1 << 30
		case 'T', 't':
			mult = 1 << 40
		}
		if mult != 1 {
			val = val[:len(val)-1]
		}
		n, err := strconv.ParseUint(val, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("pinned memory limit %q: %w", part, err)
		}
		if n > math.MaxUint64/mult {
			return nil, fmt.Errorf("pinned memory limit %q: more bytes than 64 bits hold", part)
		}
		out[key] = n * mult
	}
	return out, nil
}

// LimitFor is the pinned limit a client's environment value gives on the
// GPU with uuid, when it can be known: the value keyed by that UUID, or the
// one value every key has, not 0 (what gpuslice-plugin writes; which
// ordinal is which GPU inside a container is CUDA's to decide, not ours to
// read). Keys with different values, or a 0 among them, say nothing of
// this GPU: unknown, whatever order the map gives them in.
func LimitFor(limits map[string]uint64, uuid string) (uint64, bool) {
	if v, ok := limits[uuid]; ok {
		return v, true
	}
	var only uint64
	for _, v := range limits {
		if v == 0 || only != 0 && v != only {
			return 0, false
		}
		only = v
	}
	return only, only != 0
}
