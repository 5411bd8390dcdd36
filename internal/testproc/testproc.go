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
