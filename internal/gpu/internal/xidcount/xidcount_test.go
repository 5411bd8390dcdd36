package xidcount

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

func TestCounts(t *testing.T) {
	var c Counts
	if got := c.List(); got == nil || len(got) != 0 {
		t.Fatalf("empty List = %#v, want empty and not nil", got)
	}
	c.Add("GPU-b", 1, 79, 1)
	c.Add("GPU-b", 1, 79, 1)
	c.Add("GPU-a", 0, 13, 1)
	c.Raise("GPU-b", 1, 48, 3)
	c.Raise("GPU-b", 1, 48, 2) // lower: kept at 3
	c.Raise("GPU-a", 0, 13, 4)
	want := []gpu.XidCount{
		{UUID: "GPU-a", Index: 0, Xid: 13, Count: 4},
		{UUID: "GPU-b", Index: 1, Xid: 48, Count: 3},
		{UUID: "GPU-b", Index: 1, Xid: 79, Count: 2},
	}
	if diff := cmp.Diff(want, c.List()); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
}
