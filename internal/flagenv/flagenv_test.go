package flagenv

import (
	"flag"
	"strings"
	"testing"
	"time"
)

func TestApply(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	addr := fs.String("web.listen-address", ":9846", "")
	backend := fs.String("gpu.backend", "nvml", "")
	n := fs.Int("scrape-count", 1, "")
	if err := fs.Parse([]string{"--gpu.backend=sim"}); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"GPUSLICE_WEB_LISTEN_ADDRESS": ":1", "GPUSLICE_GPU_BACKEND": "nvml", "GPUSLICE_SCRAPE_COUNT": "3"}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	if err := Apply(fs, "GPUSLICE_", lookup); err != nil {
		t.Fatal(err)
	}
	if *addr != ":1" || *backend != "sim" || *n != 3 {
		t.Fatalf("addr %q backend %q n %d", *addr, *backend, *n)
	}
	env["GPUSLICE_SCRAPE_COUNT"] = "many"
	fs2 := flag.NewFlagSet("t", flag.ContinueOnError)
	fs2.Int("scrape-count", 1, "")
	_ = fs2.Parse(nil)
	err := Apply(fs2, "GPUSLICE_", lookup)
	if err == nil || !strings.Contains(err.Error(), "GPUSLICE_SCRAPE_COUNT") {
		t.Fatalf("bad value error = %v", err)
	}
}

func TestNonNegative(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	fs.Duration("every", time.Second, "")
	fs.Int64("max", 1, "")
	fs.String("name", "", "")
	if err := fs.Parse([]string{"--every=0s", "--max=-3"}); err != nil {
		t.Fatal(err)
	}
	if err := NonNegative(fs, "every"); err != nil {
		t.Errorf("--every=0s: %v, want accepted (0 is the default)", err)
	}
	for names, want := range map[string]string{"every max": "--max=-3: must not be negative", "name": "not a duration or an integer", "gone": "no flag --gone"} {
		if err := NonNegative(fs, strings.Fields(names)...); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("NonNegative(%s) = %v, want an error containing %q", names, err, want)
		}
	}
}
