package podresources_test

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/gpuslice/gpuslice/internal/podresources"
	"github.com/gpuslice/gpuslice/internal/podresources/podresourcestest"
)

const (
	gpuA = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"
	gpuB = "GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5"
)

func newClient(t *testing.T, path string, opts ...podresources.Option) *podresources.Client {
	t.Helper()
	c, err := podresources.NewClient(path, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// within fails the test if f does not return before the deadline; it turns
// a hang into a failure instead of a stuck test binary.
func within[T any](t *testing.T, d time.Duration, f func() T) T {
	t.Helper()
	ch := make(chan T, 1)
	go func() { ch <- f() }()
	select {
	case v := <-ch:
		return v
	case <-time.After(d):
		t.Fatalf("call did not return within %v", d)
		panic("unreachable")
	}
}

func TestListAndAllocatable(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0"}},
		{Namespace: "ml", Pod: "train", Container: "sidecar"}, // no devices
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "example.com/nic", DeviceIDs: []string{"sriov-3"}},
		// The kubelet splits one resource into groups (per NUMA node); the
		// client merges them.
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuB + "::2"}},
		{Namespace: "web", Pod: "infer", Container: "srv", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpuB + "::1"}},
		{Namespace: "idle", Pod: "nothing", Container: "c"},
	})
	srv.SetAllocatable([]podresources.Allocatable{
		{Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0", gpuA + "::1", gpuB + "::0"}},
		{Resource: "example.com/nic", DeviceIDs: []string{"sriov-3"}},
	})
	c := newClient(t, path)
	ctx := context.Background()

	got, err := c.List(ctx)
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	want := []podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0", gpuB + "::2"}},
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "example.com/nic", DeviceIDs: []string{"sriov-3"}},
		{Namespace: "web", Pod: "infer", Container: "srv", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpuB + "::1"}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("List() mismatch (-want +got):\n%s", diff)
	}

	alloc, err := c.Allocatable(ctx)
	if err != nil {
		t.Fatalf("Allocatable: %v", err)
	}
	wantAlloc := []podresources.Allocatable{
		{Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0", gpuA + "::1", gpuB + "::0"}},
		{Resource: "example.com/nic", DeviceIDs: []string{"sriov-3"}},
	}
	if diff := cmp.Diff(wantAlloc, alloc); diff != "" {
		t.Errorf("Allocatable() mismatch (-want +got):\n%s", diff)
	}

	// State changes show on the next call: nothing is cached.
	srv.SetPods(nil)
	got, err = c.List(ctx)
	if err != nil || len(got) != 0 {
		t.Errorf("List() after SetPods(nil) = %v, %v; want none", got, err)
	}
}

// DRA claims come back one Allocation per container and driver, with the
// kubelet's driver/pool/device names; a claim shared by two pods shows in
// both, and a container may hold device-plugin GPUs and claims at once.
func TestListDynamicResources(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	gpu0 := podresources.ClaimDevice{ClaimNamespace: "ml", ClaimName: "shared-gpu", Driver: "gpu.nvidia.com", Pool: "node-a", Device: "gpu-0"}
	gpu1 := podresources.ClaimDevice{ClaimNamespace: "ml", ClaimName: "train-gpus", Driver: "gpu.nvidia.com", Pool: "node-a", Device: "gpu-1"}
	share := podresources.ClaimDevice{ClaimNamespace: "ml", ClaimName: "train-gpus", Driver: "gpu.nvidia.com", Pool: "node-a", Device: "gpu-2", ShareID: "3f1c"}
	nic := podresources.ClaimDevice{ClaimNamespace: "ml", ClaimName: "train-nic", Driver: "nic.example.com", Pool: "node-a", Device: "eth1"}
	srv.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA}},
		{Namespace: "ml", Pod: "train", Container: "main", Claims: []podresources.ClaimDevice{gpu0, gpu1, nic, share}},
		{Namespace: "ml", Pod: "infer", Container: "srv", Claims: []podresources.ClaimDevice{gpu0}},
	})
	got, err := newClient(t, path).List(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := []podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA}},
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "gpu.nvidia.com", Claims: []podresources.ClaimDevice{gpu0, gpu1, share}},
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nic.example.com", Claims: []podresources.ClaimDevice{nic}},
		{Namespace: "ml", Pod: "infer", Container: "srv", Resource: "gpu.nvidia.com", Claims: []podresources.ClaimDevice{gpu0}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("List() mismatch (-want +got):\n%s", diff)
	}
}

func TestUnavailable(t *testing.T) {
	tests := []struct {
		name  string
		setup func(t *testing.T, path string)
	}{
		{name: "socket missing", setup: func(*testing.T, string) {}},
		{name: "stale socket, nobody listening", setup: func(t *testing.T, path string) {
			lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
			if err != nil {
				t.Fatal(err)
			}
			lis.SetUnlinkOnClose(false)
			lis.Close()
		}},
		{name: "listener that never speaks gRPC", setup: func(t *testing.T, path string) {
			lis, err := net.Listen("unix", path)
			if err != nil {
				t.Fatal(err)
			}
			var mu sync.Mutex
			var conns []net.Conn
			go func() {
				for {
					conn, err := lis.Accept()
					if err != nil {
						return
					}
					mu.Lock()
					conns = append(conns, conn)
					mu.Unlock()
				}
			}()
			t.Cleanup(func() {
				lis.Close()
				mu.Lock()
				defer mu.Unlock()
				for _, c := range conns {
					c.Close()
				}
			})
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := podresourcestest.SocketPath(t)
			tc.setup(t, path)
			c := newClient(t, path, podresources.WithTimeout(300*time.Millisecond))
			for _, call := range []struct {
				name string
				f    func() error
			}{
				{"List", func() error { _, err := c.List(context.Background()); return err }},
				{"Allocatable", func() error { _, err := c.Allocatable(context.Background()); return err }},
			} {
				err := within(t, 30*time.Second, call.f)
				if !errors.Is(err, podresources.ErrUnavailable) {
					t.Fatalf("%s() error = %v, want ErrUnavailable", call.name, err)
				}
				if !strings.Contains(err.Error(), path) {
					t.Errorf("%s() error %q does not name the socket", call.name, err)
				}
			}
		})
	}
}

// TestMissingSocketDoesNotWaitForTimeout: with an hour-long per-call timeout
// a missing socket must still fail at once, not at the deadline.
func TestMissingSocketDoesNotWaitForTimeout(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	c := newClient(t, path, podresources.WithTimeout(time.Hour))
	err := within(t, 30*time.Second, func() error { _, err := c.List(context.Background()); return err })
	if !errors.Is(err, podresources.ErrUnavailable) {
		t.Fatalf("List() error = %v, want ErrUnavailable", err)
	}
}

func TestKubeletRestart(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	// The client exists before the kubelet does.
	c := newClient(t, path)
	ctx := context.Background()
	if _, err := c.List(ctx); !errors.Is(err, podresources.ErrUnavailable) {
		t.Fatalf("List() before the kubelet started: error = %v, want ErrUnavailable", err)
	}

	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	pods := []podresources.Allocation{{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0"}}}
	srv.SetPods(pods)

	mustList := func(step string) {
		t.Helper()
		got, err := c.List(ctx)
		if err != nil {
			t.Fatalf("%s: List() error = %v", step, err)
		}
		if diff := cmp.Diff(pods, got); diff != "" {
			t.Fatalf("%s: List() mismatch (-want +got):\n%s", step, diff)
		}
	}
	mustList("first start")

	for i := range 3 {
		srv.Stop()
		if _, err := c.List(ctx); !errors.Is(err, podresources.ErrUnavailable) {
			t.Fatalf("restart %d: List() while stopped: error = %v, want ErrUnavailable", i, err)
		}
		if err := srv.Restart(); err != nil {
			t.Fatal(err)
		}
		// No polling: the first call after the socket is back must work.
		mustList("after restart")
	}
}

// TestRecoversFromStaleSocket: failed dials against a socket nobody serves
// put gRPC into reconnect backoff; once a kubelet serves the path, the same
// client must work on its first call.
func TestRecoversFromStaleSocket(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	lis.SetUnlinkOnClose(false)
	lis.Close()

	c := newClient(t, path)
	for range 5 {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_, err := c.List(ctx)
		cancel()
		if !errors.Is(err, podresources.ErrUnavailable) {
			t.Fatalf("List() on a stale socket: error = %v, want ErrUnavailable", err)
		}
	}

	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetAllocatable([]podresources.Allocatable{{Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA}}})
	got, err := c.Allocatable(context.Background())
	if err != nil {
		t.Fatalf("Allocatable() after the kubelet came up: %v", err)
	}
	if len(got) != 1 || got[0].DeviceIDs[0] != gpuA {
		t.Errorf("Allocatable() = %v", got)
	}
}

func TestErrors(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, path)

	// An old kubelet without GetAllocatableResources answers Unimplemented:
	// it is there, so this is not ErrUnavailable.
	srv.SetError(status.Error(codes.Unimplemented, "no such method"))
	_, err = c.Allocatable(context.Background())
	if err == nil || errors.Is(err, podresources.ErrUnavailable) || status.Code(errors.Unwrap(err)) != codes.Unimplemented {
		t.Errorf("Allocatable() error = %v, want Unimplemented and not ErrUnavailable", err)
	}
	if err != nil && !strings.Contains(err.Error(), path) {
		t.Errorf("error %q does not name the socket", err)
	}

	// The kubelet answering Unavailable itself is the same as no kubelet.
	srv.SetError(status.Error(codes.Unavailable, "shutting down"))
	if _, err := c.List(context.Background()); !errors.Is(err, podresources.ErrUnavailable) {
		t.Errorf("List() error = %v, want ErrUnavailable", err)
	}

	// A caller that gives up gets its own cancellation back.
	srv.SetError(nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := c.List(ctx); !errors.Is(err, context.Canceled) || errors.Is(err, podresources.ErrUnavailable) {
		t.Errorf("List(canceled) error = %v, want context.Canceled", err)
	}

	if _, err := c.List(context.Background()); err != nil {
		t.Errorf("List() after SetError(nil): %v", err)
	}
}

func TestNewClientRejects(t *testing.T) {
	if _, err := podresources.NewClient(""); err == nil {
		t.Error("NewClient(\"\") succeeded")
	}
	if _, err := podresources.NewClient("/x.sock", podresources.WithTimeout(0)); err == nil {
		t.Error("NewClient with a zero timeout succeeded")
	}
}

func TestConcurrentCalls(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	srv.SetPods([]podresources.Allocation{{Namespace: "a", Pod: "b", Container: "c", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA}}})
	c := newClient(t, path)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for range 16 {
		wg.Go(func() {
			_, err := c.List(context.Background())
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
}

// A restarted kubelet's socket is a new Instance, even where the file system
// gives the new socket the old one's inode number.
func TestInstance(t *testing.T) {
	path := podresourcestest.SocketPath(t)
	c, err := podresources.NewClient(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if c.Instance().Known() {
		t.Fatal("Instance known before the socket exists")
	}
	if !c.Instance().Same(podresources.Instance{}) {
		t.Error("two missing sockets are not the same Instance")
	}
	srv, err := podresourcestest.Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	first := c.Instance()
	if !first.Known() || !first.Same(c.Instance()) {
		t.Fatalf("the same socket read twice is not the same Instance: %+v", first)
	}
	if _, err := c.List(t.Context()); err != nil {
		t.Fatal(err)
	}
	if !first.Same(c.Instance()) {
		t.Error("a call changed the Instance")
	}
	// Socket files' times may have only a clock tick's resolution; wait for
	// the clock to move so that the test does not depend on the inode.
	time.Sleep(20 * time.Millisecond)
	if err := srv.Restart(); err != nil {
		t.Fatal(err)
	}
	if second := c.Instance(); !second.Known() || second.Same(first) {
		t.Errorf("the restarted server's socket is the same Instance as the first")
	}
}

// TestStaleSocketFailsAtOnce: a socket file with nothing listening (a
// kubelet stopped or crashed may leave it behind) is refused as unavailable
// with the refusal, not waited on until the call's deadline: each scrape
// would otherwise take the whole timeout.
func TestStaleSocketFailsAtOnce(t *testing.T) {
	sock := podresourcestest.SocketPath(t)
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = l.Close()
	c := newClient(t, sock, podresources.WithTimeout(5*time.Second))
	for i := range 2 {
		_, err := c.List(context.Background())
		if !errors.Is(err, podresources.ErrUnavailable) || !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("call %d on a socket nothing listens on: %v, want ErrUnavailable with the refusal", i, err)
		}
	}
	// A kubelet that comes back on the same path is served at once.
	srv, err := podresourcestest.Start(t, sock)
	if err != nil {
		t.Fatal(err)
	}
	_ = srv
	if _, err := c.List(context.Background()); err != nil {
		t.Errorf("after the kubelet came back: %v", err)
	}
}
