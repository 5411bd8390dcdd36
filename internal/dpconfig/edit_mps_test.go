package dpconfig

import (
	"errors"
	"strings"
	"testing"
)

func TestSetMPSReplicasKeepsTheText(t *testing.T) {
	in := "version: v1\n# our MPS split\nsharing:\n  mps:\n    renameByDefault: true # name.shared\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4 # a quarter each\nflags: {migStrategy: none}\n"
	f, err := Parse([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	if !f.MPS() || f.SharedReplicas() != 4 || f.Replicas() != 1 {
		t.Fatalf("MPS %v, shared %d, time-slicing %d", f.MPS(), f.SharedReplicas(), f.Replicas())
	}
	changed, err := f.SetSharedReplicas(2)
	if err != nil || !changed {
		t.Fatalf("SetSharedReplicas(2) = %v, %v", changed, err)
	}
	out, _ := f.Marshal()
	if want := strings.Replace(in, "replicas: 4", "replicas: 2", 1); string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
	c := f.Config()
	if !c.MPS || len(c.Resources) != 0 || c.MPSSharing.Replicas() != 2 || !c.MPSSharing.RenameByDefault {
		t.Errorf("config after the change: %+v", c)
	}
	if changed, err := f.SetMPSReplicas(2); changed || err != nil {
		t.Errorf("same count again: %v, %v", changed, err)
	}
}

func TestSetMPSReplicasRefuses(t *testing.T) {
	mps, err := Parse([]byte("sharing: {mps: {resources: [{name: gpu, replicas: 3}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	before, _ := mps.Marshal()
	for _, n := range []int{1, 0, -2} {
		if _, err := mps.SetSharedReplicas(n); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), ">= 2 under MPS") {
			t.Errorf("SetSharedReplicas(%d) on MPS: %v", n, err)
		}
	}
	if after, _ := mps.Marshal(); string(after) != string(before) {
		t.Errorf("a refused change altered the file:\n%s", after)
	}
	ts, err := Parse([]byte("sharing: {timeSlicing: {resources: [{name: gpu, replicas: 3}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ts.SetMPSReplicas(4); !errors.Is(err, ErrInvalid) {
		t.Errorf("SetMPSReplicas on a time-slicing config: %v", err)
	}
	// SetSharedReplicas on time-slicing is SetReplicas: it never adds MPS.
	if _, err := ts.SetSharedReplicas(5); err != nil || ts.MPS() || ts.SharedReplicas() != 5 {
		t.Errorf("time-slicing: %v, MPS %v, %d", err, ts.MPS(), ts.SharedReplicas())
	}
}

func TestSetMPSReplicasFlowAndJSON(t *testing.T) {
	for _, in := range []string{
		"sharing: {mps: {resources: [{name: gpu, replicas: 3}, {name: nvidia.com/other, replicas: 3}]}}\n",
		`{"version": "v1", "sharing": {"mps": {"resources": [{"name": "nvidia.com/gpu", "replicas": 3}]}}}`,
	} {
		f, err := Parse([]byte(in))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.SetMPSReplicas(6); err != nil {
			t.Fatalf("%s: %v", in, err)
		}
		for _, r := range f.Config().MPSSharing.Resources {
			if r.Replicas != 6 {
				t.Errorf("%s: %s has %d replicas", in, r.Name, r.Replicas)
			}
		}
	}
}
