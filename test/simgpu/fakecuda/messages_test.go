package main

import (
	"strings"
	"testing"

	"github.com/gpuslice/gpuslice/internal/oom"
)

// Every framework's wording must be one GPU OOM to the exporter's detector:
// at least one of its lines counts, and none is of another kind than device.
func TestMessagesAreCounted(t *testing.T) {
	d, err := oom.NewDetector(oom.Config{})
	if err != nil {
		t.Fatal(err)
	}
	o := oomInfo{request: 400 << 30, held: 1 << 30, total: 141 << 30, free: 10 << 30, pid: 4242}
	for _, name := range frameworks() {
		t.Run(name, func(t *testing.T) {
			n := 0
			for line := range strings.Lines(oomMessages[name](o)) {
				if kind, ok := d.Classify(line); ok {
					n++
					if kind != oom.KindDevice {
						t.Errorf("%q is of kind %q, want %q", line, kind, oom.KindDevice)
					}
				}
			}
			if n == 0 {
				t.Errorf("no line of %s's message counts:\n%s", name, oomMessages[name](o))
			}
		})
	}
}

func TestXLABytes(t *testing.T) {
	for in, want := range map[uint64]string{512: "512B", 1536: "1.50KiB", 400 << 30: "400.00GiB", 5 << 40: "5.00TiB"} {
		if got := xlaBytes(in); got != want {
			t.Errorf("xlaBytes(%d) = %q, want %q", in, got, want)
		}
	}
}
