package main

import (
	"github.com/gpuslice/gpuslice/internal/testproc"

	"bytes"
	"context"
	"regexp"
	"testing"
)

// TestDemoOnce runs the demo as `make demo` does, with --once, against the
// real exporter binary, and checks the report a user sees: the tuner raises
// on headroom and lowers on the OOM, and the per-pod table.
func TestDemoOnce(t *testing.T) {
	bin := testproc.Build(t, "cmd/exporter")
	addr := testproc.FreeAddr(t)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"--once", "--exporter", bin, "--listen", addr, "--dir", t.TempDir()}, &out); err != nil {
		t.Fatalf("demo: %v\n%s", err, out.String())
	}
	for _, want := range []string{
		`tuner: raise 5 → 6 \(SustainedHeadroom\)`,
		`tuner: lower 6 → 3 \(GPUOOM\)`, // 28 + 7 + 5 GiB fit 90% of 48, a fourth pod does not
		`GPU 0 GPU-[0-9a-f-]+: 46\.5 GiB of 48\.0 GiB used`,
		`batch\s+llm-finetune-0\s+train\s+28\.0 GiB\s+60%\s+1\s+0\s+0s\n`,
		`media\s+esrgan-upscale-0\s+esrgan\s+5\.0 GiB\s+15%\s+1\s+1\s+0s\n`,
		`media\s+rife-interp-0\s+rife\s+7\.0 GiB\s+31%\s+1\s+0\s+0s\n`,
		`vision\s+yolo-detector-7d9f8\s+detector\s+5\.0 GiB\s+22%\s+1\s+0\s+0s\n`,
		// The idle notebook: a replica and a context, no kernel.
		`lab\s+jupyter-0\s+notebook\s+0\.5 GiB\s+0%\s+1\s+0\s+[1-9][0-9]*s\n`,
		`Outside any pod on GPU 0: 0\.5 GiB`,
		`The exporter is at http://` + regexp.QuoteMeta(addr) + `/metrics`,
	} {
		if !regexp.MustCompile(want).MatchString(out.String()) {
			t.Errorf("report lacks %q:\n%s", want, out.String())
		}
	}
}
