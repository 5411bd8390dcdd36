package sim_test

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/gpu"
	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
	"github.com/gpuslice/gpuslice/internal/gpu/sim"
)

// errorsByMessage compares DeviceError.Err by text: a sim file can only
// carry the text.
var errorsByMessage = cmp.Comparer(func(a, b error) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	return a.Error() == b.Error()
})

const (
	uuidA = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"
	uuidB = "GPU-0c3f7a64-11aa-4b2e-9d1c-0123456789ab"
)

func TestSnapshotFiles(t *testing.T) {
	tests := []struct {
		file     string
		want     gpu.Snapshot
		wantXids []gpu.XidCount
	}{
		{
			file: "good.yaml",
			want: gpu.Snapshot{
				DriverVersion: "550.54.15",
				Devices: []gpu.Device{
					{
						Index: 0, UUID: uuidA, Name: "NVIDIA RTX A6000",
						MemoryTotalBytes: 51527024640, MemoryUsedBytes: 4294967296 + 1073741824,
						Utilization: 0.42, TemperatureCelsius: 61, PowerWatts: 180,
						Processes: []gpu.Process{
							{PID: 4242, UsedMemoryBytes: 4294967296, SMUtilization: 0.30, HasSMUtilization: true},
							{PID: 4343, UsedMemoryBytes: 1073741824},
						},
					},
					{
						Index: 1, UUID: uuidB, Name: "NVIDIA RTX A6000",
						MemoryTotalBytes: 51527024640, MemoryUsedBytes: 536870912,
						TemperatureCelsius: 35.5, PowerWatts: 22.25,
					},
				},
			},
			wantXids: []gpu.XidCount{
				{UUID: uuidA, Index: 0, Xid: 13, Count: 1},
				{UUID: uuidA, Index: 0, Xid: 79, Count: 2},
			},
		},
		{
			file: "defaults.yaml",
			want: gpu.Snapshot{
				DriverVersion: "sim",
				Devices:       []gpu.Device{{Index: 0, UUID: "GPU-a", MemoryTotalBytes: 1000}},
			},
			wantXids: []gpu.XidCount{},
		},
		{
			file: "mps.yaml",
			want: gpu.Snapshot{
				DriverVersion: "sim",
				Devices: []gpu.Device{{
					Index: 0, UUID: "GPU-a", MemoryTotalBytes: 1000, MemoryUsedBytes: 566, Utilization: 0.9,
					Processes: []gpu.Process{
						{PID: 10, UsedMemoryBytes: 66, SMUtilization: 0.9, HasSMUtilization: true, MPSServer: true},
						{PID: 11, UsedMemoryBytes: 500},
					},
				}},
			},
			wantXids: []gpu.XidCount{},
		},
		{
			file: "unsupported.yaml",
			want: gpu.Snapshot{
				DriverVersion: "sim",
				Devices: []gpu.Device{{
					Index: 0, UUID: "GPU-a", MemoryTotalBytes: 1000, TemperatureCelsius: 50,
					Missing: gpu.ReadingUtilization | gpu.ReadingPower,
				}},
			},
			wantXids: []gpu.XidCount{},
		},
		{
			file: "mig.yaml",
			want: gpu.Snapshot{
				DriverVersion: "sim",
				Devices: []gpu.Device{{
					Index: 0, UUID: "GPU-a", Name: "NVIDIA A100-SXM4-40GB",
					MemoryTotalBytes: 42949672960, MemoryUsedBytes: 4500,
					Missing:    gpu.ReadingUtilization,
					MIGEnabled: true,
					MIGDevices: []gpu.MIGDevice{
						{Index: 0, UUID: "MIG-4ec5b3ae-5a4c-5c4f-a8a5-9d0f3e8e6b11", Name: "NVIDIA A100-SXM4-40GB MIG 3g.20gb",
							GPUInstanceID: 1, MemoryTotalBytes: 21474836480, MemoryUsedBytes: 3500, HasMemory: true},
						{Index: 1, UUID: "MIG-c6d4f1f9-1ba4-5a9e-8e1f-6b3a7e9d2c22", Name: "NVIDIA A100-SXM4-40GB MIG 2g.10gb",
							GPUInstanceID: 2, MemoryTotalBytes: 10737418240, MemoryUsedBytes: 2000, HasMemory: true},
					},
					Processes: []gpu.Process{
						{PID: 10, UsedMemoryBytes: 3000, InMIG: true, GPUInstanceID: 1},
						{PID: 11, UsedMemoryBytes: 500, InMIG: true, GPUInstanceID: 1},
						{PID: 20, UsedMemoryBytes: 1000, InMIG: true, GPUInstanceID: 2},
					},
				}},
			},
			wantXids: []gpu.XidCount{},
		},
		{
			file:     "no-gpus.yaml",
			want:     gpu.Snapshot{DriverVersion: "sim", Devices: []gpu.Device{}},
			wantXids: []gpu.XidCount{},
		},
		{
			file: "error-field.yaml",
			want: gpu.Snapshot{
				DriverVersion: "sim",
				Devices: []gpu.Device{{
					Index: 0, UUID: "GPU-a", MemoryTotalBytes: 1000, MemoryUsedBytes: 10,
					Processes: []gpu.Process{{PID: 1, UsedMemoryBytes: 10, SMUtilization: 0.5, HasSMUtilization: true}},
				}},
				Failed: []gpu.DeviceError{{Index: 1, UUID: "GPU-b", Err: errors.New("nvml: GetMemoryInfo: ERROR_GPU_IS_LOST")}},
			},
			// A failing GPU still reports its Xid events, as NVML's event
			// set does for a GPU whose other calls fail.
			wantXids: []gpu.XidCount{{UUID: "GPU-b", Index: 1, Xid: 79, Count: 1}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			b := sim.New(filepath.Join("testdata", tc.file))
			got, err := b.Snapshot(context.Background())
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			if diff := cmp.Diff(tc.want, got, errorsByMessage); diff != "" {
				t.Errorf("Snapshot (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.wantXids, b.Xids()); diff != "" {
				t.Errorf("Xids (-want +got):\n%s", diff)
			}
		})
	}
}

func TestSnapshotInvalidFiles(t *testing.T) {
	tests := []struct {
		file string
		// want are substrings of the error: where and what.
		want []string
	}{
		{"empty-uuid.yaml", []string{"line 4", "gpus[1].uuid", "must not be empty"}},
		{"duplicate-uuid.yaml", []string{"line 6", "gpus[2].uuid", `"GPU-a" is also the uuid of gpus[0]`}},
		{"utilization-range.yaml", []string{"line 4", "gpus[0].utilization", "42 is outside 0..1"}},
		{"sm-range.yaml", []string{"line 9", "gpus[0].processes[1].smUtilization", "-0.1 is outside 0..1"}},
		{"duplicate-pid.yaml", []string{"line 7", "gpus[0].processes[1].pid", "7 is also the pid of processes[0]"}},
		{"bad-pid.yaml", []string{"line 5", "gpus[0].processes[0].pid", "must be a positive number"}},
		{"unknown-field.yaml", []string{"line 4", "field memoryTotal not found"}},
		{"wrong-type.yaml", []string{"line 3", "lots"}},
		{"malformed.yaml", []string{"line 3", "unexpected end of stream"}},
		{"empty.yaml", []string{"file is empty"}},
		{"unsupported-name.yaml", []string{"line 4", "gpus[0].unsupported", `"fan" is not a reading`}},
		{"mig-unknown-instance.yaml", []string{"line 9", "gpus[0].processes[0].gpuInstance", "no mig device of this GPU has gpuInstance 2 and computeInstance 0"}},
		{"mig-no-mig.yaml", []string{"line 7", "gpus[0].processes[0].gpuInstance", "the GPU has no mig devices"}},
		{"mig-bad-uuid.yaml", []string{"line 6", "gpus[0].mig[1].uuid", `"GPU-c6d4f1f9-1ba4-5a9e-8e1f-6b3a7e9d2c22" is not a MIG device UUID`}},
		{"mig-duplicate-instance.yaml", []string{"line 6", "gpus[0].mig[1].gpuInstance", "another mig device has gpuInstance 1 and computeInstance 0"}},
	}
	for _, tc := range tests {
		t.Run(tc.file, func(t *testing.T) {
			path := filepath.Join("testdata", tc.file)
			b := sim.New(path)
			_, err := b.Snapshot(context.Background())
			if err == nil {
				t.Fatal("Snapshot: no error")
			}
			if !errors.Is(err, gpu.ErrUnavailable) {
				t.Errorf("error %q does not wrap gpu.ErrUnavailable", err)
			}
			for _, w := range append([]string{path}, tc.want...) {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not contain %q", err, w)
				}
			}
			if xids := b.Xids(); len(xids) != 0 {
				t.Errorf("Xids of an invalid file: %v", xids)
			}
		})
	}
}

func TestMissingFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.yaml")
	b := sim.New(path)
	_, err := b.Snapshot(context.Background())
	if !errors.Is(err, gpu.ErrUnavailable) || !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("Snapshot error %v: want gpu.ErrUnavailable and fs.ErrNotExist", err)
	}
	if !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name %s", err, path)
	}

	// The file may appear after the backend was made.
	gputest.WriteSimFile(t, path, gputest.GPU("GPU-late", 1000))
	s, err := b.Snapshot(context.Background())
	if err != nil {
		t.Fatalf("Snapshot after the file was written: %v", err)
	}
	if len(s.Devices) != 1 || s.Devices[0].UUID != "GPU-late" {
		t.Errorf("Snapshot after the file was written: %+v", s)
	}
}

// TestRereadEverySnapshot changes the scenario between readings, as an
// end-to-end test does while the exporter runs.
func TestRereadEverySnapshot(t *testing.T) {
	steps := []struct {
		name string
		gpus []gputest.GPUSpec
	}{
		{"one process", []gputest.GPUSpec{
			gputest.GPU(gputest.UUID(0), 48<<30, gputest.Proc(100, 4<<30, 0.3)),
		}},
		{"second process and GPU", []gputest.GPUSpec{
			gputest.GPU(gputest.UUID(0), 48<<30, gputest.Proc(100, 6<<30, 0.5), gputest.ProcNoSample(101, 1<<30)),
			gputest.GPU(gputest.UUID(1), 48<<30).WithUtilization(0.9).WithMemoryUsed(512 << 20),
		}},
		{"first GPU fails", []gputest.GPUSpec{
			gputest.GPU(gputest.UUID(0), 48<<30).WithError("GPU is lost"),
			gputest.GPU(gputest.UUID(1), 48<<30, gputest.Proc(200, 1<<30, 0)),
		}},
		{"all gone", nil},
	}
	b, path := gputest.NewSim(t, steps[0].gpus...)
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			gputest.WriteSimFile(t, path, step.gpus...)
			got, err := b.Snapshot(context.Background())
			if err != nil {
				t.Fatalf("Snapshot: %v", err)
			}
			if diff := cmp.Diff(gputest.Snapshot(step.gpus...), got, errorsByMessage); diff != "" {
				t.Errorf("Snapshot (-want +got):\n%s", diff)
			}
		})
	}
}

// TestXidCountsNeverDecrease rewrites the Xid list of a GPU and checks the
// counter is the largest number of entries ever listed.
func TestXidCountsNeverDecrease(t *testing.T) {
	u0, u1 := gputest.UUID(0), gputest.UUID(1)
	steps := []struct {
		name string
		gpus []gputest.GPUSpec
		want []gpu.XidCount
	}{
		{"none yet", []gputest.GPUSpec{gputest.GPU(u0, 1000), gputest.GPU(u1, 1000)}, []gpu.XidCount{}},
		{"two 79 and a 13", []gputest.GPUSpec{gputest.GPU(u0, 1000), gputest.GPU(u1, 1000).WithXids(79, 13, 79)}, []gpu.XidCount{
			{UUID: u1, Index: 1, Xid: 13, Count: 1},
			{UUID: u1, Index: 1, Xid: 79, Count: 2},
		}},
		{"entries removed", []gputest.GPUSpec{gputest.GPU(u0, 1000).WithXids(48), gputest.GPU(u1, 1000).WithXids(79)}, []gpu.XidCount{
			{UUID: u0, Index: 0, Xid: 48, Count: 1},
			{UUID: u1, Index: 1, Xid: 13, Count: 1},
			{UUID: u1, Index: 1, Xid: 79, Count: 2},
		}},
		{"three 79", []gputest.GPUSpec{gputest.GPU(u0, 1000), gputest.GPU(u1, 1000).WithXids(79, 79, 79)}, []gpu.XidCount{
			{UUID: u0, Index: 0, Xid: 48, Count: 1},
			{UUID: u1, Index: 1, Xid: 13, Count: 1},
			{UUID: u1, Index: 1, Xid: 79, Count: 3},
		}},
		{"GPU removed, file broken next", nil, []gpu.XidCount{
			{UUID: u0, Index: 0, Xid: 48, Count: 1},
			{UUID: u1, Index: 1, Xid: 13, Count: 1},
			{UUID: u1, Index: 1, Xid: 79, Count: 3},
		}},
	}
	b, path := gputest.NewSim(t)
	for _, step := range steps {
		t.Run(step.name, func(t *testing.T) {
			gputest.WriteSimFile(t, path, step.gpus...)
			// Xids reads the file by itself: no Snapshot in between.
			if diff := cmp.Diff(step.want, b.Xids()); diff != "" {
				t.Errorf("Xids (-want +got):\n%s", diff)
			}
		})
	}
	if err := os.WriteFile(path, []byte("gpus: {"), 0o644); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(steps[len(steps)-1].want, b.Xids()); diff != "" {
		t.Errorf("Xids with a broken file keep the last counts (-want +got):\n%s", diff)
	}
}

// TestReadWhileRewritten reads the file while the test replaces it, as
// end-to-end tests do; with gputest's atomic replace no reading may fail or
// see half a file.
func TestReadWhileRewritten(t *testing.T) {
	small := gputest.Node(1, 1)
	big := gputest.Node(8, 64)
	b, path := gputest.NewSim(t, small...)
	stop := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		for readings := 1; ; readings++ {
			s, err := b.Snapshot(context.Background())
			if err == nil && len(s.Devices) != 1 && len(s.Devices) != 8 {
				err = fmt.Errorf("saw %d GPUs: a half-written file", len(s.Devices))
			}
			if err != nil {
				result <- fmt.Errorf("reading %d: %w", readings, err)
				return
			}
			select {
			case <-stop:
				result <- nil
				return
			default:
			}
		}
	}()
	for i := range 50 {
		if i%2 == 0 {
			gputest.WriteSimFile(t, path, big...)
		} else {
			gputest.WriteSimFile(t, path, small...)
		}
	}
	close(stop)
	if err := <-result; err != nil {
		t.Fatalf("Snapshot while the file is rewritten: %v", err)
	}
}

func TestCanceledContext(t *testing.T) {
	b, _ := gputest.NewSim(t, gputest.GPU("GPU-a", 1))
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Snapshot(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Snapshot with a canceled context: %v, want context.Canceled", err)
	}
}

// BenchmarkSnapshot8x64 is the cost of a reading of an unchanged file.
func BenchmarkSnapshot8x64(b *testing.B) {
	be, _ := gputest.NewSim(b, gputest.Node(8, 64)...)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		s, err := be.Snapshot(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if len(s.Devices) != 8 || len(s.Devices[7].Processes) != 64 {
			b.Fatalf("got %d GPUs", len(s.Devices))
		}
	}
}

// BenchmarkParse8x64 is the cost of a reading after the file changed.
func BenchmarkParse8x64(b *testing.B) {
	data := gputest.SimYAML(gputest.Node(8, 64)...)
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := sim.Parse(data); err != nil {
			b.Fatal(err)
		}
	}
}

// TestComputeProcesses: one GPU's processes as Snapshot reads them, the
// MPS server marked; a GPU the file lacks is an error naming it and the
// file.
func TestComputeProcesses(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpus.yaml")
	server := gpu.Process{PID: 900, UsedMemoryBytes: 66 << 20, MPSServer: true}
	gputest.WriteSimFile(t, path, gputest.GPU("GPU-a", 1<<30), gputest.GPU("GPU-b", 1<<30, gputest.Proc(300, 1<<20, 0.5), server))
	b := sim.New(path)
	ctx := context.Background()
	snap, err := b.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := b.ComputeProcesses(ctx, "GPU-b")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(snap.Devices[1].Processes, got); diff != "" {
		t.Errorf("ComputeProcesses against Snapshot's (-snapshot +got):\n%s", diff)
	}
	if len(got) != 2 || !got[1].MPSServer {
		t.Errorf("ComputeProcesses: %+v, want 2 processes, the server marked", got)
	}
	if _, err := b.ComputeProcesses(ctx, "GPU-c"); err == nil || !strings.Contains(err.Error(), "GPU-c") || !strings.Contains(err.Error(), path) {
		t.Errorf("a GPU the file lacks: %v, want an error naming it and the file", err)
	}
}
