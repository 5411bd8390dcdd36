package plugin

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
)

// kubeletCheckpointName is the kubelet's device-manager checkpoint, a file
// in the directory of its registration socket (kubelet v1.37.1
// devicemanager: kubeletDeviceManagerCheckpoint, checkpointdir).
const kubeletCheckpointName = "kubelet_internal_checkpoint"

// checkpointEntry is one container's devices of one resource in the
// kubelet's checkpoint.
type checkpointEntry struct {
	PodUID, Container, Resource string
	IDs                         []string
}

// checkpointKey names one device of one checkpoint entry.
type checkpointKey struct {
	podUID, container string
	held
}

// The kubelet's PodResources List leaves out the devices of ordinary
// (non-restartable) init containers (kubelet v1.37.1 podresources
// server_v1.go), but its device manager keeps them allocated until the pod
// ends, and records them in its checkpoint, which it writes after every
// Allocate and every device list it receives (devicemanager manager.go,
// writeCheckpoint). An ID it holds that the plugin stops advertising
// fails the pod's admission again after a kubelet restart ("previously
// allocated devices are no longer healthy"). So the IDs in the checkpoint
// count as in use too.
//
// The checkpoint also keeps the entries of ended pods until the kubelet's
// next allocation of any device on the node. An entry whose ID a
// PodResources answer, asked after the checkpoint was read, listed under the
// same resource is vouched for: the kubelet gives an ID to one pod at a time,
// so PodResources then tells when it is released, and the entry counts no
// more. Only the entries PodResources never lists (those of init containers,
// of pods too short for one read, of pods ended while the plugin was not
// running) stand on the checkpoint alone, and the kubelet prunes them only
// at its next allocation, which on a quiet node may never come. Kept for
// as long, a 5-second job's ID would stay advertised beyond a lowered
// count, the node's allocatable would stay above what the tuner expects,
// and its verification would fail and hold the node for an hour. So such
// an entry counts for Options.CheckpointHold (2 minutes) after the plugin
// first read it: an init container's ID is kept through a shrink in its
// first minutes, which covers the common init container that fetches a
// model and ends, not one that holds a GPU longer.

// kubeletCheckpoint is the part of the checkpoint file the plugin reads:
// devicemanager/checkpoint.Data, JSON of {"Data": {"PodDeviceEntries":
// [...], "RegisteredDevices": {...}}, "Checksum": N}, an entry's DeviceIDs
// keyed by NUMA node (-1 for none). The checksum is not verified: the
// kubelet writes the file by renaming a complete one into place, and the
// sum is a hash of a Go-specific dump of its structs.
type kubeletCheckpoint struct {
	Data *struct {
		PodDeviceEntries []struct {
			PodUID        string
			ContainerName string
			ResourceName  string
			DeviceIDs     map[int64][]string
		}
	}
}

// readCheckpoint reads the kubelet's checkpoint at path.
func readCheckpoint(path string) ([]checkpointEntry, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	entries, err := parseCheckpoint(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return entries, nil
}

// parseCheckpoint returns the entries of the resources under nvidia.com/
// of a kubelet checkpoint file.
func parseCheckpoint(data []byte) ([]checkpointEntry, error) {
	var cp kubeletCheckpoint
	if err := json.Unmarshal(data, &cp); err != nil {
		return nil, fmt.Errorf("not a kubelet device-manager checkpoint: %w", err)
	}
	if cp.Data == nil {
		return nil, fmt.Errorf("not a kubelet device-manager checkpoint: no Data")
	}
	var out []checkpointEntry
	for _, e := range cp.Data.PodDeviceEntries {
		if !strings.HasPrefix(e.ResourceName, "nvidia.com/") {
			continue
		}
		ce := checkpointEntry{PodUID: e.PodUID, Container: e.ContainerName, Resource: e.ResourceName}
		for _, ids := range e.DeviceIDs {
			ce.IDs = append(ce.IDs, ids...)
		}
		out = append(out, ce)
	}
	return out, nil
}
