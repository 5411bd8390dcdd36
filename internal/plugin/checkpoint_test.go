package plugin

import (
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/podresources"
)

// testdata/kubelet_internal_checkpoint was written by kubelet v1.37.1's own
// code (devicemanager/checkpoint: New(entries, registered).MarshalCheckpoint())
// for three entries: an init container's GPU, another plugin's device, and
// a container with GPUs on two NUMA nodes.
func TestParseCheckpoint(t *testing.T) {
	real, err := os.ReadFile("testdata/kubelet_internal_checkpoint")
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		data    string
		want    []checkpointEntry
		wantErr string
	}{
		{"written by the kubelet", string(real), []checkpointEntry{
			{PodUID: "6b1c3f1e-0d7e-4c59-9a2a-1f1d7c1b2a01", Container: "warmup", Resource: gpuRes, IDs: []string{rid(uuid0, 3)}},
			{PodUID: "0f0e8d7c-6b5a-4938-8271-605f4e3d2c1b", Container: "train", Resource: gpuRes, IDs: []string{rid(uuid0, 1), rid(uuid1, 0)}},
		}, ""},
		{"no entries", `{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":0}`, nil, ""},
		{"not JSON", "\x00\x01", nil, "not a kubelet device-manager checkpoint"},
		{"no Data", `{"Checksum":1}`, nil, "no Data"},
		// The format before kubelet v1.20, which v1.37.1 no longer reads.
		{"device IDs as a list", `{"Data":{"PodDeviceEntries":[{"PodUID":"u","ContainerName":"c","ResourceName":"nvidia.com/gpu","DeviceIDs":["a"]}]}}`,
			nil, "not a kubelet device-manager checkpoint"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseCheckpoint([]byte(tc.data))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range got {
				slices.Sort(got[i].IDs)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("entries (-want +got):\n%s", diff)
			}
		})
	}
}

// writeKubeletCheckpoint writes a checkpoint in the kubelet's format into
// dir, renaming a complete file into place as the kubelet does.
func writeKubeletCheckpoint(t *testing.T, dir string, entries ...checkpointEntry) {
	t.Helper()
	type entry struct {
		PodUID, ContainerName, ResourceName string
		DeviceIDs                           map[int64][]string
		AllocResp                           []byte
	}
	var cp struct {
		Data struct {
			PodDeviceEntries  []entry
			RegisteredDevices map[string][]string
		}
		Checksum uint64
	}
	for _, e := range entries {
		cp.Data.PodDeviceEntries = append(cp.Data.PodDeviceEntries, entry{
			PodUID: e.PodUID, ContainerName: e.Container, ResourceName: e.Resource, DeviceIDs: map[int64][]string{-1: e.IDs},
		})
	}
	writeFileAtomic(t, filepath.Join(dir, kubeletCheckpointName), must(json.Marshal(cp)))
}

func writeFileAtomic(t *testing.T, path string, data []byte) {
	t.Helper()
	if err := os.WriteFile(path+".tmp", data, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".tmp", path); err != nil {
		t.Fatal(err)
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

// The kubelet's PodResources API leaves out an ordinary init container's
// devices, which the kubelet keeps allocated until the pod ends. Its ID
// must stay advertised after a shrink until the kubelet's checkpoint drops
// it: dropped, the pod fails admission at the next kubelet restart.
func TestInitContainerIDKeptThroughShrink(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs(), pods: true})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	// The pod's app container has no GPU: PodResources lists it without one.
	h.pods.SetPods([]podresources.Allocation{{Namespace: "ml", Pod: "convert", Container: "main"}})
	writeKubeletCheckpoint(t, h.kubelet.dir,
		checkpointEntry{PodUID: "uid-convert", Container: "warmup", Resource: gpuRes, IDs: []string{rid(uuid0, 3)}})
	h.writeConfig(config(2))
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2)))
	// One more read, after the IDs dropped have retired.
	if got := readHeld(t, h); !slices.Contains(got, rid(uuid0, 3)) {
		t.Fatalf("the init container's ID is no longer advertised: %v", got)
	}

	// The pod ends; the kubelet's next allocation prunes its entry.
	h.pods.SetPods(nil)
	writeKubeletCheckpoint(t, h.kubelet.dir)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
}

// An entry no PodResources answer vouches for counts for CheckpointHold
// only: the kubelet prunes it at its next allocation, which on a quiet node
// may never come, and kept for ever a short job's ID would hold the node's
// allocatable above a lowered count.
func TestUnvouchedCheckpointEntryHeldForALimitedTime(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs(), pods: true})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	writeKubeletCheckpoint(t, h.kubelet.dir,
		checkpointEntry{PodUID: "uid-short", Container: "main", Resource: gpuRes, IDs: []string{rid(uuid0, 3)}})
	h.writeConfig(config(2))
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2)))
	h.clock.Advance(h.plugin.o.CheckpointHold)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
}

// An entry PodResources has listed is vouched for: when its pod ends,
// PodResources' word frees the ID though the kubelet's checkpoint keeps the
// entry until its next allocation.
func TestCheckpointEntryOfEndedPodFreed(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs(), pods: true})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	h.pods.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: gpuRes, DeviceIDs: []string{rid(uuid0, 3)}},
	})
	writeKubeletCheckpoint(t, h.kubelet.dir,
		checkpointEntry{PodUID: "uid-train", Container: "main", Resource: gpuRes, IDs: []string{rid(uuid0, 3)}})
	h.writeConfig(config(2))
	// Applying the config read both, the checkpoint first: vouched for.
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2)))

	h.pods.SetPods(nil) // the checkpoint still lists it
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
}

// A checkpoint that cannot be read is logged once and ignored: the IDs in
// use are PodResources' alone, as without one.
func TestMalformedCheckpointIgnored(t *testing.T) {
	rec := &records{}
	h := start(t, setup{config: config(4), gpus: twoSpecs(), pods: true, logs: rec})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	writeFileAtomic(t, filepath.Join(h.kubelet.dir, kubeletCheckpointName), []byte("{not json"))
	h.pods.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: gpuRes, DeviceIDs: []string{rid(uuid0, 3)}},
	})
	h.kubelet.waitFor("the warning", func() bool {
		return len(rec.messages(slog.LevelWarn, "cannot read the kubelet's device-manager checkpoint")) > 0
	})
	h.writeConfig(config(2))
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2)))
	h.pods.SetPods(nil)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
	if n := len(rec.messages(slog.LevelInfo, "cannot read the kubelet's device-manager checkpoint")); n != 2 {
		// Once missing (Info), once malformed (Warn).
		t.Errorf("logged %d times, want 2: %q", n, rec.messages(slog.LevelInfo, "cannot read the kubelet's"))
	}

	// Readable again: its entries count.
	writeKubeletCheckpoint(t, h.kubelet.dir,
		checkpointEntry{PodUID: "uid-convert", Container: "warmup", Resource: gpuRes, IDs: []string{rid(uuid1, 2)}})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), rid(uuid1, 0), rid(uuid1, 2)))
}

// Without a PodResources API the kubelet's checkpoint tells the IDs in use.
func TestCheckpointWithoutPodResources(t *testing.T) {
	h := start(t, setup{config: config(4), gpus: twoSpecs()})
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 4), ids(uuid1, 0, 4)))
	writeKubeletCheckpoint(t, h.kubelet.dir,
		checkpointEntry{PodUID: "uid-train", Container: "main", Resource: gpuRes, IDs: []string{rid(uuid0, 3)}})
	h.writeConfig(config(2)) // applying it reads the checkpoint
	h.kubelet.waitList(gpuRes, want(rid(uuid0, 0), rid(uuid0, 3), ids(uuid1, 0, 2)))
	writeKubeletCheckpoint(t, h.kubelet.dir)
	h.kubelet.waitList(gpuRes, want(ids(uuid0, 0, 2), ids(uuid1, 0, 2)))
}

// An ID this process gave out just before the kubelet restarted is kept
// through the restart grace, though the new kubelet's first answers lack it
// and the record of the allocation is pruned.
func TestRecentAllocationKeptThroughRestartGrace(t *testing.T) {
	p, err := New(Options{Backend: gputest.NewFake(), Source: &FileSource{Path: "unused"}, Logger: testLogger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	h := held{ID: rid(uuid0, 3), Resource: gpuRes}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.setHeldLocked(heldAnswer{started: t0.Add(-5 * time.Second)}) // before the allocation
	p.recent[h] = t0
	p.kubeletRestarted = t0.Add(500 * time.Millisecond)
	p.setHeldLocked(heldAnswer{started: t0.Add(2 * time.Second)}) // the new kubelet, no pods yet
	_, recent := p.recent[h]
	if !slices.Contains(p.held, h) && !recent {
		t.Fatalf("the ID is neither held nor recent within the grace: held %v", p.held)
	}
	p.setHeldLocked(heldAnswer{started: t0.Add(p.o.RestartGrace + time.Second)})
	if slices.Contains(p.held, h) {
		t.Errorf("the ID is still held past the grace: %v", p.held)
	}
}
