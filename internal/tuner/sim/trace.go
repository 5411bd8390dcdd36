package sim

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"time"

	"gopkg.in/yaml.v3"
)

// ErrInvalidTrace wraps every error about a trace file.
var ErrInvalidTrace = errors.New("invalid trace")

// Trace is a workload to replay on one GPU (DESIGN.md, "Trace file for
// simulate").
type Trace struct {
	MemoryTotalBytes uint64
	InitialReplicas  int
	Duration         time.Duration
	Pods             []Pod
	// Sharing is how the GPU is shared: "" for time-slicing (the default),
	// or SharingMPS (mps.go).
	Sharing string
}

// Pod is one pod of a trace.
type Pod struct {
	Name   string
	Arrive time.Duration
	// Run is how long the pod holds its replica once admitted; OOM restarts
	// do not extend it.
	Run time.Duration
	// Memory is piecewise constant from the start of each attempt, first step
	// at 0s, offsets strictly increasing.
	Memory []MemoryStep
	// Workload is the pod's workload key (what the controller derives from
	// its owner: a Deployment, a CronJob, else its image), so that pods of
	// one workload share a record; NameStem of the pod's name when the
	// trace leaves it out.
	Workload string
}

// MemoryStep is one `[offset, bytes]` pair of a pod's memory timeline.
type MemoryStep struct {
	At    time.Duration
	Bytes uint64
}

// UnmarshalYAML reads the `[offset, bytes]` form. ParseTrace reads steps
// itself (parseStep), to name the pod and step of a bad one; this serves
// callers that decode a step alone.
func (m *MemoryStep) UnmarshalYAML(n *yaml.Node) error {
	step, problem := parseStep(n)
	if problem != "" {
		return fmt.Errorf("line %d: %s", n.Line, problem)
	}
	*m = step
	return nil
}

// parseStep reads one `[offset, bytes]` step, or says what is wrong with it.
func parseStep(n *yaml.Node) (MemoryStep, string) {
	var m MemoryStep
	if n.Kind != yaml.SequenceNode || len(n.Content) != 2 {
		return m, "a memory step is [offset, bytes], e.g. [2h, 6442450944]"
	}
	if err := n.Content[0].Decode(&m.At); err != nil {
		return m, fmt.Sprintf("offset %q is not a duration such as 90s or 2h", n.Content[0].Value)
	}
	b, ok := wholeNumber(n.Content[1], math.MaxUint64)
	if !ok {
		return m, fmt.Sprintf("bytes %q is not a whole number of bytes from 0 to %d", n.Content[1].Value, uint64(math.MaxUint64))
	}
	m.Bytes = b
	return m, ""
}

// wholeNumber reads n as a YAML integer from 0 to most. yaml.v3 decodes a
// float into an integer field without complaint, 0.9 as 0 and -1.0 into a
// uint64 as 2^63 or more: a slip in a size must not become another size.
func wholeNumber(n *yaml.Node, most uint64) (uint64, bool) {
	var v uint64
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" || n.Decode(&v) != nil || v > most {
		return 0, false
	}
	return v, true
}

// The file's shape; pointers tell a missing field from a zero one.
type traceFile struct {
	// Numbers are nodes so that wholeNumber reads them (yaml.v3 would take
	// a float for an integer); a missing or null one is absent (absent).
	GPU *struct {
		MemoryTotalBytes yaml.Node `yaml:"memoryTotalBytes"`
	} `yaml:"gpu"`
	InitialReplicas yaml.Node      `yaml:"initialReplicas"`
	Duration        *time.Duration `yaml:"duration"`
	Pods            []podFile      `yaml:"pods"`
	// Sharing is optional (added with MPS): old traces are time-sliced.
	Sharing *string `yaml:"sharing"`
}

type podFile struct {
	Name   *string        `yaml:"name"`
	Arrive *time.Duration `yaml:"arrive"`
	Run    *time.Duration `yaml:"run"`
	// Memory's steps are read by parseStep, in ParseTrace, to name the pod
	// and the step of a bad one.
	Memory []yaml.Node `yaml:"memory"`
	// Workload is optional (added after the first traces): old traces stay
	// valid, each pod the workload its name's stem names (NameStem).
	Workload *string `yaml:"workload"`
}

// ReadTrace reads and validates the trace file at path.
func ReadTrace(path string) (*Trace, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidTrace, err)
	}
	return ParseTrace(path, data)
}

// ParseTrace parses and validates a trace; name (usually the file path)
// prefixes every error, with the line of the offending pod.
func ParseTrace(name string, data []byte) (*Trace, error) {
	fail := func(line int, format string, args ...any) error {
		where := name
		if line > 0 {
			where = fmt.Sprintf("%s:%d", name, line)
		}
		return fmt.Errorf("%w: %s: %s", ErrInvalidTrace, where, fmt.Sprintf(format, args...))
	}
	var f traceFile
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&f); errors.Is(err, io.EOF) {
		return nil, fail(0, "empty trace")
	} else if err != nil {
		return nil, fail(0, "%v", err)
	}
	// yaml.v3 reads one document at a time: what follows a `---` would be
	// dropped unread, pods and all.
	for {
		var more yaml.Node
		err := dec.Decode(&more)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fail(0, "after the first YAML document: %v (a trace is one document)", err)
		}
		if !emptyDocument(&more) {
			return nil, fail(more.Line, "a second YAML document: a trace is one document (put every pod in its one pods list)")
		}
	}
	items := podItems(data)
	for i, item := range items {
		// yaml.v3 leaves a null item out of the pods it decodes: every pod
		// after it would be named by the wrong index and line.
		if absent(item) {
			return nil, fail(item.Line, "pods[%d]: empty item (a pod is a mapping of name, arrive, run and memory)", i)
		}
	}

	var missing []string
	if f.GPU == nil || absent(&f.GPU.MemoryTotalBytes) {
		missing = append(missing, "gpu.memoryTotalBytes")
	}
	if absent(&f.InitialReplicas) {
		missing = append(missing, "initialReplicas")
	}
	if f.Duration == nil {
		missing = append(missing, "duration")
	}
	if len(missing) > 0 {
		return nil, fail(0, "missing %s", strings.Join(missing, ", "))
	}
	total, ok := wholeNumber(&f.GPU.MemoryTotalBytes, math.MaxUint64)
	if !ok {
		return nil, fail(f.GPU.MemoryTotalBytes.Line, "gpu.memoryTotalBytes %q is not a whole number of bytes from 0 to %d",
			f.GPU.MemoryTotalBytes.Value, uint64(math.MaxUint64))
	}
	replicas, ok := wholeNumber(&f.InitialReplicas, math.MaxInt)
	if !ok {
		return nil, fail(f.InitialReplicas.Line, "initialReplicas %q is not a whole number from 1 to %d", f.InitialReplicas.Value, math.MaxInt)
	}
	tr := &Trace{MemoryTotalBytes: total, InitialReplicas: int(replicas), Duration: *f.Duration}
	switch {
	case tr.MemoryTotalBytes == 0:
		return nil, fail(0, "gpu.memoryTotalBytes must be > 0")
	case tr.InitialReplicas < 1:
		return nil, fail(0, "initialReplicas must be >= 1, got %d", tr.InitialReplicas)
	case tr.Duration <= 0:
		return nil, fail(0, "duration must be > 0, got %s", tr.Duration)
	case len(f.Pods) == 0:
		return nil, fail(0, "pods: no pods")
	}

	if err := parseSharing(tr, f.Sharing); err != nil {
		return nil, fail(0, "%v", err)
	}
	seen := map[string]int{}
	for i, p := range f.Pods {
		line := 0
		if i < len(items) {
			line = items[i].Line
		}
		where := fmt.Sprintf("pods[%d]", i)
		if p.Name != nil {
			where = fmt.Sprintf("pods[%d] (%s)", i, *p.Name)
		}
		switch {
		case p.Name == nil || *p.Name == "":
			return nil, fail(line, "%s: missing name", where)
		case p.Arrive == nil:
			return nil, fail(line, "%s: missing arrive", where)
		case p.Run == nil:
			return nil, fail(line, "%s: missing run", where)
		case len(p.Memory) == 0:
			return nil, fail(line, "%s: missing memory", where)
		}
		if j, dup := seen[*p.Name]; dup {
			return nil, fail(line, "%s: name already used by pods[%d]", where, j)
		}
		seen[*p.Name] = i
		if *p.Arrive < 0 || *p.Arrive >= tr.Duration {
			return nil, fail(line, "%s: arrive must be in [0s, duration %s), got %s", where, tr.Duration, *p.Arrive)
		}
		if *p.Run <= 0 {
			return nil, fail(line, "%s: run must be > 0, got %s", where, *p.Run)
		}
		memory := make([]MemoryStep, len(p.Memory))
		for k := range p.Memory {
			step, problem := parseStep(&p.Memory[k])
			if problem != "" {
				return nil, fail(p.Memory[k].Line, "%s: memory[%d]: %s", where, k, problem)
			}
			memory[k] = step
		}
		if memory[0].At != 0 {
			return nil, fail(line, "%s: memory[0] must start at 0s, got %s", where, memory[0].At)
		}
		for k := 1; k < len(memory); k++ {
			if memory[k].At <= memory[k-1].At {
				return nil, fail(line, "%s: memory[%d] at %s is not after memory[%d] at %s (steps must be in increasing order)",
					where, k, memory[k].At, k-1, memory[k-1].At)
			}
		}
		wl := NameStem(*p.Name)
		if p.Workload != nil {
			if *p.Workload == "" {
				return nil, fail(line, "%s: workload is empty (leave it out to key the pod by its name, NameStem)", where)
			}
			wl = *p.Workload
		}
		tr.Pods = append(tr.Pods, Pod{Name: *p.Name, Arrive: *p.Arrive, Run: *p.Run, Memory: memory, Workload: wl})
	}
	return tr, nil
}

// podItems returns the items of the top-level pods list, for their lines;
// the typed decode has already checked the document parses.
func podItems(data []byte) []*yaml.Node {
	var root yaml.Node
	if yaml.Unmarshal(data, &root) != nil || len(root.Content) == 0 {
		return nil
	}
	doc := root.Content[0]
	for i := 0; i+1 < len(doc.Content); i += 2 {
		if doc.Content[i].Value == "pods" {
			return doc.Content[i+1].Content
		}
	}
	return nil
}

// absent says whether a field read as a node was left out or left empty.
func absent(n *yaml.Node) bool { return n.Kind == 0 || n.ShortTag() == "!!null" }

// emptyDocument says whether a YAML document holds nothing: what a
// trailing `---`, or one followed by comments only, reads as.
func emptyDocument(n *yaml.Node) bool {
	return len(n.Content) == 0 || (len(n.Content) == 1 && absent(n.Content[0]))
}

// genSuffix is the alphabet of the random suffix Kubernetes gives a name
// made from generateName (five characters) and of a ReplicaSet's
// pod-template-hash: no vowels, and no 0, 1 or 3.
const genSuffix = "bcdfghjklmnpqrstvwxz2456789"

// NameStem is the workload key of a trace pod that has none: its name less
// the run number or the generated parts at its end, read the way the
// controller's workloadKey reads a pod's owner:
//
//   - a run number: "whisper-podcast-3" and "whisper-podcast-4" are both
//     "whisper-podcast", a StatefulSet's "db-0" is "db";
//   - a generateName suffix: "train-x7k2p" is "train";
//   - and before such a suffix, a pod-template-hash or a CronJob's
//     scheduled time: "web-5d8f7c9b6d-x7k2p" is "web",
//     "backup-29012345-x7k2p" is "backup".
//
// The controller keys a pod no controller owns by its image, and the runs a
// script numbers are runs of one image; a trace has names, not images, so
// the name less its run number stands in for the image. Only one run
// number goes: in "job-2-7" the 2 may tell one kind of job from another,
// so it is "job-2". A name with nothing to strip is its own stem.
func NameStem(name string) string {
	stem, last := cutLast(name)
	switch {
	case last == "":
		return name
	case allIn(last, "0123456789"):
		return stem
	case len(last) != 5 || !allIn(last, genSuffix):
		return name
	}
	// A generated suffix: what made the pod may have left its mark before
	// it, as a ReplicaSet's hash or a CronJob's Job's scheduled time.
	owner, mark := cutLast(stem)
	if mark != "" && ((len(mark) >= 6 && len(mark) <= 10 && allIn(mark, genSuffix)) ||
		(len(mark) >= 8 && allIn(mark, "0123456789"))) {
		return owner
	}
	return stem
}

// cutLast splits name at its last '-', '_' or '.': what is before it and
// what is after, or name and "" when there is no such separator past the
// first character.
func cutLast(name string) (string, string) {
	i := strings.LastIndexAny(name, "-_.")
	if i <= 0 {
		return name, ""
	}
	return name[:i], name[i+1:]
}

// allIn reports whether s is not empty and every byte of s is in set.
func allIn(s, set string) bool { return s != "" && strings.Trim(s, set) == "" }
