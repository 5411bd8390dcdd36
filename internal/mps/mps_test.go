package mps

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePinnedLimit(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want map[string]uint64
		err  bool
	}{
		{"0=10G", map[string]uint64{"0": 10 << 30}, false},
		{"0=12288M,1=512MB", map[string]uint64{"0": 12 << 30, "1": 512 << 20}, false},
		{"GPU-x=1024", map[string]uint64{"GPU-x": 1024}, false},
		{"", map[string]uint64{}, false},
		{"0=", nil, true},
		{"10G", nil, true},
		{"0=tenG", nil, true},
		// More than 64 bits of bytes: an error, not a wrapped number.
		{"0=99999999999T", nil, true},
		{"0=16777215T", map[string]uint64{"0": 16777215 << 40}, false},
	} {
		got, err := ParsePinnedLimit(tc.in)
		if (err != nil) != tc.err || !tc.err && !cmp.Equal(got, tc.want) {
			t.Errorf("ParsePinnedLimit(%q) = %v, %v; want %v (error %v)", tc.in, got, err, tc.want, tc.err)
		}
	}
}

func TestFormatAndLimitFor(t *testing.T) {
	s := FormatPinnedLimit(2, MemoryLimit(48<<30+5, 3))
	if s != "0=16384M,1=16384M" {
		t.Fatalf("FormatPinnedLimit = %q", s)
	}
	limits, err := ParsePinnedLimit(s)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := LimitFor(limits, "GPU-a"); !ok || v != 16<<30 {
		t.Errorf("LimitFor one value = %d, %v", v, ok)
	}
	if _, ok := LimitFor(map[string]uint64{"0": 1, "1": 2}, "GPU-a"); ok {
		t.Error("LimitFor of different per-ordinal limits is not knowable")
	}
	if v, ok := LimitFor(map[string]uint64{"0": 1, "GPU-a": 2}, "GPU-a"); !ok || v != 2 {
		t.Errorf("LimitFor by UUID = %d, %v", v, ok)
	}
	// A 0 among the keys: unknown, whichever key the map gives first.
	for range 100 {
		if v, ok := LimitFor(map[string]uint64{"0": 0, "1": 5 << 30}, "GPU-a"); ok {
			t.Fatalf("LimitFor of a 0 and a 5 GiB limit = %d, known; want unknown", v)
		}
	}
	if ThreadPercentage(3) != 33 || ThreadPercentage(0) != 100 {
		t.Error("ThreadPercentage")
	}
	if p := ThreadPercentage(101); p != 1 {
		t.Errorf("ThreadPercentage(101) = %d, want 1: no client runs on 0%%", p)
	}
}
