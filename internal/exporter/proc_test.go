package exporter

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"testing"

	"github.com/gpuslice/gpuslice/internal/gpu"
)

func TestParseStartTime(t *testing.T) {
	for _, tc := range []struct {
		name, stat string
		want       uint64
		wantErr    bool
	}{
		{name: "kernel line", stat: "4242 (python3) S 1 4242 4242 0 -1 4194560 1 0 0 0 5 3 0 0 20 0 12 0 987654 123 45 18446744073709551615\n", want: 987654},
		{name: "command with spaces and parentheses", stat: "7 (a) b) (c) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 42 0 0\n", want: 42},
		{name: "no newline", stat: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 43", want: 43},
		{name: "truncated", stat: "7 (x) R 1 7 7 0 -1 0 0\n", wantErr: true},
		{name: "no command", stat: "7 x R 1\n", wantErr: true},
		{name: "not a number", stat: "7 (x) R 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 soon 0\n", wantErr: true},
		{name: "empty", stat: "", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStartTime([]byte(tc.stat))
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("parseStartTime(%q) = %d, %v; want %d, error %v", tc.stat, got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// TestProcReaderCache: a PID is resolved again when its start time changes
// (the kernel gave the PID to another process), not otherwise; a tree
// without stat files is read in full every time.
func TestProcReaderCache(t *testing.T) {
	const pid = 4242
	root := t.TempDir()
	dir := filepath.Join(root, strconv.Itoa(pid))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	inPod := func(uid string) string {
		return "0::/kubepods.slice/kubepods-pod" + uid + ".slice/cri-containerd-" + fmt.Sprintf("%064d", 1) + ".scope\n"
	}
	stat := func(start int) string {
		return fmt.Sprintf("%d (python3) S 1 %d %d 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, pid, pid, start)
	}
	const uidA, uidB = "0a1b2c3d_0000_4000_8000_00000000000a", "0a1b2c3d_0000_4000_8000_00000000000b"
	devs := []gpu.Device{{UUID: "GPU-x", Processes: []gpu.Process{{PID: pid}}}}
	p := newProcReader(root, slog.New(slog.NewTextHandler(io.Discard, nil)))
	podOf := func() string {
		t.Helper()
		refs, gone, err := p.read(devs)
		if err != nil || len(gone) != 0 {
			t.Fatalf("read: %v, gone %v", err, gone)
		}
		return refs[pid].PodUID
	}
	steps := []struct {
		name         string
		cgroup, stat string
		wantPod      string
		removeStat   bool
	}{
		{name: "first read", cgroup: inPod(uidA), stat: stat(100), wantPod: "0a1b2c3d-0000-4000-8000-00000000000a"},
		// Same process: the cgroup file is not read again (were it read,
		// this pod would show).
		{name: "same start time is cached", cgroup: inPod(uidB), wantPod: "0a1b2c3d-0000-4000-8000-00000000000a"},
		{name: "PID reused", stat: stat(200), wantPod: "0a1b2c3d-0000-4000-8000-00000000000b"},
		{name: "reused for a host process", cgroup: "0::/system.slice/ollama.service\n", stat: stat(300), wantPod: ""},
		{name: "no stat file: read every time", cgroup: inPod(uidA), removeStat: true, wantPod: "0a1b2c3d-0000-4000-8000-00000000000a"},
		{name: "no stat file, cgroup changed", cgroup: inPod(uidB), wantPod: "0a1b2c3d-0000-4000-8000-00000000000b"},
	}
	for _, s := range steps {
		if s.cgroup != "" {
			write("cgroup", s.cgroup)
		}
		if s.stat != "" {
			write("stat", s.stat)
		}
		if s.removeStat {
			if err := os.Remove(filepath.Join(dir, "stat")); err != nil {
				t.Fatal(err)
			}
		}
		if got := podOf(); got != s.wantPod {
			t.Fatalf("%s: pod %q, want %q", s.name, got, s.wantPod)
		}
	}
	// A process that exited is gone, and forgotten.
	write("stat", stat(400))
	podOf()
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	refs, gone, err := p.read(devs)
	if err != nil || !gone[pid] || len(refs) != 0 {
		t.Fatalf("exited process: refs %v, gone %v, err %v", refs, gone, err)
	}
	if len(p.known) != 0 {
		t.Fatalf("exited process still cached: %v", p.known)
	}
}

// TestProcReaderRealProc checks what the cache relies on against the
// kernel: a held pidfd (or /proc/<pid>/stat) tells once its process exits,
// so an exited process is reported gone, not served from the cache, and
// its descriptor is closed.
func TestProcReaderRealProc(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Skip("no /proc here")
	}
	fds := func() int {
		t.Helper()
		ents, err := os.ReadDir("/proc/self/fd")
		if err != nil {
			t.Fatal(err)
		}
		return len(ents)
	}
	before := fds()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skip("cannot start a process:", err)
	}
	pid := cmd.Process.Pid
	devs := []gpu.Device{{UUID: "GPU-x", Processes: []gpu.Process{{PID: pid}}}}
	p := newProcReader("/proc", slog.New(slog.NewTextHandler(io.Discard, nil)))
	for i := 0; i < 2; i++ {
		if _, gone, err := p.read(devs); err != nil || gone[pid] {
			t.Fatalf("running process: gone %v, err %v", gone, err)
		}
		if p.known[pid] == nil || !p.known[pid].resolved {
			t.Fatalf("read %d: running process not cached: %+v", i, p.known[pid])
		}
		// In its own /proc the reader holds a pidfd, where the kernel
		// has them.
		if runtime.GOOS == "linux" && !p.known[pid].pidfd && !p.noPidfd {
			t.Fatalf("read %d: the process is held by its stat file, not a pidfd", i)
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	if _, gone, err := p.read(devs); err != nil || !gone[pid] {
		t.Fatalf("exited process: gone %v, err %v", gone, err)
	}
	if len(p.known) != 0 || fds() != before {
		t.Fatalf("exited process still held: %v; %d descriptors open, %d before", p.known, fds(), before)
	}
}

// TestProcReaderHoldsAtMost: past its limit of open stat files the reader
// reads start times by path, with the same answers, and it closes every
// file it forgets.
func TestProcReaderHoldsAtMost(t *testing.T) {
	root := t.TempDir()
	pids := []int{101, 102, 103}
	setProc := func(pid, start int, uid string) {
		t.Helper()
		dir := filepath.Join(root, strconv.Itoa(pid))
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		cg := "0::/kubepods.slice/kubepods-pod" + uid + ".slice/cri-containerd-" + fmt.Sprintf("%064d", pid) + ".scope\n"
		st := fmt.Sprintf("%d (python3) S 1 %d %d 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 %d 0 0\n", pid, pid, pid, start)
		if err := os.WriteFile(filepath.Join(dir, "cgroup"), []byte(cg), 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "stat"), []byte(st), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	const uidA, uidB = "0a1b2c3d_0000_4000_8000_00000000000a", "0a1b2c3d_0000_4000_8000_00000000000b"
	for _, pid := range pids {
		setProc(pid, 100, uidA)
	}
	var devs []gpu.Device
	for _, pid := range pids {
		devs = append(devs, gpu.Device{UUID: "GPU-x", Processes: []gpu.Process{{PID: pid}}})
	}
	p := newProcReader(root, slog.New(slog.NewTextHandler(io.Discard, nil)))
	p.maxHeld = 1
	check := func(want string) {
		t.Helper()
		refs, _, err := p.read(devs)
		if err != nil {
			t.Fatal(err)
		}
		for _, pid := range pids {
			if refs[pid].PodUID != want {
				t.Fatalf("pid %d in pod %q, want %q", pid, refs[pid].PodUID, want)
			}
		}
		held := 0
		for _, e := range p.known {
			if e.fd >= 0 {
				held++
			}
		}
		if held != p.held || held > 1 || len(p.known) != len(pids) {
			t.Fatalf("%d files held (counted %d), %d PIDs known", held, p.held, len(p.known))
		}
	}
	check("0a1b2c3d-0000-4000-8000-00000000000a")
	check("0a1b2c3d-0000-4000-8000-00000000000a")
	for _, pid := range pids { // every PID given to a new process
		setProc(pid, 200, uidB)
	}
	check("0a1b2c3d-0000-4000-8000-00000000000b")
	p.forget(nil)
	if p.held != 0 || len(p.known) != 0 {
		t.Fatalf("after forget: %d held, %d known", p.held, len(p.known))
	}
}

// BenchmarkProcReadRealProc is one scrape's /proc reading of 128 running
// processes in this machine's own /proc, followed by pidfds and by stat
// files.
func BenchmarkProcReadRealProc(b *testing.B) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		b.Skip("no /proc here")
	}
	var devs []gpu.Device
	dev := gpu.Device{UUID: "GPU-x"}
	for range 128 {
		cmd := exec.Command("sleep", "600")
		if err := cmd.Start(); err != nil {
			b.Skip("cannot start processes:", err)
		}
		b.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		dev.Processes = append(dev.Processes, gpu.Process{PID: cmd.Process.Pid})
	}
	devs = append(devs, dev)
	for _, mode := range []string{"pidfd", "stat"} {
		b.Run(mode, func(b *testing.B) {
			p := newProcReader("/proc", slog.New(slog.DiscardHandler))
			p.noPidfd = mode == "stat"
			b.Cleanup(func() { p.forget(nil) })
			if _, _, err := p.read(devs); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, gone, err := p.read(devs); err != nil || len(gone) != 0 {
					b.Fatal(gone, err)
				}
			}
		})
	}
}
