package exporter

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
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
// it with a descriptor that stays bound to the process:
//
//   - In this process's own /proc (hostPID), a pidfd: one poll of all of
//     them tells which processes exited since the last scrape, where
//     reading each one's /proc/<pid>/stat cost 3.4 µs a process (1.7 ms a
//     scrape for 512 GPU processes), the poll 50 µs in all.
//   - Elsewhere, or without pidfd_open, the process's stat file, keyed by
//     (PID, process start time): a scrape reads the start time again
//     through that descriptor (one system call instead of an open, a read,
//     a close, and a cgroup file's read and parse). A descriptor of
//     /proc/<pid>/stat stays bound to its process: once the process exits,
//     reading it fails with ESRCH, even after the PID is reused.
//
// An exited process's PID is read afresh by path. A tree without stat
// files (test fixtures) is read in full each time.
type procReader struct {
	root string
	log  *slog.Logger
	// warned remembers PIDs whose cgroup file was malformed, so a garbage
	// file is logged once, not at every scrape.
	warned map[int]bool
	// known holds the PIDs of the last scrape whose start time was read.
	known map[int]*procEntry
	// held counts the entries whose stat file is kept open, at most
	// maxHeld: one descriptor per GPU process must not exhaust the
	// process's limit on a node with thousands of them; the rest are read
	// by path.
	held, maxHeld int
	buf           []byte // stat file contents, reused
	// isProc: root is a real procfs, where a held stat file of an exited
	// process fails to read; other trees (fixtures) need a link count check.
	isProc bool
	// pidfds: root is this process's own procfs, and held processes are
	// pidfds; noPidfd: pidfd_open failed for good.
	pidfds, noPidfd bool
	poller          pidfdPoller
	// exited holds the PIDs whose pidfd said they exited, in this read.
	exited            map[int]bool
	pollPIDs, pollFDs []int
	pollExited        []bool
}

// procSuperMagic is procfs's f_type (linux/magic.h).
const procSuperMagic = 0x9fa0

// procEntry is a process's stat file (fd, or -1 when it is read by path)
// and what the process that started at start resolved to. Only answers that a process keeps for life are kept:
// in a pod (ref), or not in any pod; after other answers resolved is false
// and the cgroup file is read again.
type procEntry struct {
	fd       int
	pidfd    bool // fd is a pidfd, not a stat file; start is unset
	start    uint64
	resolved bool
	inPod    bool
	ref      attribution.ProcessRef
	// programRead: is holds what program's test said of the process's
	// command line.
	programRead, is bool
}

// program reports what test says of pid's command line (the exporter asks
// one test: is it the MPS server), read once for the
// life of the process where the reader follows it (a process followed by
// this scrape's read; others are read each time). An unreadable command
// line (the process exited) is false and not kept.
func (p *procReader) program(pid int, test func(cmdline []byte) bool) bool {
	e := p.known[pid]
	if e != nil && e.programRead {
		return e.is
	}
	cmdline, err := os.ReadFile(filepath.Join(p.root, strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return false
	}
	is := test(cmdline)
	if e != nil {
		e.programRead, e.is = true, is
	}
	return is
}

func newProcReader(root string, log *slog.Logger) *procReader {
	return &procReader{root: root, log: log, warned: map[int]bool{}, known: map[int]*procEntry{},
		maxHeld: maxHeldFiles(), buf: make([]byte, 1024), exited: map[int]bool{}}
}

// maxHeldFiles is how many stat files a reader keeps open: a quarter of
// the open file limit (which Go raises to the hard limit at start), at most
// 4096, leaving the rest to sockets, logs and the other sources.
func maxHeldFiles() int {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0
	}
	return int(min(lim.Cur/4, 4096))
}

// read returns the pod of every PID in devs, and the PIDs that vanished.
// The error is set when /proc itself cannot be read, or a cgroup file could
// not be read for a reason other than the process exiting.
func (p *procReader) read(devs []gpu.Device) (map[int]attribution.ProcessRef, map[int]bool, error) {
	refs := map[int]attribution.ProcessRef{}
	gone := map[int]bool{}
	var fs syscall.Statfs_t
	if err := syscall.Statfs(p.root, &fs); err != nil {
		p.forget(nil)
		return refs, gone, fmt.Errorf("procfs %s: %w", p.root, &os.PathError{Op: "statfs", Path: p.root, Err: err})
	}
	p.isProc = fs.Type == procSuperMagic
	p.pidfds = p.isProc && !p.noPidfd && ownProcfs(p.root)
	p.pollPidfds()
	var firstErr error
	seen := map[int]bool{}
	for _, d := range devs {
		for _, proc := range d.Processes {
			if seen[proc.PID] {
				continue
			}
			seen[proc.PID] = true
			if proc.PID <= 0 {
				// No process has it; a driver that cannot put a process in
				// this PID namespace may list one so. Its memory counts as
				// unattributed: one such entry must not fail the reading
				// of every other process.
				if !p.warned[proc.PID] {
					p.warned[proc.PID] = true
					p.log.Warn("GPU process listed without a valid PID; counted as unattributed", "pid", proc.PID, "gpu", d.UUID)
				}
				continue
			}
			e := p.entry(proc.PID)
			if e != nil && e.resolved {
				if e.inPod {
					refs[proc.PID] = e.ref
				}
				continue
			}
			ref, err := cgroup.ReadPID(p.root, proc.PID)
			switch {
			case err == nil:
				r := attribution.ProcessRef{PodUID: ref.PodUID, ContainerID: ref.ContainerID}
				refs[proc.PID] = r
				delete(p.warned, proc.PID)
				if e != nil {
					e.resolved, e.inPod, e.ref = true, true, r
				}
			case errors.Is(err, cgroup.ErrProcessGone):
				gone[proc.PID] = true
			case errors.Is(err, cgroup.ErrNotInPod):
				// A host process: unattributed.
				if e != nil {
					e.resolved = true
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
	p.forget(seen)
	return refs, gone, firstErr
}

// pollPidfds finds which processes held by a pidfd exited.
func (p *procReader) pollPidfds() {
	clear(p.exited)
	if !p.pidfds {
		return
	}
	p.pollPIDs, p.pollFDs = p.pollPIDs[:0], p.pollFDs[:0]
	for pid, e := range p.known {
		if e.pidfd {
			p.pollPIDs = append(p.pollPIDs, pid)
			p.pollFDs = append(p.pollFDs, e.fd)
		}
	}
	p.pollExited = slices.Grow(p.pollExited[:0], len(p.pollFDs))[:len(p.pollFDs)]
	err := p.poller.exited(p.pollFDs, p.pollExited)
	for i, pid := range p.pollPIDs {
		if err != nil || p.pollExited[i] {
			p.exited[pid] = true
		}
	}
}

// entry returns the descriptor held for the process that has pid now, with
// what it resolved to if it is the process read before; nil when the
// process cannot be followed (it exited, or its start time cannot be
// read).
func (p *procReader) entry(pid int) *procEntry {
	if p.pidfds {
		if e, ok := p.pidfdEntry(pid); ok {
			return e
		}
	}
	return p.statEntry(pid)
}

// pidfdEntry follows pid by a pidfd. ok is false where it leaves pid to
// statEntry: no room for another descriptor, pid held by its stat file,
// or no pidfd to be had for it.
func (p *procReader) pidfdEntry(pid int) (*procEntry, bool) {
	e := p.known[pid]
	if e != nil && e.pidfd {
		if !p.exited[pid] {
			return e, true
		}
		p.drop(pid)
		e = nil
	}
	if e != nil || p.held >= p.maxHeld {
		return nil, false
	}
	fd, err := pidfdOpen(pid)
	switch {
	case errors.Is(err, syscall.ESRCH):
		return nil, true // exited; reading its cgroup says so
	case errors.Is(err, errNoPidfd):
		p.pidfds, p.noPidfd = false, true
		return nil, false
	case err != nil: // not a process leader, say
		return nil, false
	}
	e = &procEntry{fd: fd, pidfd: true}
	p.held++
	p.known[pid] = e
	return e, true
}

// statEntry returns the open stat file of the process that has pid now,
// with what it resolved to if it is the process read before; nil when its
// start time cannot be read.
func (p *procReader) statEntry(pid int) *procEntry {
	e := p.known[pid]
	if e != nil && e.fd >= 0 && !e.pidfd {
		if start, err := p.startTime(e.fd); err == nil && start == e.start {
			return e
		}
	}
	fd, err := syscall.Open(p.root+"/"+strconv.Itoa(pid)+"/stat", syscall.O_RDONLY|syscall.O_CLOEXEC, 0)
	if err != nil {
		p.drop(pid)
		return nil
	}
	start, err := p.startTime(fd)
	switch {
	case err != nil:
		syscall.Close(fd)
		p.drop(pid)
		return nil
	case e != nil && e.fd < 0 && start == e.start: // the same process, read by path
		if p.held < p.maxHeld {
			e.fd = fd
			p.held++
		} else {
			syscall.Close(fd)
		}
		return e
	}
	p.drop(pid)
	e = &procEntry{fd: fd, start: start}
	if p.held < p.maxHeld {
		p.held++
	} else {
		syscall.Close(fd)
		e.fd = -1
	}
	p.known[pid] = e
	return e
}

// drop forgets pid, closing its stat file.
func (p *procReader) drop(pid int) {
	if e := p.known[pid]; e != nil {
		if e.fd >= 0 {
			syscall.Close(e.fd)
			p.held--
		}
		delete(p.known, pid)
	}
}

// forget forgets the PIDs not in keep (all of them for nil).
func (p *procReader) forget(keep map[int]bool) {
	for pid := range p.known {
		if !keep[pid] {
			p.drop(pid)
		}
	}
}

// errUnlinked: the stat file was removed, which only happens in a tree
// standing in for /proc; there it means the process is gone.
var errUnlinked = errors.New("stat file removed")

// startTime reads the start time from an open stat file, with plain
// system calls into a reused buffer: this runs for every GPU process at
// every scrape.
func (p *procReader) startTime(fd int) (uint64, error) {
	for {
		n, err := syscall.Pread(fd, p.buf, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return 0, err
		}
		if n == len(p.buf) { // perhaps cut short: read it again, whole
			p.buf = make([]byte, 2*len(p.buf))
			continue
		}
		start, err := parseStartTime(p.buf[:n])
		if err != nil {
			return 0, err
		}
		if p.isProc {
			return start, nil
		}
		var st syscall.Stat_t
		if err := syscall.Fstat(fd, &st); err != nil {
			return 0, err
		}
		if st.Nlink == 0 {
			return 0, errUnlinked
		}
		return start, nil
	}
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
