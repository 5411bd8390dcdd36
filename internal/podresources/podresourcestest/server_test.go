package podresourcestest

import (
	"context"
	"errors"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/testing/protocmp"
	podresourcesv1 "k8s.io/kubelet/pkg/apis/podresources/v1"

	"github.com/gpuslice/gpuslice/internal/podresources"
)

// rawClient talks to the server with the generated client only, so that
// these tests do not depend on package podresources' client.
func rawClient(t *testing.T, path string) podresourcesv1.PodResourcesListerClient {
	t.Helper()
	conn, err := grpc.NewClient("unix://"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return podresourcesv1.NewPodResourcesListerClient(conn)
}

func TestServes(t *testing.T) {
	path := SocketPath(t)
	s, err := Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	if s.Path() != path {
		t.Errorf("Path() = %q, want %q", s.Path(), path)
	}
	s.SetPods([]podresources.Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{"GPU-a::0"}},
		{Namespace: "ml", Pod: "train", Container: "side"},
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{"GPU-a::1"}},
		{Namespace: "web", Pod: "train", Container: "c", Resource: "r", DeviceIDs: []string{"x"}},
	})
	s.SetAllocatable([]podresources.Allocatable{{Resource: "nvidia.com/gpu", DeviceIDs: []string{"GPU-a::0", "GPU-a::1"}}})
	c := rawClient(t, path)
	ctx := context.Background()

	list, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	train := &podresourcesv1.PodResources{Name: "train", Namespace: "ml", Containers: []*podresourcesv1.ContainerResources{
		{Name: "main", Devices: []*podresourcesv1.ContainerDevices{
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-a::0"}},
			{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-a::1"}},
		}},
		{Name: "side"},
	}}
	want := &podresourcesv1.ListPodResourcesResponse{PodResources: []*podresourcesv1.PodResources{
		train,
		{Name: "train", Namespace: "web", Containers: []*podresourcesv1.ContainerResources{
			{Name: "c", Devices: []*podresourcesv1.ContainerDevices{{ResourceName: "r", DeviceIds: []string{"x"}}}},
		}},
	}}
	if diff := cmp.Diff(want, list, protocmp.Transform()); diff != "" {
		t.Errorf("List mismatch (-want +got):\n%s", diff)
	}

	alloc, err := c.GetAllocatableResources(ctx, &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	wantAlloc := &podresourcesv1.AllocatableResourcesResponse{Devices: []*podresourcesv1.ContainerDevices{
		{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-a::0"}},
		{ResourceName: "nvidia.com/gpu", DeviceIds: []string{"GPU-a::1"}},
	}}
	if diff := cmp.Diff(wantAlloc, alloc, protocmp.Transform()); diff != "" {
		t.Errorf("GetAllocatableResources mismatch (-want +got):\n%s", diff)
	}

	got, err := c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: "train", PodNamespace: "ml"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(&podresourcesv1.GetPodResourcesResponse{PodResources: train}, got, protocmp.Transform()); diff != "" {
		t.Errorf("Get mismatch (-want +got):\n%s", diff)
	}
	if _, err := c.Get(ctx, &podresourcesv1.GetPodResourcesRequest{PodName: "train", PodNamespace: "nope"}); status.Code(err) != codes.NotFound {
		t.Errorf("Get(unknown pod) error = %v, want NotFound", err)
	}

	s.SetError(status.Error(codes.Internal, "boom"))
	if _, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{}); status.Code(err) != codes.Internal {
		t.Errorf("List after SetError = %v, want Internal", err)
	}
	s.SetError(nil)
	if _, err := c.List(ctx, &podresourcesv1.ListPodResourcesRequest{}); err != nil {
		t.Errorf("List after SetError(nil) = %v", err)
	}
}

func TestStateIsCopied(t *testing.T) {
	path := SocketPath(t)
	s, err := Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	ids := []string{"GPU-a"}
	s.SetAllocatable([]podresources.Allocatable{{Resource: "r", DeviceIDs: ids}})
	ids[0] = "changed"
	alloc, err := rawClient(t, path).GetAllocatableResources(context.Background(), &podresourcesv1.AllocatableResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if got := alloc.GetDevices()[0].GetDeviceIds()[0]; got != "GPU-a" {
		t.Errorf("device ID = %q: the server kept the caller's slice", got)
	}
}

func TestStopRestart(t *testing.T) {
	path := SocketPath(t)
	// A socket left behind by an earlier run must not stop Start.
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	lis.SetUnlinkOnClose(false)
	lis.Close()

	s, err := Start(t, path)
	if err != nil {
		t.Fatal(err)
	}
	s.SetPods([]podresources.Allocation{{Namespace: "n", Pod: "p", Container: "c", Resource: "r", DeviceIDs: []string{"d"}}})
	if err := s.listen(); err == nil {
		t.Error("listen while serving succeeded")
	}

	s.Stop()
	s.Stop() // idempotent
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("socket after Stop: %v, want it gone", err)
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	list, err := rawClient(t, path).List(context.Background(), &podresourcesv1.ListPodResourcesRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if n := len(list.GetPodResources()); n != 1 {
		t.Errorf("List after Restart has %d pods, want the 1 set before", n)
	}
}

func TestServeStopsWithContext(t *testing.T) {
	path := SocketPath(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := Serve(ctx, path); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("socket while serving: %v", err)
	}
	cancel()
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, err := os.Stat(path)
		if errors.Is(err, fs.ErrNotExist) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("socket still there after the context ended: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestStartFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "missing-dir", "kubelet.sock")
	if _, err := Start(t, path); err == nil {
		t.Error("Start in a missing directory succeeded")
	}
}
