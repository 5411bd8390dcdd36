// Package dpconfig reads, checks and rewrites the configuration file of
// NVIDIA's k8s-device-plugin (version v1), the format both NVIDIA's plugin and
// gpuslice-plugin read. It owns the sharing part of the file
// (sharing.timeSlicing, sharing.mps and flags.migStrategy); every other field,
// comment and key order survives a rewrite, so a tuner can change replicas in
// a file a person wrote without destroying what else it says. Rewrites change
// time-slicing only; sharing.mps is read and validated, and kept as written.
//
// The rules are NVIDIA's, so that a file accepted here is accepted by NVIDIA's
// plugin too: version "v1" (an absent version means v1), at least two replicas
// per time-sliced resource, resource names under nvidia.com/ that are valid
// Kubernetes names of at most 63 characters, "devices" as "all", a positive
// count or a list of GPU/MIG indexes and UUIDs, and migStrategy none, single or
// mixed. A few rules are stricter than NVIDIA's where NVIDIA would silently do
// something other than what the file says: duplicate resource names, an
// explicit rename that renameByDefault would override, an empty device list,
// and sharing.mps together with sharing.timeSlicing (NVIDIA lets MPS win).
//
// sharing.mps has the same shape as sharing.timeSlicing and NVIDIA's
// (v0.19) rules for it: resources required, replicas >= 2, and
// failRequestsGreaterThanOne true when absent. NVIDIA's plugin and its
// mps-control-daemon ignore an MPS entry's "devices" and "rename" (they share
// every GPU, under the name or name.shared) and refuse MPS with
// migStrategy mixed; this package rejects those instead of ignoring them.
package dpconfig

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"

	"gopkg.in/yaml.v3"
)

// ErrInvalid is wrapped by every error about the content of a config.
var ErrInvalid = errors.New("invalid device-plugin config")

// Version is the only config version NVIDIA's plugin (and this package) reads.
const Version = "v1"

// GPUResource is the resource NVIDIA's plugin advertises full GPUs under.
const GPUResource = "nvidia.com/gpu"

// SharedSuffix is appended to a time-sliced resource's name when
// renameByDefault is set.
const SharedSuffix = ".shared"

// Devices selects which GPUs of a resource are time-sliced. Exactly one of its
// fields is set: NVIDIA's "devices" is "all", a count (the first N GPUs) or a
// list of GPU indexes ("0"), MIG indexes ("0:1") and GPU or MIG UUIDs.
type Devices struct {
	All   bool
	Count int
	List  []string
}

// Resource is one entry of sharing.timeSlicing.resources. Name and Rename are
// fully qualified (a name written without "nvidia.com/" gets it, as NVIDIA
// does).
type Resource struct {
	Name, Rename string
	Devices      Devices
	Replicas     int
}

// Config is what the file says about time-slicing.
type Config struct {
	// Version is "v1"; an absent version reads as "v1".
	Version string
	// RenameByDefault and FailRequestsGreaterThanOne are
	// sharing.timeSlicing.renameByDefault and .failRequestsGreaterThanOne.
	RenameByDefault, FailRequestsGreaterThanOne bool
	// MigStrategy is flags.migStrategy, "none" when absent.
	MigStrategy string
	// Resources is sharing.timeSlicing.resources; empty means no
	// time-slicing (every GPU exclusive).
	Resources []Resource
	// DeviceListStrategy and DeviceIDStrategy are
	// flags.plugin.deviceListStrategy (a string or a list) and
	// .deviceIDStrategy; nil and "" when absent (NVIDIA's defaults, envvar
	// and uuid).
	DeviceListStrategy []string
	DeviceIDStrategy   string
	// CDIAnnotationPrefix is flags.plugin.cdiAnnotationPrefix, the prefix
	// of the annotation keys the cdi-annotations strategy writes; "" when
	// absent (NVIDIA's default, "cdi.k8s.io/").
	CDIAnnotationPrefix string
	// MPS is true when sharing.mps is set; MPSSharing is what it says.
	// SetReplicas never touches it.
	MPS        bool
	MPSSharing MPSSharing
}

// MPSSharing is sharing.mps: GPUs shared through CUDA MPS, each replica a
// client with a hard memory limit and a share of the SMs.
type MPSSharing struct {
	RenameByDefault bool
	// FailRequestsGreaterThanOne is true when the file leaves it out:
	// NVIDIA's plugin keeps its historical MPS behaviour (api/config/v1
	// config.go), refusing a container more than one replica.
	FailRequestsGreaterThanOne bool
	Resources                  []Resource
}

// AdvertisedName is the resource name r's MPS replicas are advertised
// under: <name>.shared when renameByDefault is set, else its name.
func (m MPSSharing) AdvertisedName(r Resource) string {
	return advertisedName(m.RenameByDefault, r)
}

// Replicas is the MPS replica count of the nvidia.com/gpu entry, or of the
// first entry; 1 when nothing is shared through MPS.
func (m MPSSharing) Replicas() int { return replicasOf(m.Resources) }

// AdvertisedName is the resource name r's replicas are advertised under:
// its rename, else <name>.shared when renameByDefault is set, else its name.
func (c Config) AdvertisedName(r Resource) string {
	return advertisedName(c.RenameByDefault, r)
}

func advertisedName(renameByDefault bool, r Resource) string {
	switch {
	case r.Rename != "":
		return r.Rename
	case renameByDefault:
		return r.Name + SharedSuffix
	default:
		return r.Name
	}
}

// Replicas is the replica count of the nvidia.com/gpu time-slicing entry, or
// of the first entry when there is none for nvidia.com/gpu; 1 when nothing is
// time-sliced.
func (c Config) Replicas() int { return replicasOf(c.Resources) }

func replicasOf(resources []Resource) int {
	if len(resources) == 0 {
		return 1
	}
	for _, r := range resources {
		if r.Name == GPUResource {
			return r.Replicas
		}
	}
	return resources[0].Replicas
}

// FieldError is one problem in a config, at a field path such as
// "sharing.timeSlicing.resources[1].replicas". Line is the 1-based line in
// the document, 0 when unknown (a Config built in code).
type FieldError struct {
	Path string
	Line int
	Msg  string
}

func (e *FieldError) Error() string {
	s := e.Msg
	if e.Path != "" {
		s = e.Path + ": " + e.Msg
	}
	if e.Line > 0 {
		s += " (line " + strconv.Itoa(e.Line) + ")"
	}
	return s
}

// Unwrap makes every FieldError match ErrInvalid.
func (e *FieldError) Unwrap() error { return ErrInvalid }

// Errors is every problem found in one config, in document order.
type Errors []*FieldError

func (es Errors) Error() string {
	parts := make([]string, len(es))
	for i, e := range es {
		parts[i] = e.Error()
	}
	return strings.Join(parts, "; ")
}

// Unwrap lets errors.Is and errors.As see each FieldError.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

func asError(es Errors) error {
	if len(es) == 0 {
		return nil
	}
	return es
}

// File is a parsed config document. It keeps the original bytes and the YAML
// tree so that a rewrite changes only what it must.
type File struct {
	data []byte
	doc  *yaml.Node // a DocumentNode; no content for an empty file
	cfg  Config
}

// Parse reads a config (YAML or JSON) and validates it with NVIDIA's rules.
// Errors name the field path and line and wrap ErrInvalid.
func Parse(data []byte) (*File, error) {
	doc, err := parseDocument(data)
	if err != nil {
		return nil, err
	}
	cfg, lines, errs := decode(doc)
	if len(errs) == 0 {
		errs = validate(cfg)
		for _, e := range errs {
			e.Line = lines.find(e.Path)
		}
	}
	if len(errs) > 0 {
		return nil, errs
	}
	return &File{data: bytes.Clone(data), doc: doc, cfg: cfg}, nil
}

func parseDocument(data []byte) (*yaml.Node, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var doc yaml.Node
	if err := dec.Decode(&doc); err != nil {
		if errors.Is(err, io.EOF) {
			// An empty file (or one of comments only) is a config
			// without any setting: NVIDIA's defaults, no sharing.
			return &yaml.Node{Kind: yaml.DocumentNode}, nil
		}
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	var extra yaml.Node
	switch err := dec.Decode(&extra); {
	case err == nil:
		return nil, &FieldError{Line: extra.Line, Msg: "more than one YAML document; a config is one document"}
	case !errors.Is(err, io.EOF):
		return nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return &doc, nil
}

// Config returns what the file says about time-slicing.
func (f *File) Config() Config {
	c := f.cfg
	c.Resources = cloneResources(c.Resources)
	c.MPSSharing.Resources = cloneResources(c.MPSSharing.Resources)
	return c
}

func cloneResources(in []Resource) []Resource {
	if in == nil {
		return nil
	}
	out := make([]Resource, len(in))
	for i, r := range in {
		r.Devices.List = append([]string(nil), r.Devices.List...)
		out[i] = r
	}
	return out
}

// Replicas is the file's replica count (see Config.Replicas).
func (f *File) Replicas() int { return f.cfg.Replicas() }

// Marshal returns the document. Only what SetReplicas changed differs from
// the bytes Parse read; where it had to add or remove sharing.timeSlicing the
// document is written again by the YAML encoder (same fields, comments and
// order; indentation and quoting may change, and JSON comes back in YAML's
// flow style).
func (f *File) Marshal() ([]byte, error) { return bytes.Clone(f.data), nil }

// Validate checks a Config with NVIDIA's rules. Every error wraps ErrInvalid.
func Validate(c Config) error { return asError(validate(c)) }
