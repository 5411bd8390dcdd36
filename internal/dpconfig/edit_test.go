package dpconfig

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// written is a config as a person writes it: comments, fields gpuslice does
// not own, four-space indentation.
const written = `# Time-slicing for the A6000 box.
version: v1
flags:
    migStrategy: none   # no MIG on this card
    failOnInitError: true
    plugin:
        deviceListStrategy: envvar
sharing:
    timeSlicing:
        renameByDefault: false
        failRequestsGreaterThanOne: true
        resources:
            # the whole card
            - name: nvidia.com/gpu
              replicas: 4 # tuned by gpuslice
imex: {channelIDs: [0]}
# end
`

func mustParse(t *testing.T, s string) *File {
	t.Helper()
	f, err := Parse([]byte(s))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	return f
}

func marshal(t *testing.T, f *File) string {
	t.Helper()
	out, err := f.Marshal()
	if err != nil {
		t.Fatalf("Marshal: %v", err)
	}
	return string(out)
}

func TestSetReplicasTextual(t *testing.T) {
	tests := []struct {
		name string
		in   string
		n    int
		want string
	}{
		{"raise", written, 6, strings.Replace(written, "replicas: 4 #", "replicas: 6 #", 1)},
		{"lower to two", written, 2, strings.Replace(written, "replicas: 4 #", "replicas: 2 #", 1)},
		{"more digits", written, 12, strings.Replace(written, "replicas: 4 #", "replicas: 12 #", 1)},
		{"every resource", "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 8}\n    - {name: mig-1g.5gb, replicas: 2}\n", 3,
			"sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: 3}\n    - {name: mig-1g.5gb, replicas: 3}\n"},
		{"JSON stays JSON", `{"version":"v1","sharing":{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","replicas":4}]}}}`, 7,
			`{"version":"v1","sharing":{"timeSlicing":{"resources":[{"name":"nvidia.com/gpu","replicas":7}]}}}`},
		{"non-ASCII before the number", "# Время\nsharing: {timeSlicing: {resources: [{name: gpu, \"x\": \"ü€\", replicas: 4}]}}\n", 5,
			"# Время\nsharing: {timeSlicing: {resources: [{name: gpu, \"x\": \"ü€\", replicas: 5}]}}\n"},
		{"CRLF line ends", "version: v1\r\nsharing:\r\n  timeSlicing:\r\n    resources:\r\n    - name: gpu\r\n      replicas: 4\r\n", 9,
			"version: v1\r\nsharing:\r\n  timeSlicing:\r\n    resources:\r\n    - name: gpu\r\n      replicas: 9\r\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustParse(t, tc.in)
			changed, err := f.SetReplicas(tc.n)
			if err != nil || !changed {
				t.Fatalf("SetReplicas(%d) = %v, %v; want true, nil", tc.n, changed, err)
			}
			if got := marshal(t, f); got != tc.want {
				t.Errorf("Marshal:\n%s\nwant:\n%s", got, tc.want)
			}
			if got := f.Replicas(); got != tc.n {
				t.Errorf("Replicas() = %d, want %d", got, tc.n)
			}
			for i, r := range f.Config().Resources {
				if r.Replicas != tc.n {
					t.Errorf("resources[%d].replicas = %d, want %d", i, r.Replicas, tc.n)
				}
			}
		})
	}
}

func TestSetReplicasNoOp(t *testing.T) {
	for _, tc := range []struct {
		in string
		n  int
	}{{written, 4}, {"version: v1\n", 1}, {"", 1}, {"sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n", 1}} {
		f := mustParse(t, tc.in)
		changed, err := f.SetReplicas(tc.n)
		if err != nil || changed {
			t.Errorf("SetReplicas(%d) on %q = %v, %v; want false, nil", tc.n, tc.in, changed, err)
		}
		if got := marshal(t, f); got != tc.in {
			t.Errorf("a no-op changed the bytes:\n%q\nwant\n%q", got, tc.in)
		}
	}
}

func TestSetReplicasToOneAndBack(t *testing.T) {
	f := mustParse(t, written)
	changed, err := f.SetReplicas(1)
	if err != nil || !changed {
		t.Fatalf("SetReplicas(1) = %v, %v", changed, err)
	}
	one := marshal(t, f)
	if strings.Contains(one, "sharing") || strings.Contains(one, "timeSlicing") {
		t.Errorf("exclusive config still has sharing:\n%s", one)
	}
	for _, keep := range []string{"# Time-slicing for the A6000 box.", "version: v1", "migStrategy: none", "# no MIG on this card",
		"failOnInitError: true", "deviceListStrategy: envvar", "imex: {channelIDs: [0]}", "# end"} {
		if !strings.Contains(one, keep) {
			t.Errorf("lost %q:\n%s", keep, one)
		}
	}
	if f.Replicas() != 1 || len(f.Config().Resources) != 0 || f.Config().FailRequestsGreaterThanOne {
		t.Errorf("Config after 1 = %+v", f.Config())
	}

	changed, err = f.SetReplicas(4)
	if err != nil || !changed {
		t.Fatalf("SetReplicas(4) = %v, %v", changed, err)
	}
	want := Config{Version: "v1", MigStrategy: "none", Resources: []Resource{{Name: GPUResource, Devices: Devices{All: true}, Replicas: 4}},
		DeviceListStrategy: []string{"envvar"}}
	if diff := cmp.Diff(want, f.Config()); diff != "" {
		t.Errorf("Config after 4 (-want +got):\n%s", diff)
	}
	back := marshal(t, f)
	wantBack := strings.TrimSuffix(one, "# end\n") +
		"sharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 4\n# end\n"
	if back != wantBack {
		t.Errorf("back at 4:\n%s\nwant:\n%s", back, wantBack)
	}
}

func TestSetReplicasStructural(t *testing.T) {
	tests := []struct {
		name  string
		in    string
		n     int
		check func(t *testing.T, out string)
	}{
		{"empty file gets a whole config", "", 3, func(t *testing.T, out string) {
			if out != "version: v1\nsharing:\n  timeSlicing:\n    resources:\n      - name: nvidia.com/gpu\n        replicas: 3\n" {
				t.Errorf("got:\n%s", out)
			}
		}},
		{"null sharing is replaced", "version: v1\nsharing:\n", 2, func(t *testing.T, out string) {
			if !strings.Contains(out, "replicas: 2") {
				t.Errorf("got:\n%s", out)
			}
		}},
		{"other sharing fields stay when going to 1", "sharing:\n  timeSlicing: {resources: [{name: gpu, replicas: 2}]}\n  future: {x: 1}\n", 1, func(t *testing.T, out string) {
			if out != "sharing:\n  future: {x: 1}\n" {
				t.Errorf("got:\n%s", out)
			}
		}},
		{"JSON without sharing gets JSON-looking sharing", `{"version": "v1", "flags": {"migStrategy": "none"}}`, 4, func(t *testing.T, out string) {
			if !json.Valid([]byte(out)) {
				t.Errorf("not JSON:\n%s", out)
			}
		}},
		{"an aliased value is replaced, not its anchor", "x-default: &r 3\nsharing: {timeSlicing: {resources: [{name: gpu, replicas: *r}]}}\n", 5, func(t *testing.T, out string) {
			if !strings.Contains(out, "x-default: &r 3") || !strings.Contains(out, "replicas: 5") {
				t.Errorf("got:\n%s", out)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := mustParse(t, tc.in)
			changed, err := f.SetReplicas(tc.n)
			if err != nil || !changed {
				t.Fatalf("SetReplicas(%d) = %v, %v", tc.n, changed, err)
			}
			out := marshal(t, f)
			tc.check(t, out)
			again := mustParse(t, out)
			if diff := cmp.Diff(f.Config(), again.Config()); diff != "" {
				t.Errorf("Marshal → Parse (-before +after):\n%s", diff)
			}
			if again.Replicas() != tc.n {
				t.Errorf("Replicas after re-parse = %d, want %d", again.Replicas(), tc.n)
			}
		})
	}
}

func TestSetReplicasErrors(t *testing.T) {
	f := mustParse(t, written)
	for _, n := range []int{0, -3} {
		if _, err := f.SetReplicas(n); !errors.Is(err, ErrInvalid) {
			t.Errorf("SetReplicas(%d) = %v, want ErrInvalid", n, err)
		}
	}
	if got := marshal(t, f); got != written {
		t.Errorf("a failed SetReplicas changed the file:\n%s", got)
	}
	mps := mustParse(t, "sharing: {mps: {resources: [{name: gpu, replicas: 2}]}}\n")
	if _, err := mps.SetReplicas(3); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "mutually exclusive") {
		t.Errorf("SetReplicas(3) with MPS = %v, want a mutually-exclusive ErrInvalid", err)
	}
}

// TestSetReplicasLeavesAnchoredFields: a field that shares a YAML anchor
// with the replicas or with sharing is not changed through it by an edit in
// place. Where the replicas are an alias of another field, the alias is
// replaced; where the other field is an alias of what the edit would
// change, the edit is refused, naming what to write instead, and the file
// stays as it was. Replicas aliased within sharing.timeSlicing itself are
// all the tuner's.
func TestSetReplicasLeavesAnchoredFields(t *testing.T) {
	for _, tc := range []struct {
		name, doc string
		n         int
	}{
		{"replicas anchored here, aliased outside", "sharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: &r 4\nx-count: *r\n", 6},
		{"sharing is another field's mapping", "common: &s\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: 4\nsharing: *s\n", 1},
		{"mps replicas anchored here, aliased outside", "sharing:\n  mps:\n    resources:\n    - name: gpu\n      replicas: &r 4\nx-count: *r\n", 6},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := mustParse(t, tc.doc)
			_, err := f.SetSharedReplicasInPlace(tc.n)
			if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "YAML anchor") {
				t.Errorf("SetSharedReplicasInPlace(%d) = %v, want ErrInvalid naming the anchor", tc.n, err)
			}
			if got := marshal(t, f); got != tc.doc {
				t.Errorf("a refused edit changed the file:\n%s", got)
			}
		})
	}
	for _, tc := range []struct{ name, doc, keep string }{
		{"replicas an alias of another field", "x-count: &r 4\nsharing:\n  timeSlicing:\n    resources:\n    - name: gpu\n      replicas: *r\n", "x-count: &r 4"},
		{"replicas aliased within sharing.timeSlicing", "sharing:\n  timeSlicing:\n    resources:\n    - {name: gpu, replicas: &r 4}\n    - {name: gpu-b, rename: b, replicas: *r}\n", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := mustParse(t, tc.doc)
			if _, err := f.SetSharedReplicasInPlace(6); err != nil {
				t.Fatal(err)
			}
			for _, r := range f.Config().Resources {
				if r.Replicas != 6 {
					t.Errorf("after SetReplicas(6): %+v", f.Config().Resources)
				}
			}
			if got := marshal(t, f); !strings.Contains(got, tc.keep) {
				t.Errorf("after SetReplicas(6) the file lost %q:\n%s", tc.keep, got)
			}
		})
	}
}

func TestUnknownFieldsAndCommentsSurviveReencoding(t *testing.T) {
	f := mustParse(t, written)
	if _, err := f.SetReplicas(1); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SetReplicas(5); err != nil {
		t.Fatal(err)
	}
	if _, err := f.SetReplicas(3); err != nil {
		t.Fatal(err)
	}
	out := marshal(t, f)
	order := []string{"# Time-slicing", "version: v1", "flags:", "migStrategy: none", "# no MIG on this card", "failOnInitError: true",
		"plugin:", "deviceListStrategy: envvar", "imex:", "sharing:", "replicas: 3"}
	at := 0
	for _, s := range order {
		i := strings.Index(out[at:], s)
		if i < 0 {
			t.Fatalf("%q missing or out of order in:\n%s", s, out)
		}
		at += i
	}
}

// FuzzRoundTrip: whatever parses comes back equal through Marshal (whose
// output, parsed again, marshals to the same bytes), the encoder keeps the
// config, and SetReplicas leaves a document that says exactly what was asked.
func FuzzRoundTrip(f *testing.F) {
	for _, s := range []string{written, "", "version: v1\n", `{"sharing":{"timeSlicing":{"resources":[{"name":"gpu","replicas":2}]}}}`,
		"x: &r 3\nsharing: {timeSlicing: {renameByDefault: true, resources: [{name: gpu, replicas: *r, devices: [0, 1]}]}}\n",
		"sharing:\n  mps: {x: 1}\n", "sharing:\n  mps: # hard limits\n    failRequestsGreaterThanOne: false\n    resources: [{name: gpu, replicas: 4}]\n", "flags: {migStrategy: mixed}\nsharing: {timeSlicing: {resources: [{name: mig-1g.5gb, devices: 1, replicas: 7}]}}\n"} {
		f.Add([]byte(s), uint8(3))
	}
	f.Fuzz(func(t *testing.T, data []byte, k uint8) {
		file, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("Parse error %v does not wrap ErrInvalid", err)
			}
			return
		}
		out, err := file.Marshal()
		if err != nil {
			t.Fatalf("Marshal: %v", err)
		}
		again, err := Parse(out)
		if err != nil {
			t.Fatalf("Parse(Marshal()) = %v\n%s", err, out)
		}
		if diff := cmp.Diff(file.Config(), again.Config()); diff != "" {
			t.Fatalf("Config changed through Marshal (-before +after):\n%s", diff)
		}
		if out2, _ := again.Marshal(); !bytes.Equal(out, out2) {
			t.Fatalf("Marshal is not a fixed point:\n%s\nthen\n%s", out, out2)
		}

		// The encoder, used for structural edits, keeps the config and
		// settles: yaml.v3 may move a comment's blank line once, never
		// again after that.
		rounds := [][]byte{}
		doc := file.doc
		for i := 0; i < 3; i++ {
			enc, err := encode(doc)
			if err != nil || enc == nil {
				break
			}
			next, err := Parse(enc)
			if err != nil {
				t.Fatalf("encoded document does not parse: %v\n%s", err, enc)
			}
			if diff := cmp.Diff(file.Config(), next.Config()); diff != "" {
				t.Fatalf("Config changed through the encoder (-before +after):\n%s", diff)
			}
			rounds, doc = append(rounds, enc), next.doc
		}
		if len(rounds) == 3 && !bytes.Equal(rounds[1], rounds[2]) {
			t.Fatalf("encoder does not settle:\n%s\nthen\n%s", rounds[1], rounds[2])
		}

		n := int(k%6) + 1
		before := file.Config()
		changed, err := file.SetReplicas(n)
		if err != nil {
			if before.MPS && n > 1 && len(before.Resources) == 0 {
				return // no time-slicing beside MPS
			}
			// Structural edits of documents whose anchors the edit
			// would orphan are refused; the file must be intact.
			if after := file.Config(); !cmp.Equal(before, after) {
				t.Fatalf("failed SetReplicas(%d) changed the config: %v", n, err)
			}
			return
		}
		got := file.Config()
		if n == 1 && len(got.Resources) != 0 || n > 1 && len(got.Resources) == 0 {
			t.Fatalf("SetReplicas(%d) left resources %+v", n, got.Resources)
		}
		for _, r := range got.Resources {
			if r.Replicas != n {
				t.Fatalf("SetReplicas(%d) left %+v", n, r)
			}
		}
		if changed == cmp.Equal(before, got) {
			t.Fatalf("SetReplicas(%d) changed=%v but config went from %+v to %+v", n, changed, before, got)
		}
		out2, _ := file.Marshal()
		if !changed && !bytes.Equal(out, out2) {
			t.Fatalf("a no-op SetReplicas changed the bytes")
		}
		edited, err := Parse(out2)
		if err != nil {
			t.Fatalf("Parse after SetReplicas(%d): %v\n%s", n, err, out2)
		}
		out3, _ := edited.Marshal()
		if !cmp.Equal(got, edited.Config()) || !bytes.Equal(out2, out3) {
			t.Fatalf("SetReplicas(%d) output does not round-trip:\n%s", n, out2)
		}
	})
}
