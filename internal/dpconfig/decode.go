package dpconfig

import (
	"fmt"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// Field names of the document, as NVIDIA spells them.
const (
	keyVersion      = "version"
	keyFlags        = "flags"
	keyMig          = "migStrategy"
	keySharing      = "sharing"
	keyTimeSlice    = "timeSlicing"
	keyMPS          = "mps"
	keyRenameDef    = "renameByDefault"
	keyFailGT1      = "failRequestsGreaterThanOne"
	keyResources    = "resources"
	keyName         = "name"
	keyRename       = "rename"
	keyDevices      = "devices"
	keyReplicas     = "replicas"
	resourceNS      = "nvidia.com/"
	keyPlugin       = "plugin"
	keyListStrategy = "deviceListStrategy"
	keyIDStrategy   = "deviceIDStrategy"
	keyCDIPrefix    = "cdiAnnotationPrefix"
	pathPlugin      = keyFlags + "." + keyPlugin
	pathTimeSlice   = keySharing + "." + keyTimeSlice
	pathResources   = pathTimeSlice + "." + keyResources
	pathMPS         = keySharing + "." + keyMPS
	pathMPSRes      = pathMPS + "." + keyResources
)

// fields are the field names of the document.
var fields = []string{keyVersion, keyFlags, keyMig, keySharing, keyTimeSlice, keyMPS, keyRenameDef, keyFailGT1,
	keyResources, keyName, keyRename, keyDevices, keyReplicas, keyPlugin, keyListStrategy, keyIDStrategy, keyCDIPrefix}

// foldedField returns the field name key spells in another case.
func foldedField(key string) (string, bool) {
	for _, f := range fields {
		if key != f && strings.EqualFold(key, f) {
			return f, true
		}
	}
	return "", false
}

// lineMap remembers the line of every field path decode saw, so that errors
// found later by validate can point into the document.
type lineMap map[string]int

// find returns the line of path or of its nearest ancestor.
func (m lineMap) find(path string) int {
	for path != "" {
		if l, ok := m[path]; ok {
			return l
		}
		i := strings.LastIndexAny(path, ".[")
		if i < 0 {
			break
		}
		path = path[:i]
	}
	return 0
}

// decoder walks the YAML tree of a config and collects what it says and
// every type error in it.
type decoder struct {
	lines lineMap
	errs  Errors
}

func (d *decoder) fail(path string, n *yaml.Node, format string, args ...any) {
	line := 0
	if n != nil {
		line = n.Line
	}
	d.errs = append(d.errs, &FieldError{Path: path, Line: line, Msg: fmt.Sprintf(format, args...)})
}

func decode(doc *yaml.Node) (Config, lineMap, Errors) {
	d := &decoder{lines: lineMap{}}
	c := Config{Version: Version, MigStrategy: "none"}
	if len(doc.Content) == 0 {
		return c, d.lines, nil
	}
	root := resolve(doc.Content[0])
	if isNull(root) {
		return c, d.lines, nil
	}
	top := d.mapping(root, "")
	if top == nil {
		return c, d.lines, d.errs
	}
	if v := top[keyVersion]; v != nil {
		if s, ok := d.str(v, keyVersion); ok {
			c.Version = s
		}
	}
	if flags := d.mapping(top[keyFlags], keyFlags); flags != nil {
		if v := flags[keyMig]; v != nil {
			if s, ok := d.str(v, keyFlags+"."+keyMig); ok {
				c.MigStrategy = s
			}
		}
		if plugin := d.mapping(flags[keyPlugin], pathPlugin); plugin != nil {
			if v := plugin[keyListStrategy]; v != nil {
				c.DeviceListStrategy = d.strings(v, pathPlugin+"."+keyListStrategy)
			}
			if v := plugin[keyIDStrategy]; v != nil {
				c.DeviceIDStrategy, _ = d.str(v, pathPlugin+"."+keyIDStrategy)
			}
			if v := plugin[keyCDIPrefix]; v != nil {
				c.CDIAnnotationPrefix, _ = d.str(v, pathPlugin+"."+keyCDIPrefix)
			}
		}
	}
	sharing := d.mapping(top[keySharing], keySharing)
	if sharing == nil {
		return c, d.lines, d.errs
	}
	if mps := d.mapping(sharing[keyMPS], pathMPS); mps != nil {
		c.MPS = true
		// NVIDIA keeps its historical MPS behaviour unless the file
		// relaxes it (api/config/v1 config.go).
		c.MPSSharing.FailRequestsGreaterThanOne = true
		c.MPSSharing.Resources = d.replicated(mps, pathMPS, &c.MPSSharing.RenameByDefault, &c.MPSSharing.FailRequestsGreaterThanOne,
			"no resources specified (leave out sharing.mps for exclusive GPUs)")
	} else if sharing[keyMPS] != nil {
		c.MPS = true // not a mapping: reported by mapping
	}
	if ts := d.mapping(sharing[keyTimeSlice], pathTimeSlice); ts != nil {
		c.Resources = d.replicated(ts, pathTimeSlice, &c.RenameByDefault, &c.FailRequestsGreaterThanOne,
			"no resources specified (leave out sharing.timeSlicing for exclusive GPUs)")
	}
	return c, d.lines, d.errs
}

// replicated reads one sharing strategy's section (sharing.timeSlicing or
// sharing.mps: the same shape, NVIDIA's ReplicatedResources).
func (d *decoder) replicated(m map[string]*yaml.Node, base string, renameByDefault, failGT1 *bool, noResources string) []Resource {
	if v := m[keyRenameDef]; v != nil {
		*renameByDefault, _ = d.boolean(v, base+"."+keyRenameDef)
	}
	if v := m[keyFailGT1]; v != nil {
		*failGT1, _ = d.boolean(v, base+"."+keyFailGT1)
	}
	path := base + "." + keyResources
	res := m[keyResources]
	if res == nil || (res.Kind == yaml.SequenceNode && len(res.Content) == 0) {
		d.fail(path, res, "%s", noResources)
		return nil
	}
	if res.Kind != yaml.SequenceNode {
		d.fail(path, res, "must be a list, got %s", describe(res))
		return nil
	}
	var out []Resource
	for i, item := range res.Content {
		ipath := fmt.Sprintf("%s[%d]", path, i)
		d.lines[ipath] = item.Line
		if r, ok := d.resource(resolve(item), ipath); ok {
			out = append(out, r)
		}
	}
	return out
}

func (d *decoder) resource(n *yaml.Node, path string) (Resource, bool) {
	var r Resource
	fields := d.mapping(n, path)
	if fields == nil {
		if !isNull(n) {
			return r, false
		}
		d.fail(path, n, "empty resource")
		return r, false
	}
	before := len(d.errs)
	if v := fields[keyName]; v != nil {
		if s, ok := d.str(v, path+"."+keyName); ok {
			r.Name = qualify(s)
		}
	} else {
		d.fail(path+"."+keyName, n, "no resource name specified")
	}
	if v := fields[keyRename]; v != nil {
		if s, ok := d.str(v, path+"."+keyRename); ok {
			r.Rename = qualify(s)
		}
	}
	if v := fields[keyDevices]; v != nil {
		r.Devices = d.devices(v, path+"."+keyDevices)
	} else {
		r.Devices.All = true // NVIDIA's default
	}
	if v := fields[keyReplicas]; v != nil {
		r.Replicas, _ = d.integer(v, path+"."+keyReplicas)
	} else {
		d.fail(path+"."+keyReplicas, n, "no replicas specified")
	}
	return r, len(d.errs) == before
}

func (d *decoder) devices(n *yaml.Node, path string) Devices {
	var dv Devices
	switch {
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!str":
		if n.Value != "all" {
			d.fail(path, n, "devices set as %q but the only valid string is \"all\"", n.Value)
		}
		dv.All = true
	case n.Kind == yaml.ScalarNode && n.ShortTag() == "!!int":
		dv.Count, _ = d.integer(n, path)
		if dv.Count <= 0 {
			d.fail(path, n, "a count of devices must be > 0, got %s", n.Value)
		}
	case n.Kind == yaml.SequenceNode:
		dv.List = make([]string, 0, len(n.Content))
		for j, it := range n.Content {
			it = resolve(it)
			ipath := fmt.Sprintf("%s[%d]", path, j)
			d.lines[ipath] = it.Line
			switch {
			case it.Kind == yaml.ScalarNode && it.ShortTag() == "!!int":
				if v, ok := d.integer(it, ipath); ok {
					dv.List = append(dv.List, strconv.Itoa(v))
				}
			case it.Kind == yaml.ScalarNode && it.ShortTag() == "!!str":
				dv.List = append(dv.List, it.Value)
			default:
				d.fail(ipath, it, "must be a GPU index or UUID, got %s", describe(it))
			}
		}
	default:
		d.fail(path, n, "must be \"all\", a count or a list, got %s", describe(n))
	}
	return dv
}

// mapping returns the entries of a mapping node by key, nil for an absent or
// null node (and, with an error, for anything else). Duplicate keys and merge
// keys are errors: NVIDIA's reader would keep one of them silently.
func (d *decoder) mapping(n *yaml.Node, path string) map[string]*yaml.Node {
	n = resolve(n)
	if isNull(n) {
		return nil
	}
	if path != "" {
		if _, seen := d.lines[path]; !seen {
			d.lines[path] = n.Line
		}
	}
	if n.Kind != yaml.MappingNode {
		d.fail(path, n, "must be a mapping, got %s", describe(n))
		return nil
	}
	out := make(map[string]*yaml.Node, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := resolve(n.Content[i]), resolve(n.Content[i+1])
		kpath := join(path, k.Value)
		if k.Kind != yaml.ScalarNode {
			d.fail(path, k, "keys must be plain strings")
			continue
		}
		if k.ShortTag() == "!!merge" {
			d.fail(kpath, k, "merge keys (<<) are not supported")
			continue
		}
		if _, dup := out[k.Value]; dup {
			d.fail(kpath, k, "key %q defined twice", k.Value)
			continue
		}
		if f, ok := foldedField(k.Value); ok {
			// NVIDIA reads its config as JSON, whose field names match in
			// any case: `Sharing` shares its GPUs there, and would be an
			// unknown field here (read as no sharing, and a raise would
			// add a second `sharing`).
			d.fail(kpath, k, "%q is read as %q by NVIDIA's plugin (its keys match in any case) but not here: spell it %q", k.Value, f, f)
			continue
		}
		d.lines[kpath] = k.Line
		if isNull(v) {
			v = nil // an empty value reads as an absent field
		}
		out[k.Value] = v
	}
	return out
}

func (d *decoder) str(n *yaml.Node, path string) (string, bool) {
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		d.fail(path, n, "must be a string, got %s", describe(n))
		return "", false
	}
	return n.Value, true
}

// yaml11Bools are the plain scalars YAML 1.1 reads as booleans beyond
// true/false. NVIDIA's plugin parses its config with sigs.k8s.io/yaml
// (go-yaml v2, YAML 1.1), so `renameByDefault: yes` means true there.
var yaml11Bools = map[string]bool{
	"y": true, "Y": true, "yes": true, "Yes": true, "YES": true, "on": true, "On": true, "ON": true,
	"n": false, "N": false, "no": false, "No": false, "NO": false, "off": false, "Off": false, "OFF": false,
}

func (d *decoder) boolean(n *yaml.Node, path string) (bool, bool) {
	if v, ok := yaml11Bools[n.Value]; ok && n.Kind == yaml.ScalarNode && n.Style == 0 { // plain: not quoted, no explicit tag
		return v, true
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		d.fail(path, n, "must be true or false, got %s", describe(n))
		return false, false
	}
	return b, true
}

// strings reads a string or a list of strings, as NVIDIA reads
// deviceListStrategy.
func (d *decoder) strings(n *yaml.Node, path string) []string {
	n = resolve(n)
	if n.Kind != yaml.SequenceNode {
		if s, ok := d.str(n, path); ok {
			return []string{s}
		}
		return nil
	}
	out := []string{}
	for i, item := range n.Content {
		if s, ok := d.str(resolve(item), fmt.Sprintf("%s[%d]", path, i)); ok {
			out = append(out, s)
		}
	}
	return out
}

func (d *decoder) integer(n *yaml.Node, path string) (int, bool) {
	var v int
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!int" {
		d.fail(path, n, "must be an integer, got %s", describe(n))
		return 0, false
	}
	if err := n.Decode(&v); err != nil {
		d.fail(path, n, "integer %s out of range", n.Value)
		return 0, false
	}
	return v, true
}

func resolve(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 100; i++ {
		n = n.Alias
	}
	return n
}

func isNull(n *yaml.Node) bool {
	return n == nil || (n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null")
}

func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%s %q", strings.TrimPrefix(n.ShortTag(), "!!"), n.Value)
	default:
		return "an alias"
	}
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// qualify adds NVIDIA's resource prefix to a name written without it, as
// NVIDIA's plugin does.
func qualify(name string) string {
	if strings.HasPrefix(name, resourceNS) {
		return name
	}
	return resourceNS + name
}
