//go:build linux

package oom

import (
	"errors"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// dirWatcher tells which container log directories changed since the last
// Scan, through inotify, so that a Scan reads only those: reading the
// directory and log files of every watched container cost two stat calls
// each per Scan, which the exporter makes at every scrape and every
// --oom.scan-interval, while most containers log nothing new.
//
// A directory watch reports what happens to the files in it (writes,
// truncation, creation, renames: rotation, removal, permission changes) and
// to the directory itself. What cannot be watched (a directory not created
// yet, inotify out of instances or watches) is read at every Scan, as
// before; a full pass every fullPassInterval bounds what any missed event
// could delay.
type dirWatcher struct {
	f    *os.File // the inotify instance; closed with it when dropped
	byWD map[int32]*containerState
	buf  []byte
	root int32 // the watch of PodLogsDir itself, 0 for none
	// rootChanged: PodLogsDir's permissions, or the directory itself,
	// changed since the last check.
	rootChanged bool
}

const (
	dirEvents = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO |
		unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
	rootEvents = unix.IN_ATTRIB | unix.IN_DELETE_SELF | unix.IN_MOVE_SELF | unix.IN_ONLYDIR
)

// newDirWatcher returns a watcher of root, or nil where inotify is not to
// be had.
func newDirWatcher(root string) *dirWatcher {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil
	}
	w := &dirWatcher{f: os.NewFile(uintptr(fd), "inotify"), byWD: map[int32]*containerState{}, buf: make([]byte, 16<<10), rootChanged: true}
	w.root = w.add(root, rootEvents)
	return w
}

func (w *dirWatcher) add(dir string, mask uint32) int32 {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return 0
	}
	var wd int
	if err := rc.Control(func(fd uintptr) { wd, err = unix.InotifyAddWatch(int(fd), dir, mask) }); err != nil || wd <= 0 {
		return 0
	}
	return int32(wd) //nolint:gosec // inotify descriptors are int32 in its events
}

// watch watches cs's log directory dir unless it is watched already; false
// when it cannot be (it is then read at every Scan).
func (w *dirWatcher) watch(cs *containerState, dir string) bool {
	if cs.wd != 0 {
		return true
	}
	wd := w.add(dir, dirEvents)
	if wd == 0 || wd == w.root || w.byWD[wd] != nil {
		return false // not there yet, or a directory watched already
	}
	cs.wd = wd
	w.byWD[wd] = cs
	return true
}

// unwatch stops watching cs's directory.
func (w *dirWatcher) unwatch(cs *containerState) {
	if cs.wd == 0 {
		return
	}
	if rc, err := w.f.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) { _, _ = unix.InotifyRmWatch(int(fd), uint32(cs.wd)) })
	}
	delete(w.byWD, cs.wd)
	cs.wd = 0
}

// drain reads the events that came since the last drain and marks the
// containers they concern to be read. overflow: events were lost, so
// everything must be read.
func (w *dirWatcher) drain() (overflow bool) {
	rc, err := w.f.SyscallConn()
	if err != nil {
		return true
	}
	for {
		var n int
		var rerr error
		if err := rc.Read(func(fd uintptr) bool {
			n, rerr = unix.Read(int(fd), w.buf)
			return true // never wait: an empty queue is EAGAIN
		}); err != nil {
			return true
		}
		if errors.Is(rerr, unix.EAGAIN) {
			return overflow
		}
		if rerr != nil || n <= 0 {
			return true
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&w.buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				overflow = true
			case ev.Wd == w.root:
				w.rootChanged = true
				if ev.Mask&unix.IN_IGNORED != 0 {
					w.root = 0
				}
			default:
				cs := w.byWD[ev.Wd]
				if cs == nil {
					continue // a watch removed since
				}
				cs.dirty = true
				if ev.Mask&unix.IN_IGNORED != 0 { // the directory is gone
					delete(w.byWD, ev.Wd)
					cs.wd = 0
				}
			}
		}
	}
}

// rootKnown reports whether PodLogsDir is known to be as it was at the
// last check: watched, with no event since. Otherwise the caller checks it
// again and calls rootChecked.
func (w *dirWatcher) rootKnown() bool { return w.root != 0 && !w.rootChanged }

// rootChecked starts a new period after a successful check of root,
// watching it again if its watch was lost.
func (w *dirWatcher) rootChecked(root string) {
	w.rootChanged = false
	if w.root == 0 {
		w.root = w.add(root, rootEvents)
	}
}

func (w *dirWatcher) close() {
	_ = w.f.Close()
	for _, cs := range w.byWD {
		cs.wd = 0
	}
}
