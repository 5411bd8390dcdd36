package e2e

import (
	"github.com/gpuslice/gpuslice/internal/testproc"

	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/testenv"
)

// execCommand is a go command with cgo quieted (go-nvml needs cgo).
func execCommand(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	return cmd
}

// controlPlaneBinary returns kube-scheduler or kube-controller-manager from
// the directory testenv uses, failing with how to build it.
func controlPlaneBinary(t *testing.T, name string) string {
	t.Helper()
	p := filepath.Join(testenv.AssetsDir(), name)
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s not found in %s (run `make test-bins`, or set KUBEBUILDER_ASSETS): %v", name, testenv.AssetsDir(), err)
	}
	return p
}

// lookPrometheus finds the prometheus binary.
func lookPrometheus(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("prometheus")
	if err != nil {
		t.Fatalf("prometheus not found in PATH (Debian: apt-get install prometheus; .ci/run installs it): %v", err)
	}
	return p
}

// freeAddr returns a loopback address with a port free at this moment.
func freeAddr(t *testing.T) string { return testproc.FreeAddr(t) }

// shortDir is a fresh directory with a short path, for unix sockets (108
// bytes at most; t.TempDir's paths can be longer).
func shortDir(t *testing.T, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// process is a program run for one test. Its output is kept and, when the
// test fails, the end of it goes to the test log.
type process struct {
	name string
	cmd  *exec.Cmd
	out  logSink
	done chan struct{}
	err  error
}

// Output is everything the process printed so far.
func (p *process) Output() string { return p.out.String() }

// Exited says whether the process has ended, and how.
func (p *process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// start runs bin until the test ends; it is interrupted (SIGINT, then
// killed after 10 s) by t.Cleanup.
func start(t *testing.T, name, bin string, args ...string) *process {
	t.Helper()
	p := &process{name: name, done: make(chan struct{})}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.out
	p.cmd.WaitDelay = 10 * time.Second
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.cmd.Process.Signal(os.Interrupt)
		select {
		case <-p.done:
		case <-time.After(10 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		if t.Failed() {
			t.Logf("--- %s output (last 60 lines) ---\n%s", name, tail(p.Output(), 60))
		}
	})
	return p
}

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// eventually polls cond every 200 ms until it returns "" or the timeout
// passes, then fails with its last complaint. Processes that exited are
// reported at once: waiting on them is pointless.
func eventually(t *testing.T, timeout time.Duration, what string, procs []*process, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		for _, p := range procs {
			if done, err := p.Exited(); done {
				t.Fatalf("%s: %s exited (%v) while waiting; last: %s\n%s", what, p.name, err, msg, tail(p.Output(), 40))
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %s", what, timeout, msg)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// getJSON fetches url into v.
func getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// writeFile writes a file for a process to read.
func writeFile(t *testing.T, path, content string) string {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
