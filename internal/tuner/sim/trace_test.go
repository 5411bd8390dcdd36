package sim

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"gopkg.in/yaml.v3"
)

func TestParseTrace(t *testing.T) {
	tr := mustParse(t, `# the example of DESIGN.md
gpu: {memoryTotalBytes: 51527024640}
initialReplicas: 4
duration: 24h
pods:
  - name: yolo
    arrive: 0s
    run: 24h                     # how long it runs once admitted
    memory: [[0s, 4294967296], [2h, 6442450944]]
  - name: train-0415       # a pod of a workload: its record is the workload's
    workload: cronjob/train
    arrive: 1h
    run: 2h
    memory: [[0s, 8589934592]]
`)
	want := &Trace{MemoryTotalBytes: 51527024640, InitialReplicas: 4, Duration: 24 * time.Hour, Pods: []Pod{{
		Name: "yolo", Arrive: 0, Run: 24 * time.Hour, Workload: "yolo",
		Memory: []MemoryStep{{0, 4 * GiB}, {2 * time.Hour, 6 * GiB}},
	}, {
		Name: "train-0415", Arrive: time.Hour, Run: 2 * time.Hour, Workload: "cronjob/train",
		Memory: []MemoryStep{{0, 8 * GiB}},
	}}}
	if diff := cmp.Diff(want, tr); diff != "" {
		t.Errorf("trace (-want +got):\n%s", diff)
	}
}

// TestNameStem holds the key a trace pod with no workload gets: the runs a
// script numbers share one (as the controller gives two bare pods of one
// image one key), and a name is never cut to nothing or past its last
// segment.
func TestNameStem(t *testing.T) {
	for name, want := range map[string]string{
		"whisper-podcast-3":     "whisper-podcast",
		"whisper-podcast-4":     "whisper-podcast",
		"comfyui-sdxl-1":        "comfyui-sdxl",
		"render_12":             "render",
		"clip-index.2":          "clip-index",
		"train-x7k2p":           "train",   // a generateName suffix
		"db-0":                  "db",      // a StatefulSet's ordinal
		"web-5d8f7c9b6d-x7k2p":  "web",     // a Deployment's pod
		"backup-29012345-x7k2p": "backup",  // a CronJob's Job's pod
		"train-4-x7k2p":         "train-4", // a run number is not a scheduled time
		"job-2-7":               "job-2",   // one segment goes, not every numbered one
		"clip-index-nightly":    "clip-index-nightly",
		"whisper-batch":         "whisper-batch", // five letters, but a word
		"qwen2-7b":              "qwen2-7b",
		"ffmpeg-nvenc":          "ffmpeg-nvenc",
		"yolo":                  "yolo",
		"0415":                  "0415",
		"-3":                    "-3",
		"job-":                  "job-",
	} {
		if got := NameStem(name); got != want {
			t.Errorf("NameStem(%q) = %q, want %q", name, got, want)
		}
	}
	// In a trace, numbered runs with no workload share a record; a pod
	// with a workload keeps it.
	tr := mustParse(t, `gpu: {memoryTotalBytes: 25769803776}
initialReplicas: 2
duration: 4h
pods:
  - {name: render-1, arrive: 0s, run: 1h, memory: [[0s, 3221225472]]}
  - {name: render-2, arrive: 1h, run: 1h, memory: [[0s, 3221225472]]}
  - {name: render-3, workload: other, arrive: 1h, run: 1h, memory: [[0s, 3221225472]]}
`)
	var got []string
	for _, p := range tr.Pods {
		got = append(got, p.Workload)
	}
	if diff := cmp.Diff([]string{"render", "render", "other"}, got); diff != "" {
		t.Errorf("workloads (-want +got):\n%s", diff)
	}
}

func TestParseTraceErrors(t *testing.T) {
	const head = "gpu: {memoryTotalBytes: 1000}\ninitialReplicas: 2\nduration: 1h\npods:\n"
	pod := func(fields string) string { return head + "  - {name: p, " + fields + "}\n" }
	type errCase struct {
		name string
		yaml string
		want []string // substrings of the error, in order
	}
	c := func(name, yaml string, want ...string) errCase { return errCase{name, yaml, want} }
	tests := []errCase{
		c("empty", "", "inline.yaml: empty trace"),
		c("empty workload", pod("arrive: 0s, run: 1m, memory: [[0s, 1]], workload: \"\""), "pods[0] (p): workload is empty"),
		c("not YAML", "gpu: [", "inline.yaml: yaml"),
		c("unknown field", head+"  - {name: p, arrive: 0s, run: 1m, memory: [[0s, 1]], limit: 5}\n", "field limit not found"),
		c("missing gpu", "initialReplicas: 2\nduration: 1h\npods: []\n", "missing gpu.memoryTotalBytes"),
		c("missing several", "gpu: {memoryTotalBytes: 5}\n", "missing initialReplicas, duration"),
		c("zero memory", "gpu: {memoryTotalBytes: 0}\ninitialReplicas: 2\nduration: 1h\npods: []\n", "gpu.memoryTotalBytes must be > 0"),
		c("zero replicas", "gpu: {memoryTotalBytes: 5}\ninitialReplicas: 0\nduration: 1h\npods: []\n", "initialReplicas must be >= 1, got 0"),
		c("negative duration", "gpu: {memoryTotalBytes: 5}\ninitialReplicas: 1\nduration: -1h\npods: []\n", "duration must be > 0, got -1h0m0s"),
		c("duration without unit", "gpu: {memoryTotalBytes: 5}\ninitialReplicas: 1\nduration: 3600\npods: []\n", "line 3", "time.Duration"),
		c("no pods", "gpu: {memoryTotalBytes: 5}\ninitialReplicas: 1\nduration: 1h\n", "pods: no pods"),
		c("missing name", head+"  - {arrive: 0s, run: 1m, memory: [[0s, 1]]}\n", "inline.yaml:5", "pods[0]: missing name"),
		c("missing arrive", pod("run: 1m, memory: [[0s, 1]]"), "inline.yaml:5", "pods[0] (p): missing arrive"),
		c("missing run", pod("arrive: 0s, memory: [[0s, 1]]"), "pods[0] (p): missing run"),
		c("missing memory", pod("arrive: 0s, run: 1m"), "pods[0] (p): missing memory"),
		c("negative arrive", pod("arrive: -5s, run: 1m, memory: [[0s, 1]]"), "arrive must be in [0s, duration 1h0m0s), got -5s"),
		c("arrive after the end", pod("arrive: 2h, run: 1m, memory: [[0s, 1]]"), "arrive must be in"),
		c("negative run", pod("arrive: 0s, run: -1m, memory: [[0s, 1]]"), "run must be > 0, got -1m0s"),
		c("first step late", pod("arrive: 0s, run: 1m, memory: [[5s, 1]]"), "memory[0] must start at 0s, got 5s"),
		c("steps out of order", pod("arrive: 0s, run: 1m, memory: [[0s, 1], [2m, 2], [1m, 3]]"),
			"memory[2] at 1m0s is not after memory[1] at 2m0s"),
		c("repeated step", pod("arrive: 0s, run: 1m, memory: [[0s, 1], [0s, 2]]"), "memory[1] at 0s is not after memory[0] at 0s"),
		c("step not a pair", pod("arrive: 0s, run: 1m, memory: [[0s]]"), "inline.yaml:5", "pods[0] (p): memory[0]: a memory step is [offset, bytes]"),
		c("step offset not a duration", pod("arrive: 0s, run: 1m, memory: [[soon, 1]]"), `pods[0] (p): memory[0]: offset "soon" is not a duration`),
		c("negative bytes", pod("arrive: 0s, run: 1m, memory: [[0s, -1]]"), `pods[0] (p): memory[0]: bytes "-1" is not a whole number`),
		// yaml.v3 would decode a float into the uint64: -1.0 as 2^63 or
		// more, 0.9 as 0.
		c("negative float bytes", pod("arrive: 0s, run: 1m, memory: [[0s, 1], [5s, -1.0]]"), "inline.yaml:5",
			`pods[0] (p): memory[1]: bytes "-1.0" is not a whole number of bytes`),
		c("fractional bytes", pod("arrive: 0s, run: 1m, memory: [[0s, 0.9]]"), `pods[0] (p): memory[0]: bytes "0.9" is not a whole number`),
		c("bytes in float notation", pod("arrive: 0s, run: 1m, memory: [[0s, 4.5e9]]"), `memory[0]: bytes "4.5e9" is not a whole number`),
		c("bytes past 2^64", pod("arrive: 0s, run: 1m, memory: [[0s, 99999999999999999999999]]"), `memory[0]: bytes "99999999999999999999999" is not a whole number`),
		c("null step", pod("arrive: 0s, run: 1m, memory: [[0s, 1], ~]"), "pods[0] (p): memory[1]: a memory step is [offset, bytes]"),
		c("step on its own line", head+"  - name: p\n    arrive: 0s\n    run: 1m\n    memory:\n      - [0s, 1]\n      - [1s, 2.5]\n",
			"inline.yaml:10", `pods[0] (p): memory[1]: bytes "2.5"`),
		c("fractional GPU memory", "gpu: {memoryTotalBytes: 1.0e10}\ninitialReplicas: 2\nduration: 1h\npods: []\n",
			"inline.yaml:1", `gpu.memoryTotalBytes "1.0e10" is not a whole number`),
		c("fractional replicas", "gpu: {memoryTotalBytes: 5}\ninitialReplicas: 2.5\nduration: 1h\npods: []\n",
			"inline.yaml:2", `initialReplicas "2.5" is not a whole number`),
		// yaml.v3 leaves a null item out of the decoded list: the pods
		// after it would be named by another index and line.
		c("null pod", head+"  -\n  - {name: a, arrive: 0s, run: 1m, memory: [[0s, 1]]}\n  - {name: b, arrive: 0s, run: -1s, memory: [[0s, 1]]}\n",
			"inline.yaml:5", "pods[0]: empty item"),
		c("second document", pod("arrive: 0s, run: 1m, memory: [[0s, 1]]")+"---\npods: [{name: q, arrive: 0s, run: 1m, memory: [[0s, 1]]}]\n",
			"inline.yaml:6", "a second YAML document"),
		c("second document that does not parse", pod("arrive: 0s, run: 1m, memory: [[0s, 1]]")+"---\ngarbage: [1,2\n",
			"after the first YAML document", "yaml: line"),
		c("duplicate name", head+"  - {name: p, arrive: 0s, run: 1m, memory: [[0s, 1]]}\n  - {name: p, arrive: 0s, run: 1m, memory: [[0s, 1]]}\n",
			"inline.yaml:6", "pods[1] (p): name already used by pods[0]"),
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTrace("inline.yaml", []byte(tc.yaml))
			if !errors.Is(err, ErrInvalidTrace) {
				t.Fatalf("err = %v, want ErrInvalidTrace", err)
			}
			msg := err.Error()
			for _, w := range tc.want {
				i := strings.Index(msg, w)
				if i < 0 {
					t.Fatalf("error %q lacks %q", msg, w)
				}
				msg = msg[i+len(w):]
			}
		})
	}
}

func TestReadTraceMissingFile(t *testing.T) {
	_, err := ReadTrace(t.TempDir() + "/nope.yaml")
	if !errors.Is(err, ErrInvalidTrace) || !strings.Contains(err.Error(), "nope.yaml") {
		t.Errorf("err = %v, want ErrInvalidTrace naming the file", err)
	}
}

// The shipped traces parse.
func TestShippedTracesParse(t *testing.T) {
	for _, name := range []string{"seed-a6000.yaml", "tiny.yaml", "collide.yaml", "queue.yaml"} {
		tr := mustRead(t, name)
		if len(tr.Pods) == 0 {
			t.Errorf("%s: no pods", name)
		}
	}
}

// What the stricter reading still takes: a trailing `---` (an empty second
// document drops nothing) and every whole number of bytes a uint64 holds.
func TestParseTraceAccepts(t *testing.T) {
	const body = "gpu: {memoryTotalBytes: 18446744073709551615}\ninitialReplicas: 2\nduration: 1h\npods:\n" +
		"  - {name: p, arrive: 0s, run: 1m, memory: [[0s, 0], [1s, 18446744073709551615]]}\n"
	for name, doc := range map[string]string{
		"one document":      body,
		"a trailing ---":    body + "---\n",
		"--- then comments": body + "---\n# nothing here\n",
	} {
		t.Run(name, func(t *testing.T) {
			tr := mustParse(t, doc)
			if tr.MemoryTotalBytes != 1<<64-1 || tr.Pods[0].Memory[1].Bytes != 1<<64-1 {
				t.Errorf("total %d, step %+v", tr.MemoryTotalBytes, tr.Pods[0].Memory)
			}
		})
	}
}

// A step decoded on its own (MemoryStep's UnmarshalYAML) is held to the
// same whole number of bytes.
func TestMemoryStepUnmarshal(t *testing.T) {
	var m MemoryStep
	if err := yaml.Unmarshal([]byte("[2h, 6442450944]"), &m); err != nil || m != (MemoryStep{2 * time.Hour, 6 * GiB}) {
		t.Errorf("got %+v, %v", m, err)
	}
	for _, bad := range []string{"[0s, 0.9]", "[0s, -1.0]", "[0s, -1]", "[0s]"} {
		if err := yaml.Unmarshal([]byte(bad), &m); err == nil {
			t.Errorf("%s: accepted as %+v", bad, m)
		}
	}
}
