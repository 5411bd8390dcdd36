package dpconfig

import (
	"bytes"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"unicode/utf8"

	"gopkg.in/yaml.v3"
)

// SetReplicas gives every time-slicing resource n replicas. Without any
// time-slicing resource it adds {name: nvidia.com/gpu, replicas: n}. n == 1
// means exclusive GPUs: sharing.timeSlicing is removed (with its
// renameByDefault and failRequestsGreaterThanOne), and sharing too when
// nothing else is left in it. It reports whether the document changed; a call
// that changes nothing leaves the bytes exactly as they were.
//
// A change of replicas alone rewrites only the numbers in the original text.
// Adding or removing sharing.timeSlicing writes the document again with the
// YAML encoder (see Marshal).
func (f *File) SetReplicas(n int) (changed bool, err error) {
	if n < 1 {
		return false, &FieldError{Path: pathResources, Msg: fmt.Sprintf("replicas must be >= 1, got %d", n)}
	}
	want := f.Config()
	switch {
	case n == 1:
		if len(want.Resources) == 0 {
			return false, nil
		}
		want.Resources, want.RenameByDefault, want.FailRequestsGreaterThanOne = nil, false, false
	case len(want.Resources) == 0:
		if want.MPS {
			return false, &FieldError{Path: keySharing, Msg: "sharing.mps is set; time-slicing and MPS are mutually exclusive"}
		}
		want.Resources = []Resource{{Name: GPUResource, Devices: Devices{All: true}, Replicas: n}}
	default:
		same := true
		for i := range want.Resources {
			same = same && want.Resources[i].Replicas == n
			want.Resources[i].Replicas = n
		}
		if same {
			return false, nil
		}
	}

	// Edit a fresh tree of the same bytes, so that f stays as it was when
	// anything below fails.
	doc, err := parseDocument(f.data)
	if err != nil {
		return false, err
	}
	var data []byte
	switch {
	case n == 1:
		removeTimeSlicing(doc)
	case len(f.cfg.Resources) == 0:
		addTimeSlicing(doc, n)
	default:
		data = setReplicaValues(f.data, doc, keyTimeSlice, n)
	}
	if data == nil {
		if data, err = encode(doc); err != nil {
			return false, fmt.Errorf("writing config: %w", err)
		}
	}
	next, err := Parse(data)
	if err != nil {
		return false, fmt.Errorf("config after setting replicas to %d does not parse: %w", n, err)
	}
	if !reflect.DeepEqual(next.cfg, want) {
		return false, fmt.Errorf("config after setting replicas to %d reads %+v, want %+v", n, next.cfg, want)
	}
	*f = *next
	return true, nil
}

// SetSharedReplicasInPlace is SetSharedReplicas for a config edited where
// its author keeps it (restart mode's one key), not a copy the tuner owns:
// it also refuses an edit that would change a field outside
// sharing.<mode> through a YAML anchor (sameBeyond), leaving f as it was.
func (f *File) SetSharedReplicasInPlace(n int) (changed bool, err error) {
	before, mode := f.data, keyTimeSlice
	if f.cfg.MPS {
		mode = keyMPS
	}
	next := *f
	if changed, err = next.SetSharedReplicas(n); err != nil || !changed {
		return false, err
	}
	if err := sameBeyond(before, next.data, mode); err != nil {
		return false, err
	}
	*f = next
	return true, nil
}

// sameBeyond checks that an edit of sharing.<mode> changed nothing else in
// the document. A YAML anchor makes one node serve several fields: the
// replicas of `replicas: &r 4` are also those of a field elsewhere that
// says *r, and a `sharing: *s` is the mapping anchored at another field;
// edited in place, that other field would change too. Compared as the
// documents read, aliases followed, with sharing.<mode> left out (and
// sharing where nothing else is in it).
func sameBeyond(before, after []byte, mode string) error {
	outside := func(data []byte) (any, error) {
		var v any
		if err := yaml.Unmarshal(data, &v); err != nil {
			return nil, err
		}
		if v == nil {
			v = map[string]any{} // an empty file: every field its default
		}
		if root, ok := v.(map[string]any); ok {
			if root[keyVersion] == Version {
				delete(root, keyVersion) // the default, written into an empty file
			}
			if sharing, ok := root[keySharing].(map[string]any); ok {
				delete(sharing, mode)
				if len(sharing) == 0 {
					delete(root, keySharing)
				}
			} else if root[keySharing] == nil {
				delete(root, keySharing)
			}
		}
		return v, nil
	}
	b, err := outside(before)
	if err != nil {
		return err
	}
	a, err := outside(after)
	if err != nil {
		return err
	}
	if !reflect.DeepEqual(a, b) {
		return &FieldError{Path: keySharing + "." + mode, Msg: "shares a YAML anchor with another field, which a change of its replicas would change too; write " +
			keySharing + "." + mode + " without anchors and aliases"}
	}
	return nil
}

// encode writes a document with the YAML encoder.
func encode(doc *yaml.Node) ([]byte, error) {
	if len(doc.Content) == 0 || isNull(resolve(doc.Content[0])) {
		return nil, nil // nothing but defaults
	}
	spellFlowNulls(doc, false)
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// spellFlowNulls writes empty nulls inside flow collections as "null": the
// encoder would quote them, turning `{"sharing"}` into the string ”.
func spellFlowNulls(n *yaml.Node, flow bool) {
	flow = flow || n.Style&yaml.FlowStyle != 0
	if flow && n.Kind == yaml.ScalarNode && n.Value == "" && n.ShortTag() == "!!null" {
		n.Value = "null"
	}
	for _, c := range n.Content {
		spellFlowNulls(c, flow)
	}
}

// replicaNodes returns, for every resource under sharing.<mode>
// (timeSlicing or mps), the mapping that holds its replicas and the index
// of the value in that mapping's Content.
func replicaNodes(doc *yaml.Node, mode string) (maps []*yaml.Node, idx []int) {
	ts := child(child(resolve(doc.Content[0]), keySharing), mode)
	res := child(ts, keyResources)
	if res == nil {
		return nil, nil
	}
	for _, item := range res.Content {
		m := resolve(item)
		if i := keyIndex(m, keyReplicas); i >= 0 {
			maps, idx = append(maps, m), append(idx, i+1)
		}
	}
	return maps, idx
}

// setReplicaValues sets every replicas value under sharing.<mode> to n. Where each value is a
// plain number in the text, it returns the original bytes with just those
// numbers replaced, so formatting and comments stay exactly as written;
// otherwise it changes the tree and returns nil.
func setReplicaValues(data []byte, doc *yaml.Node, mode string, n int) []byte {
	maps, idx := replicaNodes(doc, mode)
	value := strconv.Itoa(n)
	type splice struct{ off, end int }
	var splices []splice
	textual := true
	for k, m := range maps {
		v := m.Content[idx[k]]
		if v.Kind != yaml.ScalarNode || v.Style != 0 {
			textual = false
			break
		}
		off, ok := offsetOf(data, v.Line, v.Column)
		if !ok || !bytes.HasPrefix(data[off:], []byte(v.Value)) {
			textual = false
			break
		}
		s := splice{off, off + len(v.Value)}
		if !slices.Contains(splices, s) { // one node reached through aliases
			splices = append(splices, s)
		}
	}
	if textual {
		slices.SortFunc(splices, func(a, b splice) int { return b.off - a.off })
		out := bytes.Clone(data)
		for _, s := range splices {
			out = slices.Concat(out[:s.off], []byte(value), out[s.end:])
		}
		return out
	}
	for k, m := range maps {
		v := m.Content[idx[k]]
		if v.Kind == yaml.AliasNode {
			// Replace the alias rather than change the value it
			// points at, which may serve other fields.
			m.Content[idx[k]] = &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!int", Value: value}
			continue
		}
		v.Value, v.Tag, v.Style = value, "!!int", 0
	}
	return nil
}

// offsetOf converts a YAML position (1-based line, 1-based column counted in
// characters) into a byte offset.
func offsetOf(data []byte, line, col int) (int, bool) {
	off := 0
	for l := 1; l < line; l++ {
		i := bytes.IndexByte(data[off:], '\n')
		if i < 0 {
			return 0, false
		}
		off += i + 1
	}
	for c := 1; c < col; c++ {
		if off >= len(data) || data[off] == '\n' {
			return 0, false
		}
		_, size := utf8.DecodeRune(data[off:])
		off += size
	}
	return off, off <= len(data)
}

func addTimeSlicing(doc *yaml.Node, n int) {
	if len(doc.Content) == 0 || isNull(resolve(doc.Content[0])) {
		root := &yaml.Node{Kind: yaml.MappingNode}
		root.Content = append(root.Content, scalar(keyVersion, 0), scalar(Version, 0))
		doc.Content = []*yaml.Node{root}
	}
	root := resolve(doc.Content[0])
	// Follow the document's own look: JSON input gets quoted keys in flow
	// style, YAML input plain keys in block style.
	var style yaml.Style
	if root.Style&yaml.FlowStyle != 0 {
		style = yaml.FlowStyle
	}
	var quote yaml.Style
	if len(root.Content) > 0 && root.Content[0].Style&yaml.DoubleQuotedStyle != 0 {
		quote = yaml.DoubleQuotedStyle
	}
	resource := &yaml.Node{Kind: yaml.MappingNode, Style: style, Content: []*yaml.Node{
		scalar(keyName, quote), scalar(GPUResource, quote),
		scalar(keyReplicas, quote), {Kind: yaml.ScalarNode, Tag: "!!int", Value: strconv.Itoa(n)},
	}}
	ts := &yaml.Node{Kind: yaml.MappingNode, Style: style, Content: []*yaml.Node{
		scalar(keyResources, quote), {Kind: yaml.SequenceNode, Style: style, Content: []*yaml.Node{resource}},
	}}
	sharing := setChild(root, keySharing, &yaml.Node{Kind: yaml.MappingNode, Style: style}, quote)
	setChild(sharing, keyTimeSlice, ts, quote)
}

func removeTimeSlicing(doc *yaml.Node) {
	root := resolve(doc.Content[0])
	si := keyIndex(root, keySharing)
	raw := root.Content[si+1]
	sharing := resolve(raw)
	ti := keyIndex(sharing, keyTimeSlice)
	sharing.Content = slices.Delete(sharing.Content, ti, ti+2)
	if len(sharing.Content) == 0 && raw.Kind != yaml.AliasNode && raw.Anchor == "" {
		root.Content = slices.Delete(root.Content, si, si+2)
	}
}

// setChild returns the mapping under key in m, putting value there when the
// key is absent or null.
func setChild(m *yaml.Node, key string, value *yaml.Node, quote yaml.Style) *yaml.Node {
	i := keyIndex(m, key)
	if i < 0 {
		k := scalar(key, quote)
		if n := len(m.Content); n >= 2 {
			// A comment below the last field closes the mapping;
			// keep it below the field added after it.
			k.FootComment, m.Content[n-2].FootComment = m.Content[n-2].FootComment, ""
		}
		m.Content = append(m.Content, k, value)
		return value
	}
	if v := resolve(m.Content[i+1]); !isNull(v) {
		return v
	}
	m.Content[i+1] = value
	return value
}

func scalar(value string, style yaml.Style) *yaml.Node {
	return &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value, Style: style}
}

// child returns the resolved value under key in mapping m, nil when m is not
// a mapping or has no such key.
func child(m *yaml.Node, key string) *yaml.Node {
	if i := keyIndex(m, key); i >= 0 {
		return resolve(m.Content[i+1])
	}
	return nil
}

func keyIndex(m *yaml.Node, key string) int {
	if m == nil || m.Kind != yaml.MappingNode {
		return -1
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if resolve(m.Content[i]).Value == key {
			return i
		}
	}
	return -1
}
