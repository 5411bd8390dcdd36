package dra

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/go-cmp/cmp"
	resourcev1 "k8s.io/api/resource/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/podresources"
)

const (
	nvidia = "gpu.nvidia.com"
	uuid0  = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"
	uuid1  = "GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5"
	mig    = "MIG-1b2c3d4e-5f60-7182-93a4-b5c6d7e8f901"
)

func str(s string) resourcev1.DeviceAttribute { return resourcev1.DeviceAttribute{StringValue: &s} }

// device is a device with the given attributes, as name=value pairs.
func device(name string, attrs map[resourcev1.QualifiedName]resourcev1.DeviceAttribute) resourcev1.Device {
	return resourcev1.Device{Name: name, Attributes: attrs}
}

func slice(driver, pool string, gen int64, devs ...resourcev1.Device) *resourcev1.ResourceSlice {
	node := "node-a"
	return &resourcev1.ResourceSlice{
		ObjectMeta: metav1.ObjectMeta{Name: driver + "-" + pool},
		Spec: resourcev1.ResourceSliceSpec{
			Driver: driver, NodeName: &node,
			Pool:    resourcev1.ResourcePool{Name: pool, Generation: gen, ResourceSliceCount: 1},
			Devices: devs,
		},
	}
}

func TestFromSlices(t *testing.T) {
	tests := []struct {
		name   string
		slices []*resourcev1.ResourceSlice
		want   Devices
	}{
		{"NVIDIA's driver: uuid attribute", []*resourcev1.ResourceSlice{slice(nvidia, "node-a", 1,
			device("gpu-0", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str(uuid0), "productName": str("NVIDIA RTX A6000")}),
			device("gpu-1", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str(uuid1)}))},
			Devices{{nvidia, "node-a", "gpu-0"}: uuid0, {nvidia, "node-a", "gpu-1"}: uuid1}},
		{"qualified by the driver's domain", []*resourcev1.ResourceSlice{slice(nvidia, "p", 1,
			device("gpu-0", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"gpu.nvidia.com/uuid": str(uuid0)}))},
			Devices{{nvidia, "p", "gpu-0"}: uuid0}},
		{"MIG devices, NICs and non-UUID values are not GPUs", []*resourcev1.ResourceSlice{
			slice(nvidia, "p", 1,
				device("mig-0", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str(mig)}),
				device("odd", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str("GPU-nope")}),
				device("int", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": {IntValue: new(int64)}})),
			slice("nic.example.com", "p", 1, device("eth1", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"mac": str("02:00:00:00:00:01")})),
		}, Devices{}},
		{"another domain's uuid is not the GPU's", []*resourcev1.ResourceSlice{slice(nvidia, "p", 1,
			device("gpu-0", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"example.com/uuid": str(uuid0)}))},
			Devices{}},
		{"only the newest generation of a pool", []*resourcev1.ResourceSlice{
			slice(nvidia, "p", 1, device("gpu-0", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str(uuid0)})),
			slice(nvidia, "p", 2, device("gpu-1", map[resourcev1.QualifiedName]resourcev1.DeviceAttribute{"uuid": str(uuid1)})),
		}, Devices{{nvidia, "p", "gpu-1"}: uuid1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, FromSlices(tc.slices)); diff != "" {
				t.Errorf("FromSlices (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolve(t *testing.T) {
	gpus := Devices{{nvidia, "node-a", "gpu-0"}: uuid0, {nvidia, "node-a", "gpu-1"}: uuid1}
	claim := func(name, dev string) podresources.ClaimDevice {
		return podresources.ClaimDevice{ClaimNamespace: "ml", ClaimName: name, Driver: nvidia, Pool: "node-a", Device: dev}
	}
	plugin := podresources.Allocation{Namespace: "ml", Pod: "old", Container: "c", Resource: "nvidia.com/gpu", DeviceIDs: []string{uuid1 + "::0"}}
	in := []podresources.Allocation{
		plugin,
		// Two pods on one shared claim.
		{Namespace: "ml", Pod: "a", Container: "c", Resource: nvidia, Claims: []podresources.ClaimDevice{claim("shared", "gpu-0")}},
		{Namespace: "ml", Pod: "b", Container: "c", Resource: nvidia, Claims: []podresources.ClaimDevice{claim("shared", "gpu-0")}},
		// Two shares of one device and another GPU: each UUID once.
		{Namespace: "ml", Pod: "wide", Container: "c", Resource: nvidia, Claims: []podresources.ClaimDevice{
			{ClaimNamespace: "ml", ClaimName: "w", Driver: nvidia, Pool: "node-a", Device: "gpu-0", ShareID: "s1"},
			{ClaimNamespace: "ml", ClaimName: "w", Driver: nvidia, Pool: "node-a", Device: "gpu-0", ShareID: "s2"},
			claim("w", "gpu-1")}},
		// A NIC claim: not a GPU driver here, dropped without counting.
		{Namespace: "ml", Pod: "net", Container: "c", Resource: "nic.example.com", Claims: []podresources.ClaimDevice{
			{Driver: "nic.example.com", Pool: "node-a", Device: "eth1"}}},
		// A GPU the slices do not list yet.
		{Namespace: "ml", Pod: "early", Container: "c", Resource: nvidia, Claims: []podresources.ClaimDevice{claim("e", "gpu-7")}},
	}
	got, unknown := Resolve(in, gpus)
	with := func(a podresources.Allocation, ids ...string) podresources.Allocation { a.DeviceIDs = ids; return a }
	want := []podresources.Allocation{plugin, with(in[1], uuid0), with(in[2], uuid0), with(in[3], uuid0, uuid1)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Resolve (-want +got):\n%s", diff)
	}
	if unknown != 1 {
		t.Errorf("unknown = %d, want 1 (gpu-7)", unknown)
	}
	if in[1].DeviceIDs != nil {
		t.Errorf("Resolve changed its input: %v", in[1].DeviceIDs)
	}
}

type fakeLister struct {
	allocs []podresources.Allocation
	err    error
}

func (f fakeLister) List(context.Context) ([]podresources.Allocation, error) { return f.allocs, f.err }
func (f fakeLister) Allocatable(context.Context) ([]podresources.Allocatable, error) {
	return nil, f.err
}

type fakeSlices Devices

func (f fakeSlices) Devices() Devices { return Devices(f) }
func (f fakeSlices) Err() error       { return nil }

// The wrapper resolves claims and passes the kubelet's error on with what
// it did answer.
func TestKubeletList(t *testing.T) {
	boom := errors.New("boom")
	k := Kubelet{
		Lister: fakeLister{err: boom, allocs: []podresources.Allocation{{Namespace: "ml", Pod: "a", Container: "c", Resource: nvidia,
			Claims: []podresources.ClaimDevice{{Driver: nvidia, Pool: "p", Device: "gpu-0"}}}}},
		Slices: fakeSlices{{nvidia, "p", "gpu-0"}: uuid0},
	}
	got, err := k.List(context.Background())
	if !errors.Is(err, boom) {
		t.Errorf("err = %v, want boom", err)
	}
	if len(got) != 1 || !cmp.Equal(got[0].DeviceIDs, []string{uuid0}) {
		t.Errorf("List = %+v, want the claim resolved to %s", got, uuid0)
	}
}

// instanceLister is a Lister that tells its socket, as *podresources.Client
// does.
type instanceLister struct {
	fakeLister
	at podresources.Instance
}

func (l instanceLister) Instance() podresources.Instance { return l.at }

// TestKubeletInstance: Kubelet passes on the socket its Lister tells, so
// that the exporter sees a kubelet restart through it in DRA mode too.
func TestKubeletInstance(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "kubelet.sock")
	if err := os.WriteFile(sock, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := podresources.NewClient(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close() //nolint:errcheck // nothing was sent
	at := c.Instance()
	if !at.Known() {
		t.Fatal("no Instance for the socket file")
	}
	if got := (Kubelet{Lister: instanceLister{at: at}}).Instance(); !got.Same(at) {
		t.Errorf("Instance = %+v, want the Lister's", got)
	}
	if got := (Kubelet{Lister: fakeLister{}}).Instance(); got.Known() {
		t.Errorf("Instance of a Lister that tells none = %+v, want the zero Instance", got)
	}
}
