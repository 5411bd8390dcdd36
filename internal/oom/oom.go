// Package oom detects GPU out-of-memory failures of containers, so that the
// exporter can count them per container in gpuslice_gpu_oom_events_total.
//
// It looks in two places. Source "log": the container logs the kubelet keeps
// under /var/log/pods, read incrementally (an offset per file) and matched
// line by line against DefaultPatterns. Source "termination": the terminated
// states the kubelet reports in pod status, whose Message holds the end of the
// log when the container uses terminationMessagePolicy FallbackToLogsOnError.
//
// What counts as one event:
//
//   - Collapse rule (log): a training job's traceback usually prints several
//     matching lines for one failure ("torch.OutOfMemoryError: CUDA out of
//     memory. Tried to allocate …", later "RuntimeError: CUDA error: out of
//     memory"). A matching line of a container instance counts as a new event
//     only when its log time is at least Config.CollapseWindow (default 5 s)
//     away from the last event counted for that instance; lines closer than
//     that belong to the event already counted. The window is anchored at the
//     counted event, not slid along the lines, so a job that keeps failing and
//     retrying still yields one event every window. Log time is the CRI
//     timestamp; plain lines have none and take the time of the Scan that
//     read them.
//   - Termination: a terminated state whose Reason or Message matches is one
//     event per (PodUID, Container, Instance).
//   - Across sources: an instance whose OOM was counted from its log does not
//     count again from its termination, and an instance counted from its
//     termination does not count again from its log.
//
// Kind: each event has the Kind of the catalogue signature its line
// matched first. Where one message has more than one cause, the signature
// reads the kind from the line's own figures (Signature.Refine) or from the
// lines after it (Signature.Follow: PyTorch's cudaMallocAsync backend puts
// its figures on lines of their own); those are read when the Scan that
// counts the event reads them, and the signature's Kind stands otherwise.
//
// History is not counted: log files that exist at the first Scan are read
// from their end, and terminations that finished before NewDetector are
// ignored, so restarting the exporter does not fire alerts again.
//
// Forgetting: one period, Config.ForgetAfter (DefaultForgetAfter, 6 h),
// governs everything kept about a container. The Detector forgets the
// state of a container that no Scan has named for that long; the Tracker,
// which the exporter uses, watches a container until it has not been seen
// live for that long, then stops naming it and has its state forgotten at
// once, and drops its counters once they, too, have been still that long.
// The period is far longer than any alert's look-back, so a counter that
// grew is on view long after, and long enough that a container watched
// again is usually still known.
//
// What is needed to not count anything twice when a forgotten container is
// named again is kept in a grave: for each of its log files the device and
// inode, the offset read to and the line it was in the middle of (its
// first 512 bytes, so a longer one is matched on its start), and the
// de-duplication state of its instances already counted. When it is named
// again, a file with the same inode is read on from that offset (from 0 if
// the file is now shorter: truncated); a file with another inode is a
// rotation, handled as between two Scans; an instance counted before is
// not counted again by either source, and the collapse rule holds across
// the gap. A container whose log directory is gone when it is forgotten
// (its pod was deleted) keeps no files.
//
// Graves are bounded: at most 10,000 files and 10,000 instances (under 1 KiB
// a file: about 8 MiB when full, under 30 MiB if every file was in the middle
// of lines). Past either bound the containers forgotten longest ago lose their
// graves whole: if one of them is named again, its log files are read from
// the start and its old terminations, if they finished after NewDetector,
// count again, as for a container never seen. Graves are dropped only then or
// when their container is named again, so the bound is what limits them.
package oom

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"time"
)

// Container names one container of a pod. PodUID and the names build the
// kubelet's log directory <PodLogsDir>/<Namespace>_<Pod>_<PodUID>/<Container>;
// for a static pod that is the UID in its kubernetes.io/config.mirror
// annotation, not the mirror pod's own UID.
type Container struct {
	Namespace, Pod, PodUID, Container string
}

// Source says where an event was found; it is the metric's source label.
type Source string

// The two sources.
const (
	SourceLog         Source = "log"
	SourceTermination Source = "termination"
)

// Event is one GPU out-of-memory failure of a container instance.
type Event struct {
	Container Container
	// Instance is the restart count of the container instance that failed:
	// N of its log file N.log, or the Instance of its Termination.
	Instance int
	Source   Source
	// Kind is what ran out, from the catalogue signature the line matched
	// (KindUnknown for a pattern of Config.Patterns that is not one).
	Kind Kind
	// Message is the matching line, trimmed to about 512 bytes.
	Message string
	// Time is the log time of the line (its CRI timestamp, or the Scan's time
	// for a plain line), or the termination's FinishedAt.
	Time time.Time
}

// Termination is a container's terminated state as the pod status reports it:
// state.terminated (Instance = restartCount) or lastState.terminated
// (Instance = restartCount-1).
type Termination struct {
	Container  Container
	Instance   int
	Reason     string
	Message    string
	ExitCode   int32
	FinishedAt time.Time
}

// Defaults for the zero fields of Config.
const (
	DefaultMaxReadBytes   = 1 << 20
	DefaultCollapseWindow = 5 * time.Second
	DefaultForgetAfter    = 6 * time.Hour
)

// Config configures a Detector.
type Config struct {
	// PodLogsDir is the kubelet's pod log directory, normally /var/log/pods.
	// Empty turns the log source off: only terminations are checked.
	PodLogsDir string
	// Patterns are regular expressions (Go RE2 syntax); nil means
	// DefaultPatterns.
	Patterns []string
	// MaxReadBytes bounds what one Scan reads from one file, so that a
	// container that logs a lot delays its own detection, not the scrape;
	// the rest is read by later Scans. Zero means DefaultMaxReadBytes.
	MaxReadBytes int64
	// CollapseWindow is the log time within which matching lines of one
	// container instance are one event (see the package comment). Zero means
	// DefaultCollapseWindow.
	CollapseWindow time.Duration
	// ForgetAfter is the one forget period ("Forgetting" in the package
	// comment): how long the whole state of a container that no Scan has
	// named (in containers or terms) is kept, and for a Tracker how long a
	// container is watched after it was last seen live and its counters
	// after they last moved. After that only its grave is kept, so that a
	// container named again does not count its old events again. Zero
	// means DefaultForgetAfter.
	ForgetAfter time.Duration
	// Logger receives the problems that Scan skips over; nil discards them.
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// ErrPodLogsDir is wrapped by Scan's error when PodLogsDir cannot be read.
var ErrPodLogsDir = errors.New("pod log directory unreadable")

// Detector finds new GPU OOM events at every Scan. Scan must not be called
// concurrently (the exporter calls it from one collector); Match may be.
type Detector struct {
	root        string
	matcher     *matcher
	maxRead     int64
	window      time.Duration
	forgetAfter time.Duration
	log         *slog.Logger
	now         func() time.Time
	start       time.Time

	// baseline holds, from the first Scan that could read root, the size of
	// every log file then present, keyed by path: where reading starts when
	// the file's container is first named, at that Scan or later.
	baseline   map[string]fileMark
	started    bool
	containers map[Container]*containerState
	// graves keeps, for containers forgotten after ForgetAfter, what must
	// survive until they are named again.
	graves *graveyard
	buf    []byte // read buffer, reused across files and Scans

	// watcher says which container directories changed (dirWatcher); nil
	// before the first Scan that reads logs, after Close, and where inotify
	// is not to be had (noWatcher).
	watcher   *dirWatcher
	noWatcher bool
	// rootOK: PodLogsDir passed its last check.
	rootOK bool
	// fullPass is when every container is read again, watched or not.
	fullPass time.Time
}

// fullPassInterval is how often every watched container is read whatever
// inotify said, and PodLogsDir checked again: a bound on what an event
// inotify did not give (a file system without them) could delay.
const fullPassInterval = time.Minute

// NewDetector checks cfg and returns a Detector whose start time, before
// which terminations are not counted, is now.
func NewDetector(cfg Config) (*Detector, error) {
	patterns := cfg.Patterns
	if patterns == nil {
		patterns = DefaultPatterns
	}
	m, err := newMatcher(patterns)
	if err != nil {
		return nil, err
	}
	d := &Detector{
		root:        cfg.PodLogsDir,
		matcher:     m,
		maxRead:     orDefault(cfg.MaxReadBytes, DefaultMaxReadBytes),
		window:      orDefault(cfg.CollapseWindow, DefaultCollapseWindow),
		forgetAfter: orDefault(cfg.ForgetAfter, DefaultForgetAfter),
		log:         cfg.Logger,
		now:         cfg.Now,
		containers:  map[Container]*containerState{},
		graves:      newGraveyard(maxForgottenFiles, maxForgottenInstances),
	}
	switch {
	case d.maxRead < 0:
		return nil, fmt.Errorf("oom: MaxReadBytes %d is negative", cfg.MaxReadBytes)
	case d.window < 0:
		return nil, fmt.Errorf("oom: CollapseWindow %v is negative", cfg.CollapseWindow)
	case d.forgetAfter < 0:
		return nil, fmt.Errorf("oom: ForgetAfter %v is negative", cfg.ForgetAfter)
	}
	if d.log == nil {
		d.log = slog.New(slog.DiscardHandler)
	}
	if d.now == nil {
		d.now = time.Now
	}
	d.start = d.now()
	return d, nil
}

func orDefault[T int64 | time.Duration](v, def T) T {
	if v == 0 {
		return def
	}
	return v
}

// Match reports whether line is a GPU OOM: it matches one of the
// detector's patterns and is not about host memory (HostMemoryPattern).
func (d *Detector) Match(line string) bool {
	return d.matcher.match([]byte(line))
}

// Classify is Match that also says which Kind of GPU OOM line is: that of
// the first pattern, in the detector's order, that matches it.
func (d *Detector) Classify(line string) (Kind, bool) {
	b := []byte(line)
	if !d.matcher.match(b) {
		return KindUnknown, false
	}
	return d.matcher.kind(b), true
}

// Kinds lists the kinds the detector's events can have: those of its
// patterns (KindUnknown for one that is not in the Catalogue), in the
// order device, process-cap, encoder-session, unknown.
func (d *Detector) Kinds() []Kind {
	var out []Kind
	for _, k := range kindOrder {
		if slices.Contains(d.matcher.kinds, k) {
			out = append(out, k)
		}
	}
	return out
}

// Scan returns the events that appeared since the last Scan: new matching
// lines in the logs of containers, and terms that match. Pass every container
// and termination each time, a container as the same Container value in both
// (it is the key of the de-duplication); what was counted before is not
// returned again. Events come in the order of containers, then of terms.
//
// Problems with single files are logged and skipped. The error is non-nil
// only when PodLogsDir itself cannot be read; the events are then still those
// of terms, and the caller must count them all the same.
func (d *Detector) Scan(containers []Container, terms []Termination) ([]Event, error) {
	now := d.now()
	var events []Event
	var err error
	readLogs := d.root != ""
	if readLogs {
		d.watchEvents(now)
		if d.watcher == nil || !d.rootOK || !d.watcher.rootKnown() {
			err = d.checkRoot()
			d.rootOK = err == nil
			if d.rootOK && d.watcher != nil {
				d.watcher.rootChecked(d.root)
			}
		}
		readLogs = d.rootOK
	}
	if readLogs && !d.started {
		d.takeBaseline()
		d.started = true
	}
	for _, c := range containers {
		// Named containers are remembered even while their logs cannot be
		// read, or they would be read again from the start afterwards.
		cs := d.state(c, now)
		if readLogs && (cs.wd == 0 || cs.dirty) {
			events = d.scanContainer(cs, now, events)
		}
	}
	for _, t := range terms {
		if ev, ok := d.termination(d.state(t.Container, now), t); ok {
			events = append(events, ev)
		}
	}
	for c, cs := range d.containers {
		if now.Sub(cs.lastSeen) > d.forgetAfter {
			d.bury(cs, readLogs)
			delete(d.containers, c)
		}
	}
	return events, err
}

// watchEvents takes in what changed since the last Scan, starting the
// watcher at the first call, and marks every container to be read when
// events were lost or a full pass is due.
func (d *Detector) watchEvents(now time.Time) {
	if d.watcher == nil && !d.noWatcher {
		d.watcher = newDirWatcher(d.root)
		d.noWatcher = d.watcher == nil
	}
	lost := d.watcher == nil || d.watcher.drain()
	if lost || !now.Before(d.fullPass) {
		d.fullPass = now.Add(fullPassInterval)
		d.rootOK = false
		for _, cs := range d.containers {
			cs.dirty = true
		}
	}
}

// Close releases the inotify instance. A Scan after it starts a new one.
func (d *Detector) Close() error {
	if d.watcher != nil {
		d.watcher.close()
		d.watcher = nil
	}
	d.noWatcher = false
	return nil
}

func (d *Detector) checkRoot() error {
	f, err := os.Open(d.root)
	if err == nil {
		// Open succeeds on a plain file or an unlistable directory; reading
		// one name shows that the directory can really be listed.
		_, err = f.Readdirnames(1)
		_ = f.Close() // read only: nothing to flush
		if errors.Is(err, io.EOF) {
			err = nil
		}
	}
	if err != nil {
		return fmt.Errorf("oom: %w: %s: %w", ErrPodLogsDir, d.root, err)
	}
	return nil
}

// containerState is what the detector keeps per container between Scans.
type containerState struct {
	c        Container
	lastSeen time.Time
	streams  []*stream // one per log file N.log, by N
	listing  listing   // of its log directory
	// instances holds the de-duplication state of recent instances;
	// maxInstance bounds it.
	instances   map[int]*instanceState
	maxInstance int
	lastErr     string // the last problem logged, so a lasting one is logged once
	// left are the files that were N.log when a Scan found N.log gone,
	// with where they were read to, the newest keptInstances: the kubelet
	// renames a rotated log back to N.log when the runtime fails to reopen
	// it, and the file that comes back is read on from there, not again
	// from the start (counting its old OOMs twice).
	left []leftFile
	// wd is the inotify watch of its log directory (0: none, read at every
	// Scan); dirty, that it changed, or may hold more to read, since its
	// last reading.
	wd    int32
	dirty bool
	reads int // Scans that read its directory (tests)
}

// leftFile is a file of instance n that left N.log (containerState.left).
type leftFile struct {
	n  int
	tf *tailFile
}

type instanceState struct {
	logCounted  bool
	termCounted bool
	lastLog     time.Time // log time of the last event counted from the log
}

// keptInstances is how many instances below the highest one seen keep their
// de-duplication state. Pod status reports only the current and the previous
// instance, and the kubelet keeps the logs of no more.
const keptInstances = 4

func (d *Detector) state(c Container, now time.Time) *containerState {
	cs := d.containers[c]
	if cs == nil {
		cs = &containerState{c: c, instances: map[int]*instanceState{}}
		d.exhume(cs)
		d.containers[c] = cs
	}
	cs.lastSeen = now
	return cs
}

func (cs *containerState) instance(n int) *instanceState {
	if is := cs.instances[n]; is != nil {
		return is
	}
	is := &instanceState{}
	cs.instances[n] = is
	if n > cs.maxInstance {
		cs.maxInstance = n
		for old := range cs.instances {
			if old < n-keptInstances {
				delete(cs.instances, old)
			}
		}
	}
	return is
}

// logf logs a problem with a container's files unless it is the same as the
// last one logged for that container.
func (d *Detector) logf(cs *containerState, msg string, args ...any) {
	cs.dirty = true // a problem: try again at the next Scan
	key := fmt.Sprint(append([]any{msg}, args...)...)
	if key == cs.lastErr {
		return
	}
	cs.lastErr = key
	d.log.Warn(msg, append([]any{"namespace", cs.c.Namespace, "pod", cs.c.Pod, "container", cs.c.Container}, args...)...)
}

// logEvent counts a matching log line of instance n unless the collapse rule
// or the cross-source rule says it was counted already.
func (d *Detector) logEvent(cs *containerState, n int, ts time.Time, line []byte, events []Event) []Event {
	is := cs.instance(n)
	if is.termCounted {
		return events
	}
	if is.logCounted {
		gap := ts.Sub(is.lastLog)
		if gap < d.window && gap > -d.window {
			return events
		}
	}
	is.logCounted = true
	is.lastLog = ts
	return append(events, Event{
		Container: cs.c,
		Instance:  n,
		Source:    SourceLog,
		Kind:      d.matcher.kind(line),
		Message:   d.matcher.excerpt(line),
		Time:      ts,
	})
}

func (d *Detector) termination(cs *containerState, t Termination) (Event, bool) {
	// Pod statuses carry whole seconds: a termination in the exporter's
	// first second reads as earlier than the start, so compare by second.
	if t.FinishedAt.Before(d.start.Truncate(time.Second)) {
		return Event{}, false
	}
	is := cs.instance(t.Instance)
	if is.termCounted || is.logCounted {
		return Event{}, false
	}
	msg, kind, ok := d.matcher.firstMatchingLine(t.Reason)
	if !ok {
		msg, kind, ok = d.matcher.firstMatchingLine(t.Message)
	}
	if !ok {
		return Event{}, false
	}
	is.termCounted = true
	return Event{
		Container: t.Container,
		Instance:  t.Instance,
		Source:    SourceTermination,
		Kind:      kind,
		Message:   msg,
		Time:      t.FinishedAt,
	}, true
}
