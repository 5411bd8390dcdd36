package main

import (
	"github.com/gpuslice/gpuslice/internal/testproc"

	"bytes"
	"context"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
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

// runWithin runs the demo with --once and gives up after limit, so that a
// demo that would wait forever fails the test instead of hanging it.
func runWithin(t *testing.T, limit time.Duration, args ...string) (time.Duration, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	start := time.Now()
	err := run(ctx, append([]string{"--once", "--dir", t.TempDir()}, args...), io.Discard)
	return time.Since(start), err
}

// TestDemoExporterExits: an exporter that exits at once ends the demo at
// once, with the exporter's own last words, not a scrape error 30 s later
// that points to a log the demo has already deleted.
func TestDemoExporterExits(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "gpuslice-exporter")
	script := "#!/bin/sh\necho 'gpuslice-exporter: listen tcp 127.0.0.1:9846: bind: address already in use' >&2\nexit 1\n"
	if err := os.WriteFile(bin, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	took, err := runWithin(t, 10*time.Second, "--exporter", bin)
	if err == nil {
		t.Fatal("demo succeeded with an exporter that exited")
	}
	for _, want := range []string{"exited: exit status 1", "bind: address already in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	if took > 5*time.Second {
		t.Errorf("demo took %s to notice the exporter exit", took)
	}
}

// TestDemoPortTaken: a --listen address held by a listener that accepts and
// never answers fails the demo at once, naming the address; the demo used
// to start the exporter anyway and wait on that listener forever.
func TestDemoPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	bin := testproc.Build(t, "cmd/exporter")
	took, err := runWithin(t, 20*time.Second, "--exporter", bin, "--listen", l.Addr().String())
	if err == nil || !strings.Contains(err.Error(), "address already in use") {
		t.Fatalf("demo on a taken port: %v, want address already in use", err)
	}
	if took > 5*time.Second {
		t.Errorf("demo took %s to fail on a taken port", took)
	}
}

// TestDemoDefaultPort: by default the demo takes a free loopback port, not
// the exporter's 9846 (which another exporter may hold), and the URL it
// scrapes and prints reaches an exporter listening on any address.
func TestDemoDefaultPort(t *testing.T) {
	addr, err := listenAddr("")
	if err != nil {
		t.Fatal(err)
	}
	if _, port, _ := net.SplitHostPort(addr); port == "0" || port == "9846" || !strings.HasPrefix(addr, "127.0.0.1:") {
		t.Errorf("default listen address %q, want a free loopback port", addr)
	}
	for in, want := range map[string]string{
		"127.0.0.1:9000": "http://127.0.0.1:9000/metrics",
		":9000":          "http://127.0.0.1:9000/metrics",
		"0.0.0.0:9000":   "http://127.0.0.1:9000/metrics",
		"[::]:9000":      "http://127.0.0.1:9000/metrics",
		"[::1]:9000":     "http://[::1]:9000/metrics",
	} {
		if got := scrapeURL(in); got != want {
			t.Errorf("scrapeURL(%q) = %q, want %q", in, got, want)
		}
	}
}
