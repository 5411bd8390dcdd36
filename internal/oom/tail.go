package oom

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The kubelet's pod log layout:
//
//	<PodLogsDir>/<namespace>_<pod>_<pod uid>/<container>/<N>.log
//
// N is the container's restart count. When the kubelet rotates a log it
// renames N.log to N.log.<YYYYMMDD-hhmmss>, has the runtime reopen N.log
// (a new file, a new inode), and later gzips older rotated files (.gz, never
// read here); when the runtime fails to reopen, it renames the rotated file
// back to N.log, which is then read on from where it was read to
// (containerState.left). Runtimes write the CRI format (see criLine).

type ident struct{ dev, ino uint64 }

var errNotRegular = errors.New("not a regular file")

type fileMark struct {
	id   ident
	size int64
}

// maxLineBytes bounds what is kept of one line while waiting for its end
// (a line without a newline yet, or CRI partials waiting for their F line).
// The runtime cuts lines at 16 KiB, so only unusual plain writers reach it.
const maxLineBytes = 64 << 10

// overlapBytes is what is kept of a joined partial line that outgrew
// maxLineBytes after it was matched, so that a match spanning the cut is
// still seen. A match found twice is one event by the collapse rule, since
// both carry the same log time.
const overlapBytes = 4 << 10

// tailFile is one log file being read.
type tailFile struct {
	path string // "" once rotated away and not located yet
	id   ident
	off  int64
	// carry is the start of a line whose newline has not been read yet;
	// overflow drops the rest of a line longer than maxLineBytes.
	carry    []byte
	overflow bool
}

// stream is the log of one container instance: the file now at N.log and
// the rotated files whose ends have not been read yet. Reading is in order,
// so an older file is finished before a newer one is started.
type stream struct {
	instance int
	path     string
	cur      *tailFile   // nil while N.log is missing
	old      []*tailFile // rotated away, oldest first
	parts    [2]partial  // CRI partial lines being joined, per output stream
	lastErr  string
}

type partial struct {
	active bool
	ts     time.Time
	buf    []byte
	// flushed: matched as it stands since it last grew (flushPartials);
	// counted: a flush counted it, so its end does not count it again.
	flushed, counted bool
	// last is the length of its last P line's text.
	last int
}

// criCutBytes is the length at which containerd cuts a line into P lines
// (its max_container_log_line_size default, 16 KiB): a P line this long
// was cut, not ended.
const criCutBytes = 16 << 10

// scan is the state of one container during one Scan.
type scan struct {
	cs     *containerState
	dir    string
	names  []string // the directory's entries, listed again when stale
	now    time.Time
	events []Event
	// follow reads the lines after an event's message whose kind they
	// tell (Signature.Follow); nil when none is being read. Lines read
	// in a later Scan come too late: the event has been returned.
	follow *following
}

// following is an event of a scan waiting for the lines after its message.
type following struct {
	st    *stream
	event int // index in scan.events
	lineReader
}

func containerDir(root string, c Container) string {
	return filepath.Join(root, c.Namespace+"_"+c.Pod+"_"+c.PodUID, c.Container)
}

// instanceOf parses a current log file name "N.log".
func instanceOf(name string) (int, bool) {
	digits, ok := strings.CutSuffix(name, ".log")
	if !ok || digits == "" || digits[0] == '+' || digits[0] == '-' {
		return 0, false
	}
	n, err := strconv.Atoi(digits)
	return n, err == nil
}

// listing is a container log directory's names as last listed. Listing
// costs three system calls and the names' allocation for every container at
// every scrape, while the directory changes only when a container restarts
// or its log rotates; one stat shows whether it did. A directory's
// modification time moves when an entry is added, removed or renamed, but
// only in steps of the file system's clock, so a change in the same step as
// the listing would leave it as it was: a listing is trusted only when the
// directory had last changed well before it was taken (as git treats
// "racily clean" index entries).
type listing struct {
	list    []string
	id      ident
	modTime time.Time
	at      time.Time // when the listing was started, by the wall clock
}

// racyWindow is how long after a directory last changed a listing of it is
// not trusted to be complete; far above any file system's clock step.
const racyWindow = time.Second

// names lists dir, or returns the last listing while dir is unchanged.
func (l *listing) names(dir string) ([]string, error) {
	fi, err := os.Stat(dir)
	if err != nil {
		*l = listing{}
		return nil, err
	}
	if l.list != nil && identOf(fi) == l.id && l.id != (ident{}) && fi.ModTime().Equal(l.modTime) &&
		l.modTime.Before(l.at.Add(-racyWindow)) {
		return l.list, nil
	}
	// The file system's clock, not the detector's (which tests set).
	at := time.Now()
	names, err := readDirNames(dir)
	if err != nil {
		*l = listing{}
		return nil, err
	}
	if names == nil {
		names = []string{}
	}
	*l = listing{list: names, id: identOf(fi), modTime: fi.ModTime(), at: at}
	return names, nil
}

func readDirNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer f.Close() //nolint:errcheck // read only: nothing to flush
	return f.Readdirnames(-1)
}

// takeBaseline records the size of every log file present now, so that
// history is not read as new, whenever its container is first named.
func (d *Detector) takeBaseline() {
	d.baseline = map[string]fileMark{}
	pods, err := readDirNames(d.root)
	if err != nil {
		d.log.Warn("listing pod log directory", "path", d.root, "err", err)
		return
	}
	for _, pod := range pods {
		podDir := filepath.Join(d.root, pod)
		ctrs, err := readDirNames(podDir)
		if err != nil {
			continue // a stray file, or a pod directory going away
		}
		for _, ctr := range ctrs {
			dir := filepath.Join(podDir, ctr)
			names, err := readDirNames(dir)
			if err != nil {
				continue
			}
			for _, name := range names {
				if _, ok := instanceOf(name); !ok {
					continue
				}
				path := filepath.Join(dir, name)
				if fi, err := os.Stat(path); err == nil && fi.Mode().IsRegular() {
					d.baseline[path] = fileMark{id: identOf(fi), size: fi.Size()}
				}
			}
		}
	}
}

func (d *Detector) scanContainer(cs *containerState, now time.Time, events []Event) []Event {
	if cs.c.PodUID == "" {
		d.logf(cs, "container has no pod UID; its log is not read")
		return events
	}
	dir := containerDir(d.root, cs.c)
	// Watched before it is read, so that what is written after the
	// reading is an event.
	if d.watcher != nil {
		d.watcher.watch(cs, dir)
	}
	cs.dirty = false
	cs.reads++
	names, err := cs.listing.names(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			// Kept as they are: forgetting them would have the files read
			// from the start once the directory can be listed again.
			d.logf(cs, "listing container log directory", "path", dir, "err", err)
			return events
		}
		// Gone (or not there yet): its files are forgotten; the de-duplication
		// state stays until the container is no longer named.
		cs.streams = nil
		return events
	}
	added := false
	for _, name := range names {
		n, ok := instanceOf(name)
		if !ok || slices.ContainsFunc(cs.streams, func(st *stream) bool { return st.instance == n }) {
			continue
		}
		cs.streams = append(cs.streams, d.newStream(filepath.Join(dir, name), n))
		added = true
	}
	if added {
		slices.SortFunc(cs.streams, func(a, b *stream) int { return a.instance - b.instance })
	}
	sc := &scan{cs: cs, dir: dir, names: names, now: now, events: events}
	cs.streams = slices.DeleteFunc(cs.streams, func(st *stream) bool {
		return !d.readStream(sc, st)
	})
	return sc.events
}

// newStream starts following path: where the first Scan saw it end, or from
// the beginning for a file that appeared since. A baseline mark whose inode
// is no longer at path is a file rotated since; readStream finds it. (A
// container named again after it was forgotten gets its streams back from
// its grave instead, with the same handling of rotation.)
func (d *Detector) newStream(path string, n int) *stream {
	st := &stream{instance: n, path: path}
	if m, ok := d.baseline[path]; ok {
		delete(d.baseline, path)
		st.cur = &tailFile{path: path, id: m.id, off: m.size}
	}
	return st
}

// readStream reads what is new in one instance's log, up to maxRead bytes
// from each of its files. It returns false once the stream has no file left.
func (d *Detector) readStream(sc *scan, st *stream) bool {
	fi, err := os.Stat(st.path)
	missing := errors.Is(err, fs.ErrNotExist)
	switch {
	case missing:
		if st.cur != nil {
			sc.cs.leave(st.instance, st.cur)
		}
		st.rotated()
	case err != nil:
		d.logStream(sc, st, "reading log file", "path", st.path, "err", err)
		return true
	case !fi.Mode().IsRegular():
		d.logStream(sc, st, "reading log file", "path", st.path, "err", errNotRegular)
		return true
	case st.cur == nil:
		st.cur = sc.cs.resume(st, identOf(fi))
	case st.cur.id != identOf(fi):
		st.rotated()
		st.cur = sc.cs.resume(st, identOf(fi))
	case fi.Size() == st.cur.off && len(st.old) == 0:
		d.flushPartials(sc, st)
		return true // nothing new: the common case, one stat per file
	}
	relocated := false
	for len(st.old) > 0 {
		tf := st.old[0]
		if tf.path == "" {
			tf.path = d.locate(sc, st, tf.id)
		}
		done := tf.path == ""
		if done {
			d.log.Info("rotated log file not found; the rest of it is skipped",
				"namespace", sc.cs.c.Namespace, "pod", sc.cs.c.Pod, "container", sc.cs.c.Container, "path", st.path)
		} else {
			var gone bool
			done, gone = d.readFile(sc, st, tf)
			if gone {
				// Renamed again (compressed, say): locate it once more, and
				// if that races too, at the next Scan.
				tf.path = ""
				if relocated {
					sc.cs.dirty = true
					return true
				}
				relocated = true
				continue
			}
			if !done {
				return true // read up to the limit; newer files wait for it
			}
		}
		d.endLine(sc, st, tf)
		st.old[0] = nil
		st.old = st.old[1:]
		relocated = false
	}
	if st.cur != nil {
		d.readFile(sc, st, st.cur)
	}
	if len(st.old) > 0 {
		sc.cs.dirty = true // rotated files not finished
	}
	if missing && len(st.old) == 0 {
		d.flushPartials(sc, st) // the stream is dropped
	}
	return !missing
}

// flushPartials matches the CRI partial lines of st that wait for their
// end, each once as it stands, when nothing new came for them: the runtime
// tags a process's last output P when it ends without a newline
// (containerd's redirectLogs), and no F line follows it, ever. A P line the
// runtime cut at its line length (containerd's default 16 KiB) waits for
// the rest of the line, which a slow writer may send minutes later: one
// that long is left to wait, so that the line is matched whole. Matched
// early on its start, a line whose end comes after all is counted once:
// its end is not matched again.
func (d *Detector) flushPartials(sc *scan, st *stream) {
	for i := range st.parts {
		p := &st.parts[i]
		if !p.active || p.flushed || p.last >= criCutBytes {
			continue
		}
		p.flushed = true
		n := len(sc.events)
		d.text(sc, st, p.ts, p.buf)
		p.counted = p.counted || len(sc.events) > n
	}
}

// rotated moves the current file to the files to finish, to be found by
// inode among the rotated siblings.
func (st *stream) rotated() {
	if st.cur != nil {
		st.cur.path = ""
		st.old = append(st.old, st.cur)
		st.cur = nil
	}
}

// leave remembers tf, instance n's file, as it leaves N.log
// (containerState.left).
func (cs *containerState) leave(n int, tf *tailFile) {
	cs.left = append(cs.left, leftFile{n, tf})
	if len(cs.left) > keptInstances {
		cs.left = slices.Delete(cs.left, 0, len(cs.left)-keptInstances)
	}
}

// resume returns the file to read at st's N.log, whose identity is id: a
// file of st that left N.log and came back (still to be finished among
// st.old, or remembered in cs.left), read on from where it was read to;
// any other file from its start.
func (cs *containerState) resume(st *stream, id ident) *tailFile {
	var back *tailFile
	if id != (ident{}) {
		if i := slices.IndexFunc(st.old, func(tf *tailFile) bool { return tf.id == id }); i >= 0 {
			back = st.old[i]
			st.old = slices.Delete(st.old, i, i+1)
		}
		if i := slices.IndexFunc(cs.left, func(l leftFile) bool { return l.n == st.instance && l.tf.id == id }); i >= 0 {
			if back == nil {
				back = cs.left[i].tf
			}
			cs.left = slices.Delete(cs.left, i, i+1)
		}
	}
	if back == nil {
		return &tailFile{path: st.path, id: id}
	}
	back.path = st.path
	return back
}

// locate finds a rotated file by its identity among N.log.<suffix>, listing
// the directory again if the listing of this Scan is older than the rename.
func (d *Detector) locate(sc *scan, st *stream, id ident) string {
	if id == (ident{}) {
		return "" // no inodes on this system: any file would look like it
	}
	prefix := filepath.Base(st.path) + "."
	for attempt := 0; attempt < 2; attempt++ {
		for _, name := range sc.names {
			if !strings.HasPrefix(name, prefix) || strings.HasSuffix(name, ".gz") || strings.HasSuffix(name, ".tmp") {
				continue
			}
			path := filepath.Join(sc.dir, name)
			if fi, err := os.Stat(path); err == nil && identOf(fi) == id {
				return path
			}
		}
		names, err := readDirNames(sc.dir)
		if err != nil {
			return ""
		}
		sc.names = names
	}
	return ""
}

// readFile reads up to maxRead new bytes of tf and feeds its lines. done:
// tf has been read to its end. gone: the path no longer holds tf's inode.
func (d *Detector) readFile(sc *scan, st *stream, tf *tailFile) (done, gone bool) {
	f, err := os.Open(tf.path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return false, true
		}
		d.logStream(sc, st, "reading log file", "path", tf.path, "err", err)
		// A rotated file that cannot be read would hold back the current
		// one for ever; give it up.
		return tf != st.cur, false
	}
	defer f.Close() //nolint:errcheck // read only: nothing to flush
	fi, err := f.Stat()
	if err != nil {
		d.logStream(sc, st, "reading log file", "path", tf.path, "err", err)
		return tf != st.cur, false
	}
	if identOf(fi) != tf.id {
		// Rotated between the stat and the open; the next Scan sees it.
		sc.cs.dirty = true
		return false, tf != st.cur
	}
	size := fi.Size()
	// Truncation shows only as a file smaller than what was read; one
	// truncated and written past that point between two Scans is read on
	// from the old offset, as any offset-based reader would.
	if size < tf.off {
		d.log.Info("log file truncated; reading it again from the start",
			"namespace", sc.cs.c.Namespace, "pod", sc.cs.c.Pod, "container", sc.cs.c.Container,
			"path", tf.path, "size", size, "offset", tf.off)
		tf.off, tf.carry, tf.overflow = 0, tf.carry[:0], false
		st.parts = [2]partial{}
	}
	n := min(size-tf.off, d.maxRead)
	if n <= 0 {
		return true, false
	}
	if int64(cap(d.buf)) < n {
		d.buf = make([]byte, n)
	}
	buf := d.buf[:n]
	got, err := f.ReadAt(buf, tf.off)
	if got == 0 && err != nil && !errors.Is(err, io.EOF) {
		d.logStream(sc, st, "reading log file", "path", tf.path, "err", err)
		return tf != st.cur, false
	}
	st.lastErr = ""
	tf.off += int64(got)
	sc.cs.dirty = true // read again next time: there may be more
	d.feed(sc, st, tf, buf[:got])
	return tf.off >= size, false
}

func (d *Detector) logStream(sc *scan, st *stream, msg string, args ...any) {
	sc.cs.dirty = true // a problem: try again at the next Scan
	key := msg + ": " + args[len(args)-1].(error).Error()
	if key == st.lastErr {
		return
	}
	st.lastErr = key
	d.log.Warn(msg, append([]any{"namespace", sc.cs.c.Namespace, "pod", sc.cs.c.Pod, "container", sc.cs.c.Container}, args...)...)
}

// feed splits data into lines; the bytes after the last newline wait in
// tf.carry for the rest of their line.
func (d *Detector) feed(sc *scan, st *stream, tf *tailFile, data []byte) {
	for {
		i := bytes.IndexByte(data, '\n')
		if i < 0 {
			tf.keep(data)
			return
		}
		line := data[:i]
		data = data[i+1:]
		if len(tf.carry) > 0 || tf.overflow {
			tf.keep(line)
			line = tf.carry
		}
		d.line(sc, st, line)
		tf.resetCarry()
	}
}

func (tf *tailFile) keep(b []byte) {
	if tf.overflow {
		return
	}
	if room := maxLineBytes - len(tf.carry); len(b) > room {
		b = b[:room]
		tf.overflow = true
	}
	tf.carry = append(tf.carry, b...)
}

func (tf *tailFile) resetCarry() {
	tf.overflow = false
	if cap(tf.carry) > 4<<10 {
		tf.carry = nil // give back what one long line took
		return
	}
	tf.carry = tf.carry[:0]
}

// endLine treats what is left of a rotated file that will grow no more as a
// complete line.
func (d *Detector) endLine(sc *scan, st *stream, tf *tailFile) {
	if len(tf.carry) > 0 {
		d.line(sc, st, tf.carry)
	}
	tf.resetCarry()
}

// line handles one log line: joins CRI partials, then matches.
func (d *Detector) line(sc *scan, st *stream, raw []byte) {
	raw = bytes.TrimSuffix(raw, []byte("\r"))
	l, ok := parseCRI(raw)
	if !ok {
		d.text(sc, st, sc.now, raw)
		return
	}
	p := &st.parts[l.stream]
	switch {
	case l.partial:
		if !p.active {
			p.active, p.ts, p.buf, p.counted = true, l.ts, p.buf[:0], false
		}
		p.flushed, p.last = false, len(l.text)
		p.buf = append(p.buf, l.text...)
		if len(p.buf) > maxLineBytes {
			d.text(sc, st, p.ts, p.buf)
			p.buf = append(p.buf[:0], p.buf[len(p.buf)-overlapBytes:]...)
		}
	case p.active:
		p.buf = append(p.buf, l.text...)
		if !p.counted {
			d.text(sc, st, p.ts, p.buf)
		}
		p.active, p.flushed, p.counted = false, false, false
		if cap(p.buf) > 4<<10 {
			p.buf = nil
		}
	default:
		d.text(sc, st, l.ts, l.text)
	}
}

func (d *Detector) text(sc *scan, st *stream, ts time.Time, text []byte) {
	if d.matcher.match(text) {
		n := len(sc.events)
		sc.events = d.logEvent(sc.cs, st.instance, ts, text, sc.events)
		sc.follow = nil
		if len(sc.events) > n {
			if r := d.matcher.follower(text); r != nil {
				sc.follow = &following{st: st, event: n, lineReader: lineReader{read: r}}
			}
		}
		return
	}
	f := sc.follow
	if f == nil || f.st != st {
		return
	}
	k, told, done := f.add(text)
	if told {
		sc.events[f.event].Kind = k
	}
	if done {
		sc.follow = nil
	}
}
