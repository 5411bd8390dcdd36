package dpconfig

import (
	"fmt"
	"reflect"
)

// MinMPSReplicas is the least replica count NVIDIA's plugin accepts under
// sharing.mps (and the least a tuner may write there): one replica is not
// sharing, and a config without sharing is a different mode, not an MPS
// count.
const MinMPSReplicas = 2

// MPS says whether the file shares its GPUs through CUDA MPS
// (sharing.mps).
func (f *File) MPS() bool { return f.cfg.MPS }

// SharedReplicas is the replica count of whichever sharing the file uses:
// sharing.mps's (MPSSharing.Replicas) when it shares through MPS, else
// time-slicing's (Replicas, 1 when nothing is shared).
func (f *File) SharedReplicas() int {
	if f.cfg.MPS {
		return f.cfg.MPSSharing.Replicas()
	}
	return f.cfg.Replicas()
}

// SetSharedReplicas sets the replica count of whichever sharing the file
// uses: SetMPSReplicas when it shares through MPS, else SetReplicas. It
// never turns one mode into the other.
func (f *File) SetSharedReplicas(n int) (changed bool, err error) {
	if f.cfg.MPS {
		return f.SetMPSReplicas(n)
	}
	return f.SetReplicas(n)
}

// SetMPSReplicas gives every sharing.mps resource n replicas, rewriting
// only the numbers in the original text where they are plain numbers (the
// rest of the document, comments included, stays as written). n must be at
// least MinMPSReplicas: NVIDIA refuses fewer, and the file is never turned
// into time-slicing or into a config without sharing. A file that does not
// share through MPS is refused. It reports whether the document changed.
//
// Under MPS a new count changes the memory limit (GPU memory / replicas) of
// the containers started after it only; those already running keep the
// limit they started with (docs/mps.md, "Changing the replica count").
func (f *File) SetMPSReplicas(n int) (changed bool, err error) {
	if !f.cfg.MPS {
		return false, &FieldError{Path: pathMPS, Msg: "not set; the config does not share through MPS"}
	}
	if n < MinMPSReplicas {
		return false, &FieldError{Path: pathMPSRes, Msg: fmt.Sprintf("replicas must be >= %d under MPS, got %d", MinMPSReplicas, n)}
	}
	want := f.Config()
	same := true
	for i := range want.MPSSharing.Resources {
		same = same && want.MPSSharing.Resources[i].Replicas == n
		want.MPSSharing.Resources[i].Replicas = n
	}
	if same {
		return false, nil
	}
	doc, err := parseDocument(f.data)
	if err != nil {
		return false, err
	}
	data := setReplicaValues(f.data, doc, keyMPS, n)
	if data == nil {
		if data, err = encode(doc); err != nil {
			return false, fmt.Errorf("writing config: %w", err)
		}
	}
	next, err := Parse(data)
	if err != nil {
		return false, fmt.Errorf("config after setting MPS replicas to %d does not parse: %w", n, err)
	}
	if !reflect.DeepEqual(next.cfg, want) {
		return false, fmt.Errorf("config after setting MPS replicas to %d reads %+v, want %+v", n, next.cfg, want)
	}
	*f = *next
	return true, nil
}
