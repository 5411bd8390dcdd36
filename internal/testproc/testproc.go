// Package testproc holds what tests that run gpuslice's programs as real
// processes share: building a command of this module once, free loopback
// addresses, and polling for asynchronous outcomes with a deadline instead
// of sleeping.
package testproc

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

var (
	buildMu sync.Mutex
	built   = map[string]string{}
)

// Build builds a command of this module (e.g. "cmd/exporter") once per test
// binary and returns its path, under the repository's git-ignored
// .cache/testbin (reused and overwritten, never piling up in /tmp). cgo is
// on for go-nvml.
func Build(t testing.TB, pkg string) string {
	t.Helper()
	return build(t, pkg, "gpuslice-"+filepath.Base(pkg), "CGO_CFLAGS=-Wno-deprecated-declarations")
}

// BuildStatic is Build without cgo: a static binary that runs in a container
// image holding nothing else (the real test node's workloads).
func BuildStatic(t testing.TB, pkg string) string {
	t.Helper()
	return build(t, pkg, "static-"+filepath.Base(pkg), "CGO_ENABLED=0")
}

func build(t testing.TB, pkg, name string, env ...string) string {
	t.Helper()
	buildMu.Lock()
	defer buildMu.Unlock()
	if p, ok := built[name]; ok {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..", ".cache", "testbin")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, name)
	// Several test binaries may build the same command at once: each
	// builds its own file and renames it into place.
	tmp := fmt.Sprintf("%s.%d.tmp", out, os.Getpid())
	cmd := exec.Command("go", "build", "-o", tmp, "github.com/gpuslice/gpuslice/"+pkg)
	cmd.Env = append(os.Environ(), env...)
	if b, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		t.Fatalf("building %s: %v\n%s", pkg, err, b)
	}
	if err := os.Rename(tmp, out); err != nil {
		t.Fatal(err)
	}
	built[name] = out
	return out
}

// FreeAddr returns a loopback host:port that was free a moment ago.
func FreeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// FreePort is FreeAddr's port.
func FreePort(t testing.TB) int {
	t.Helper()
	addr, err := net.ResolveTCPAddr("tcp", FreeAddr(t))
	if err != nil {
		t.Fatal(err)
	}
	return addr.Port
}

// Eventually calls cond every interval until it returns "" or timeout
// passes, then fails the test with cond's last complaint.
func Eventually(t testing.TB, timeout, interval time.Duration, cond func() string) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		msg := cond()
		if msg == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %s", timeout, msg)
		}
		time.Sleep(interval)
	}
}

// Output collects a process's stdout and stderr, written from the process's
// copying goroutines and read by the test, so it is locked.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write implements io.Writer.
func (o *Output) Write(b []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(b)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Process is a program run for one test. Its output is kept and, when the
// test fails, the end of it goes to the test log.
type Process struct {
	Name string
	Cmd  *exec.Cmd
	out  Output
	done chan struct{}
	err  error
}

// Output is everything the process printed so far.
func (p *Process) Output() string { return p.out.String() }

// Exited says whether the process has ended, and how.
func (p *Process) Exited() (bool, error) {
	select {
	case <-p.done:
		return true, p.err
	default:
		return false, nil
	}
}

// Stop interrupts the process (SIGINT, killed after 10 s) and waits for it.
func (p *Process) Stop() error {
	_ = p.Cmd.Process.Signal(os.Interrupt)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.Cmd.Process.Kill()
		<-p.done
	}
	return p.err
}

// Start runs bin with args and extra environment (added to this process's)
// until the test ends or Stop; t.Cleanup stops it and, when the test failed,
// logs the end of its output.
func Start(t testing.TB, name string, env []string, bin string, args ...string) *Process {
	t.Helper()
	p := &Process{Name: name, done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	p.Cmd.Env = append(os.Environ(), env...)
	p.Cmd.Stdout, p.Cmd.Stderr = &p.out, &p.out
	p.Cmd.WaitDelay = 10 * time.Second
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("starting %s: %v", name, err)
	}
	go func() {
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() {
		_ = p.Stop()
		if t.Failed() {
			t.Logf("--- %s output (last 60 lines) ---\n%s", name, Tail(p.Output(), 60))
		}
	})
	return p
}

// Tail is the last n lines of s.
func Tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

var (
	hackMu  sync.Mutex
	hackOut = map[string]string{}
)

// Hack runs hack/<script> (a build script that builds what is missing or
// stale, waits for a build of the same thing in progress, and prints the
// path it made as its last line) once per test binary and returns that
// path. The test fails, naming the script and its output, when it cannot:
// the suite must never pass without the parts it tests against.
func Hack(t testing.TB, script string) string {
	t.Helper()
	hackMu.Lock()
	defer hackMu.Unlock()
	if p, ok := hackOut[script]; ok {
		return p
	}
	_, file, _, _ := runtime.Caller(0)
	path := filepath.Join(filepath.Dir(file), "..", "..", "hack", script)
	cmd := exec.Command("bash", path)
	cmd.Env = append(os.Environ(), "CGO_CFLAGS=-Wno-deprecated-declarations")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("hack/%s failed (run `make test-bins` and read its output): %v\n%s", script, err, Tail(stderr.String(), 30))
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	out := lines[len(lines)-1]
	if _, err := os.Stat(out); err != nil {
		t.Fatalf("hack/%s printed %q, which does not exist: %v", script, out, err)
	}
	hackOut[script] = out
	return out
}
