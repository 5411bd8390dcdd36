package exporter

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"syscall"

	"github.com/gpuslice/gpuslice/internal/attribution"
	"github.com/gpuslice/gpuslice/internal/cgroup"
	"github.com/gpuslice/gpuslice/internal/gpu"
)

// procReader resolves GPU process PIDs to pods through /proc.
//
// A process's cgroup is set when the runtime starts it, before it can open
// a GPU, and a container's processes are not moved, so what a PID resolved
// to holds for as long as the same process has that PID. The reader keeps
// it keyed by (PID, process start time): a scrape reads the start time (one
// small read) instead of the cgroup file (a read and a parse), and a PID
// that the kernel gave to a new process has a new start time, so it is read
// afresh. A tree without stat files (test fixtures) is read in full each
// time.
type procReader struct {
	root string
	log  *slog.Logger
	// warned remembers PIDs whose cgroup file was malformed, so a garbage
	// file is logged once, not at every scrape.
	warned map[int]bool
	// known holds the PIDs of the last scrape whose start time was read.
	known map[int]procEntry
	buf   []byte // stat file contents, reused
}

// procEntry is what the process that started at start resolved to. Only
// answers that a process keeps for life are cached: in a pod (ref), or not
// in any pod.
type procEntry struct {
	start uint64
	inPod bool
	ref   attribution.ProcessRef
}

func newProcReader(root string, log *slog.Logger) *procReader {
	return &procReader{root: root, log: log, warned: map[int]bool{}, known: map[int]procEntry{}, buf: make([]byte, 1024)}
}

// read returns the pod of every PID in devs, and the PIDs that vanished.
// The error is set when /proc itself cannot be read, or a cgroup file could
// not be read for a reason other than the process exiting.
func (p *procReader) read(devs []gpu.Device) (map[int]attribution.ProcessRef, map[int]bool, error) {
	refs := map[int]attribution.ProcessRef{}
	gone := map[int]bool{}
	if _, err := os.Stat(p.root); err != nil {
		clear(p.known)
		return refs, gone, fmt.Errorf("procfs %s: %w", p.root, err)
	}
	var firstErr error
	seen := map[int]bool{}
	for _, d := range devs {
		for _, proc := range d.Processes {
			if seen[proc.PID] {
				continue
			}
			seen[proc.PID] = true
			start, startErr := p.startTime(proc.PID)
			if e, ok := p.known[proc.PID]; ok && startErr == nil && e.start == start {
				if e.inPod {
					refs[proc.PID] = e.ref
				}
				continue
			}
			delete(p.known, proc.PID)
			ref, err := cgroup.ReadPID(p.root, proc.PID)
			switch {
			case err == nil:
				r := attribution.ProcessRef{PodUID: ref.PodUID, ContainerID: ref.ContainerID}
				refs[proc.PID] = r
				delete(p.warned, proc.PID)
				if startErr == nil {
					p.known[proc.PID] = procEntry{start: start, inPod: true, ref: r}
				}
			case errors.Is(err, cgroup.ErrProcessGone):
				gone[proc.PID] = true
			case errors.Is(err, cgroup.ErrNotInPod):
				// A host process: unattributed.
				if startErr == nil {
					p.known[proc.PID] = procEntry{start: start}
				}
			case errors.Is(err, cgroup.ErrMalformed):
				if !p.warned[proc.PID] {
					p.warned[proc.PID] = true
					p.log.Warn("unreadable cgroup file; process counted as unattributed", "pid", proc.PID, "err", err)
				}
			default:
				if firstErr == nil {
					firstErr = err
				}
			}
		}
	}
	for pid := range p.warned {
		if !seen[pid] {
			delete(p.warned, pid)
		}
	}
	for pid := range p.known {
		if !seen[pid] {
			delete(p.known, pid)
		}
	}
	return refs, gone, firstErr
}

// startTime reads the start time of the process that has pid now. It uses
// plain system calls into a reused buffer: this runs for every GPU process
// at every scrape, and os.ReadFile costs twice the calls and an allocation.
func (p *procReader) startTime(pid int) (uint64, error) {
	path := p.root + "/" + strconv.Itoa(pid) + "/stat"
	fd, err := syscall.Open(path, syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		return 0, err
	}
	defer syscall.Close(fd)
	n := 0
	for {
		m, err := syscall.Read(fd, p.buf[n:])
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if m == 0 {
			break
		}
		n += m
		if n == len(p.buf) {
			p.buf = append(p.buf, make([]byte, len(p.buf))...)
		}
	}
	return parseStartTime(p.buf[:n])
}

// parseStartTime returns field 22 of a /proc/<pid>/stat line, the time the
// process started in clock ticks after boot. The command name (field 2)
// may hold spaces and parentheses, so fields are counted after its last ')'.
func parseStartTime(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, errors.New("stat: no command name")
	}
	rest := stat[i+1:]
	for field := 3; ; field++ {
		rest = bytes.TrimLeft(rest, " ")
		end := bytes.IndexAny(rest, " \n")
		if end < 0 {
			end = len(rest)
		}
		if end == 0 {
			return 0, fmt.Errorf("stat: %d fields, want at least 22", field-1)
		}
		if field == 22 {
			v, err := strconv.ParseUint(string(rest[:end]), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("stat: start time: %w", err)
			}
			return v, nil
		}
		rest = rest[end:]
	}
}
