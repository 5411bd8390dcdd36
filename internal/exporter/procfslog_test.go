package exporter

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/gpuslice/gpuslice/internal/gpu/gputest"
)

// TestProcfsFailureLogged: a /proc that cannot be read leaves every GPU
// process unattributed, so the log says why: once when the failure starts,
// again only when it changes (not when it merely hits another process),
// and once more when /proc reads again.
func TestProcfsFailureLogged(t *testing.T) {
	var log bytes.Buffer
	procfs := filepath.Join(t.TempDir(), "proc") // not there yet: a wrong --path.procfs
	gpuWith := func(pid int) gputest.GPUSpec {
		return gputest.GPU(gputest.UUID(0), gputest.A6000MemoryBytes, gputest.Proc(pid, 1<<30, 0.5))
	}
	fake := gputest.NewFake(gpuWith(4242))
	reg := prometheus.NewRegistry()
	reg.MustRegister(New(Config{GPU: fake, Procfs: procfs, Logger: slog.New(slog.NewTextHandler(&log, nil))}))
	// cgroupDir makes pid's cgroup file unreadable: a directory.
	cgroupDir := func(pid string) {
		if err := os.MkdirAll(filepath.Join(procfs, pid, "cgroup"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	steps := []struct {
		name   string
		before func()
		want   []string // the lines logged by this step's two scrapes
	}{{
		name: "procfs missing",
		want: []string{`level=WARN msg="cannot read procfs; GPU processes count as unattributed" procfs=` + procfs + ` err="procfs ` + procfs + `: statfs ` + procfs + `: no such file or directory"`},
	}, {
		name:   "a cgroup file that cannot be read",
		before: func() { cgroupDir("4242") },
		want:   []string{`level=WARN msg="cannot read procfs; GPU processes count as unattributed" procfs=` + procfs + ` err="read ` + procfs + `/4242/cgroup: is a directory"`},
	}, {
		name:   "the same failure in another process",
		before: func() { cgroupDir("4243"); fake.Set(gpuWith(4243)) },
	}, {
		name: "procfs reads again",
		before: func() {
			if err := os.RemoveAll(filepath.Join(procfs, "4243")); err != nil {
				t.Fatal(err)
			}
		},
		want: []string{`level=INFO msg="reading procfs again" procfs=` + procfs},
	}}
	for _, s := range steps {
		if s.before != nil {
			s.before()
		}
		log.Reset()
		for range 2 {
			if _, err := reg.Gather(); err != nil {
				t.Fatal(err)
			}
		}
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
			if l != "" {
				_, l, _ = strings.Cut(l, " ") // the time
				got = append(got, l)
			}
		}
		if strings.Join(got, "\n") != strings.Join(s.want, "\n") {
			t.Errorf("%s: logged\n%s\nwant\n%s", s.name, strings.Join(got, "\n"), strings.Join(s.want, "\n"))
		}
	}
}
