package nvmlbackend_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"

	"github.com/gpuslice/gpuslice/internal/gpu"
	nvmlbackend "github.com/gpuslice/gpuslice/internal/gpu/nvml"
)

// guarded is a value a test changes while the backend reads it: an NVML
// return, or the fake time of the re-initialization backoff.
type guarded[T any] struct {
	mu sync.Mutex
	v  T
}

func (g *guarded[T]) get() T {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.v
}

func (g *guarded[T]) set(v T) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.v = v
}

type switchable = guarded[nvml.Return]

// clock is the fake time of the backoff; the backend reads it with now.
type clock struct{ guarded[time.Time] }

func newClock() *clock {
	c := &clock{}
	c.set(time.Unix(1_700_000_000, 0))
	return c
}

func (c *clock) now() time.Time          { return c.get() }
func (c *clock) advance(d time.Duration) { c.set(c.get().Add(d)) }

// TestRecoversWhenNVMLComesBack breaks a working node the ways real nodes
// break, then checks that the backend initializes NVML again with backoff,
// makes no other call while NVML is down, and reads every GPU (with Xid
// events registered again) once NVML answers.
func TestRecoversWhenNVMLComesBack(t *testing.T) {
	tests := []struct {
		name string
		// breakIt makes readings fail with ret while broken.get() != SUCCESS.
		breakIt func(n *node, broken *switchable)
		// wholeFails: the reading fails as a whole (the GPUs cannot be
		// counted), rather than listing every GPU as failed.
		wholeFails bool
		ret        nvml.Return
	}{
		{"systemd daemon-reload: ERROR_UNKNOWN", breakCount, true, nvml.ERROR_UNKNOWN},
		{"driver upgraded under the process", breakCount, true, nvml.ERROR_LIB_RM_VERSION_MISMATCH},
		{"driver unloaded", breakCount, true, nvml.ERROR_DRIVER_NOT_LOADED},
		{"every GPU fell off the bus", func(n *node, broken *switchable) {
			for _, g := range n.gpus {
				g.GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) {
					if r := broken.get(); r != nvml.SUCCESS {
						return nvml.Memory{}, r
					}
					return g.MemoryInfo, nvml.SUCCESS
				}
			}
		}, false, nvml.ERROR_GPU_IS_LOST},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t)
			clk := newClock()
			broken := &switchable{v: nvml.SUCCESS}
			initRet := &switchable{v: nvml.SUCCESS}
			n.InitFunc = initRet.get
			tc.breakIt(n, broken)
			b, err := nvmlbackend.New(n, nvmlbackend.Options{
				Logger: slog.New(slog.NewTextHandler(t.Output(), nil)), XidPollTimeout: 5 * time.Millisecond,
				RetryInit: true, InitBackoff: 10 * time.Second, MaxInitBackoff: 40 * time.Second, Now: clk.now,
			})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { b.Close() })
			if s := snapshot(t, b); len(s.Devices) != 8 {
				t.Fatalf("healthy node: %d GPUs", len(s.Devices))
			}

			broken.set(tc.ret)
			initRet.set(tc.ret) // NVML cannot be initialized either, yet
			s, err := b.Snapshot(context.Background())
			if tc.wholeFails {
				if !errors.Is(err, gpu.ErrUnavailable) || !errors.Is(err, tc.ret) {
					t.Fatalf("broken reading: %v, want gpu.ErrUnavailable wrapping %v", err, tc.ret)
				}
			} else if err != nil || len(s.Devices) != 0 || len(s.Failed) != 8 || !errors.Is(&s.Failed[0], tc.ret) {
				t.Fatalf("broken reading: %d GPUs, failed %v, err %v; want all 8 failed with %v", len(s.Devices), s.Failed, err, tc.ret)
			}
			if c := len(n.InitCalls()); c != 1 {
				t.Fatalf("Init called %d times before any re-initialization", c)
			}

			// Each step: advance the clock, read, and expect this many
			// Init calls in all. Backoff 10 s, then 20 s, then 40 s.
			steps := []struct {
				after     time.Duration
				wantInits int
			}{
				{0, 2},                // the next reading tries at once
				{5 * time.Second, 2},  // within the 10 s backoff
				{5 * time.Second, 3},  // 10 s after the first try
				{19 * time.Second, 3}, // within 20 s
				{1 * time.Second, 4},
			}
			for i, st := range steps {
				clk.advance(st.after)
				counts := len(n.DeviceGetCountCalls())
				_, err := b.Snapshot(context.Background())
				if !errors.Is(err, gpu.ErrUnavailable) || !errors.Is(err, tc.ret) {
					t.Fatalf("step %d: %v, want gpu.ErrUnavailable naming %v", i, err, tc.ret)
				}
				if c := len(n.InitCalls()); c != st.wantInits {
					t.Fatalf("step %d (+%s): Init called %d times in all, want %d", i, st.after, c, st.wantInits)
				}
				if c := len(n.DeviceGetCountCalls()); c != counts {
					t.Fatalf("step %d: %d NVML calls while NVML is not initialized", i, c-counts)
				}
			}
			if c := len(n.ShutdownCalls()); c != 1 {
				t.Errorf("Shutdown called %d times: want once, after the Init that succeeded, never after a failed one", c)
			}

			// NVML answers again.
			broken.set(nvml.SUCCESS)
			initRet.set(nvml.SUCCESS)
			clk.advance(40 * time.Second)
			if s := snapshot(t, b); len(s.Devices) != 8 || len(s.Failed) != 0 {
				t.Fatalf("after NVML came back: %d GPUs, failed %v", len(s.Devices), s.Failed)
			}
			if c := len(n.EventSetCreateCalls()); c != 2 {
				t.Errorf("event set created %d times, want again after re-initializing", c)
			}
			n.events <- nvml.EventData{Device: n.Devices[2], EventType: nvml.EventTypeXidCriticalError, EventData: 79}
			waitFor(t, func() bool { return len(b.Xids()) == 1 }, "the Xid event after re-initializing")

			// A working NVML is not initialized again, and the backoff
			// starts over: the next break is tried at once.
			clk.advance(time.Hour)
			snapshot(t, b)
			if c := len(n.InitCalls()); c != 5 {
				t.Errorf("Init called %d times in all with NVML working, want 5", c)
			}
			broken.set(tc.ret)
			b.Snapshot(context.Background())
			broken.set(nvml.SUCCESS)
			if s := snapshot(t, b); len(s.Devices) != 8 || len(n.InitCalls()) != 6 {
				t.Errorf("second break: %d GPUs, %d Init calls; want 8 and 6", len(s.Devices), len(n.InitCalls()))
			}
		})
	}
}

func breakCount(n *node, broken *switchable) {
	n.DeviceGetCountFunc = func() (int, nvml.Return) {
		if r := broken.get(); r != nvml.SUCCESS {
			return 0, r
		}
		return len(n.Devices), nvml.SUCCESS
	}
}

// waitFor polls cond until it holds or a deadline passes.
func waitFor(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

// TestOneLostGPUKeepsNVML: one GPU off the bus fails only itself; NVML is
// not initialized again while other GPUs answer.
func TestOneLostGPUKeepsNVML(t *testing.T) {
	n := newNode(t)
	n.gpus[3].GetMemoryInfoFunc = func() (nvml.Memory, nvml.Return) { return nvml.Memory{}, nvml.ERROR_GPU_IS_LOST }
	b := n.open(t)
	for range 3 {
		if s := snapshot(t, b); len(s.Devices) != 7 || len(s.Failed) != 1 {
			t.Fatalf("%d GPUs, failed %v; want 7 and GPU 3", len(s.Devices), s.Failed)
		}
	}
	if i, s := len(n.InitCalls()), len(n.ShutdownCalls()); i != 1 || s != 0 {
		t.Errorf("Init %d, Shutdown %d calls; want 1 and 0", i, s)
	}
}

// TestRetryInitAtStart: an exporter started where NVML cannot be loaded
// keeps running, says what to fix, calls nothing but Init (any other call
// would kill the process) and reads the GPUs once Init succeeds.
func TestRetryInitAtStart(t *testing.T) {
	fixes := map[nvml.Return][]string{
		nvml.ERROR_LIBRARY_NOT_FOUND:       {"libnvidia-ml.so.1", "runtimeClassName: nvidia", "privileged", "NVIDIA_VISIBLE_DEVICES=all"},
		nvml.ERROR_DRIVER_NOT_LOADED:       {"kernel driver", "nvidia-smi", "runtimeClassName: nvidia"},
		nvml.ERROR_NO_PERMISSION:           {"/dev/nvidia", "privileged"},
		nvml.ERROR_LIB_RM_VERSION_MISMATCH: {"does not match", "restart the pod", "reboot"},
		nvml.ERROR_UNKNOWN:                 {"daemon-reload", "restarting the container"},
	}
	for ret, want := range fixes {
		t.Run(ret.Error(), func(t *testing.T) {
			n := newNode(t)
			initRet := &switchable{v: ret}
			n.InitFunc = initRet.get
			clk := newClock()
			var logs syncBuffer
			b, err := nvmlbackend.New(n, nvmlbackend.Options{
				Logger: slog.New(slog.NewTextHandler(&logs, nil)), XidPollTimeout: 5 * time.Millisecond,
				RetryInit: true, Now: clk.now,
			})
			if err != nil {
				t.Fatalf("New with RetryInit: %v", err)
			}
			t.Cleanup(func() { b.Close() })
			_, err = b.Snapshot(context.Background())
			if !errors.Is(err, gpu.ErrUnavailable) || !errors.Is(err, ret) {
				t.Fatalf("Snapshot: %v, want gpu.ErrUnavailable wrapping %v", err, ret)
			}
			for _, w := range want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not say %q", err, w)
				}
				if logs.count("level=ERROR", w) != 1 {
					t.Errorf("start-up log does not say %q once:\n%s", w, logs.String())
				}
			}
			if c := len(n.DeviceGetCountCalls()) + len(n.SystemGetDriverVersionCalls()) + len(n.EventSetCreateCalls()); c != 0 {
				t.Fatalf("%d NVML calls after a failed Init", c)
			}
			initRet.set(nvml.SUCCESS)
			clk.advance(nvmlbackend.DefaultInitBackoff)
			if s := snapshot(t, b); len(s.Devices) != 8 || s.DriverVersion != "550.54.15" {
				t.Errorf("after Init succeeded: %d GPUs, driver %q", len(s.Devices), s.DriverVersion)
			}
		})
	}
}

// TestCloseWithoutNVML: a backend that never initialized NVML does not
// shut it down (go-nvml's Shutdown calls into a library that is not loaded).
func TestCloseWithoutNVML(t *testing.T) {
	lib := &mock.Interface{InitFunc: func() nvml.Return { return nvml.ERROR_LIBRARY_NOT_FOUND }}
	b, err := nvmlbackend.New(lib, nvmlbackend.Options{RetryInit: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if p := recover(); p != nil {
			t.Fatalf("Close called NVML: %v", p)
		}
	}()
	if err := b.Close(); err != nil {
		t.Errorf("Close: %v", err)
	}
}
