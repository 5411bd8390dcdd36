package flagenv

import (
	"flag"
	"strings"
	"testing"
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
