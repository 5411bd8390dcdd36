package nvmlbackend

import (
	"encoding/binary"
	"math"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// TestSampleValue reads every nvmlValue_t type nvmlDeviceGetSamples may
// give; drivers give utilization as unsigned int, but the type is theirs
// to choose.
func TestSampleValue(t *testing.T) {
	e := binary.NativeEndian
	put := func(f func(b []byte)) [8]byte {
		var v [8]byte
		f(v[:])
		return v
	}
	tests := []struct {
		vt   nvml.ValueType
		v    [8]byte
		want float64
		ok   bool
	}{
		{nvml.VALUE_TYPE_UNSIGNED_INT, put(func(b []byte) { e.PutUint32(b, 87) }), 87, true},
		{nvml.VALUE_TYPE_SIGNED_INT, put(func(b []byte) { e.PutUint32(b, int32ToU(-3)) }), -3, true},
		{nvml.VALUE_TYPE_UNSIGNED_LONG, put(func(b []byte) { e.PutUint64(b, 42) }), 42, true},
		{nvml.VALUE_TYPE_UNSIGNED_LONG_LONG, put(func(b []byte) { e.PutUint64(b, 43) }), 43, true},
		{nvml.VALUE_TYPE_SIGNED_LONG_LONG, put(func(b []byte) { e.PutUint64(b, 44) }), 44, true},
		{nvml.VALUE_TYPE_UNSIGNED_SHORT, put(func(b []byte) { e.PutUint16(b, 45) }), 45, true},
		{nvml.VALUE_TYPE_DOUBLE, put(func(b []byte) { e.PutUint64(b, math.Float64bits(46.5)) }), 46.5, true},
		{nvml.VALUE_TYPE_COUNT, [8]byte{1}, 0, false},
	}
	for _, tc := range tests {
		got, ok := sampleValue(tc.vt, tc.v)
		if got != tc.want || ok != tc.ok {
			t.Errorf("type %d: %v, %v; want %v, %v", tc.vt, got, ok, tc.want, tc.ok)
		}
	}
}

func int32ToU(i int32) uint32 { return uint32(i) }

// TestTimeWeighted: each sample stands for the time since the one before
// it (or since the window's start), so a short busy burst between long
// idle samples weighs little.
func TestTimeWeighted(t *testing.T) {
	type pt struct{ ts, v uint64 }
	tests := []struct {
		name    string
		samples []pt
		since   uint64
		want    float64
		newest  uint64
		found   bool
	}{
		{"none", nil, 5, 0, 5, false},
		{"none newer", []pt{{3, 10}, {5, 20}}, 5, 0, 5, false},
		{"one, with a window", []pt{{15, 40}}, 5, 40, 15, true},
		{"one, first reading", []pt{{15, 40}}, 0, 40, 15, true},
		{"first reading: the first stands for the gap after it", []pt{{10, 20}, {20, 40}}, 0, 30, 20, true},
		{"weighed by time", []pt{{2, 100}, {10, 0}}, 0, 20, 10, true},
		{"older ones skipped", []pt{{4, 100}, {6, 50}, {10, 0}}, 4, 50 * 2.0 / 6, 10, true},
		{"one timestamp twice", []pt{{7, 10}, {7, 30}}, 0, 20, 7, true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, newest, found := timeWeighted(tc.samples, tc.since,
				func(p pt) uint64 { return p.ts }, func(p pt) float64 { return float64(p.v) })
			if math.Abs(got-tc.want) > 1e-9 || newest != tc.newest || found != tc.found {
				t.Errorf("= %v, %d, %v; want %v, %d, %v", got, newest, found, tc.want, tc.newest, tc.found)
			}
		})
	}
}
