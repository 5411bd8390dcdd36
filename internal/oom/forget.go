package oom

import (
	"container/list"
	"errors"
	"io/fs"
	"os"
	"slices"
)

// What is kept of forgotten containers (see "Forgetting" in the
// package comment).
const (
	// maxForgottenFiles and maxForgottenInstances bound the graves: past
	// either, the containers forgotten longest ago are dropped whole.
	maxForgottenFiles     = 10_000
	maxForgottenInstances = 10_000
	// maxForgottenLineBytes is what a forgotten file keeps of a line it was
	// in the middle of (its carry, and each CRI partial line being joined),
	// so that a grave stays small whatever the container was writing.
	maxForgottenLineBytes = 512
)

// grave is what is kept of a container once it is forgotten: where each of
// its log files was read to, with the line it was in the middle of, and the
// instances already counted.
type grave struct {
	c         Container
	streams   []*stream // by instance, as in containerState
	instances []keptInstance
	files     int
}

// keptInstance is an instance already counted (a slice of them is smaller
// than a map).
type keptInstance struct {
	n int
	instanceState
}

// graveyard holds the graves, oldest first, within its bounds.
type graveyard struct {
	maxFiles, maxInstances int
	files, instances       int
	byContainer            map[Container]*list.Element // Value: *grave
	order                  list.List
}

func newGraveyard(maxFiles, maxInstances int) *graveyard {
	return &graveyard{maxFiles: maxFiles, maxInstances: maxInstances, byContainer: map[Container]*list.Element{}}
}

// put adds g as the newest grave and returns the graves evicted to stay
// within the bounds (g itself among them if it alone is past them).
func (gy *graveyard) put(g *grave) []*grave {
	gy.take(g.c)
	gy.byContainer[g.c] = gy.order.PushBack(g)
	gy.files += g.files
	gy.instances += len(g.instances)
	var evicted []*grave
	for gy.files > gy.maxFiles || gy.instances > gy.maxInstances {
		old := gy.take(gy.order.Front().Value.(*grave).c)
		evicted = append(evicted, old)
	}
	return evicted
}

// take removes and returns the grave of c, nil if there is none.
func (gy *graveyard) take(c Container) *grave {
	e := gy.byContainer[c]
	if e == nil {
		return nil
	}
	g := gy.order.Remove(e).(*grave)
	delete(gy.byContainer, c)
	gy.files -= g.files
	gy.instances -= len(g.instances)
	return g
}

// bury keeps what must survive cs being forgotten. rootReadable says that
// PodLogsDir could be listed in this Scan, so that a missing container
// directory means its pod was deleted, not an outage.
func (d *Detector) bury(cs *containerState, rootReadable bool) {
	if d.watcher != nil {
		d.watcher.unwatch(cs)
	}
	g := &grave{c: cs.c}
	if len(cs.streams) > 0 && !(rootReadable && dirDeleted(containerDir(d.root, cs.c))) {
		for _, st := range cs.streams {
			if st.cur == nil && len(st.old) == 0 {
				continue
			}
			st.compact()
			g.streams = append(g.streams, st)
			g.files += len(st.old)
			if st.cur != nil {
				g.files++
			}
		}
	}
	for n, is := range cs.instances {
		if is.logCounted || is.termCounted {
			g.instances = append(g.instances, keptInstance{n, *is})
		}
	}
	if len(g.streams) == 0 && len(g.instances) == 0 {
		return
	}
	for _, old := range d.graves.put(g) {
		d.log.Debug("state of a container forgotten long ago dropped; if it is named again, its log files are read from the start",
			"namespace", old.c.Namespace, "pod", old.c.Pod, "container", old.c.Container,
			"files", old.files, "instances", len(old.instances))
	}
}

// exhume gives cs, a container named again, what was kept when it was
// forgotten.
func (d *Detector) exhume(cs *containerState) {
	g := d.graves.take(cs.c)
	if g == nil {
		return
	}
	cs.streams = g.streams
	for _, k := range g.instances {
		cs.instances[k.n] = &k.instanceState
		cs.maxInstance = max(cs.maxInstance, k.n)
	}
}

func dirDeleted(dir string) bool {
	_, err := os.Stat(dir)
	return errors.Is(err, fs.ErrNotExist)
}

// compact trims what a stream holds to what a grave keeps.
func (st *stream) compact() {
	st.lastErr = ""
	if st.cur != nil {
		st.cur.compact()
	}
	for _, tf := range st.old {
		tf.compact()
	}
	st.old = slices.Clip(st.old)
	for i := range st.parts {
		p := &st.parts[i]
		if !p.active {
			p.buf = nil
			continue
		}
		// The start of the line is kept: an OOM message begins its line.
		// The rest of it is lost, so the joined line has a gap there.
		p.buf = clipLine(p.buf)
	}
}

func (tf *tailFile) compact() {
	if len(tf.carry) > maxForgottenLineBytes {
		// Matched on its start, as a line longer than maxLineBytes is.
		tf.overflow = true
	}
	tf.carry = clipLine(tf.carry)
}

// clipLine returns a copy of at most maxForgottenLineBytes of the start of
// b, nil for an empty b, so that the grave holds no larger buffer.
func clipLine(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return slices.Clone(b[:min(len(b), maxForgottenLineBytes)])
}
