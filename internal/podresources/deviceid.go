package podresources

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNotGPU means a device ID is not a whole NVIDIA GPU or a time-sliced
// replica of one (CPU IDs, MIG devices, other vendors' devices).
var ErrNotGPU = errors.New("not a GPU device ID")

// ErrNotMIG means a device ID is not an NVIDIA MIG device or a time-sliced
// replica of one.
var ErrNotMIG = errors.New("not a MIG device ID")

// DeviceID is one device ID as the NVIDIA device plugin advertises it.
type DeviceID struct {
	// UUID is the GPU's UUID as NVML prints it, "GPU-" prefix included.
	UUID string
	// Replica is the n of "<uuid>::<n>"; 0 when not Shared.
	Replica int
	// Shared is true when the ID carried a "::<n>" replica suffix, i.e. the
	// GPU is time-sliced.
	Shared bool
}

// replicaSep separates the GPU UUID from the replica number in the IDs that
// the NVIDIA device plugin advertises for time-sliced GPUs.
const replicaSep = "::"

// ParseDeviceID reads "GPU-<uuid>" or "GPU-<uuid>::<n>", where <uuid> is
// 8-4-4-4-12 hex digits and n a non-negative decimal without leading zeros.
// Anything else is ErrNotGPU, wrapped with the ID; MIG devices are read by
// ParseMIGDeviceID. This and ParseMIGDeviceID are the only places that know
// the replica ID format.
func ParseDeviceID(id string) (DeviceID, error) {
	uuid, n, shared, ok := cutReplica(id)
	if !isUUID("GPU-", uuid) {
		return DeviceID{}, fmt.Errorf("%w: %q", ErrNotGPU, id)
	}
	if !ok {
		return DeviceID{}, fmt.Errorf("%w: %q: replica after %q is not a non-negative decimal", ErrNotGPU, id, replicaSep)
	}
	return DeviceID{UUID: uuid, Replica: n, Shared: shared}, nil
}

// cutReplica splits "<base>::<n>" into base and n. shared is false (and ok
// true) when there is no separator; ok is false when what follows it is not
// a canonical non-negative decimal.
func cutReplica(id string) (base string, n int, shared, ok bool) {
	base, replica, shared := strings.Cut(id, replicaSep)
	if !shared {
		return base, 0, false, true
	}
	n, ok = parseReplica(replica)
	return base, n, true, ok
}

// FormatDeviceID returns the ID of replica n of a time-sliced GPU, the form
// ParseDeviceID reads back. replica must be non-negative; a GPU that is not
// shared is advertised under its bare UUID.
func FormatDeviceID(uuid string, replica int) string {
	return uuid + replicaSep + strconv.Itoa(replica)
}

// String returns the device ID this value was parsed from.
func (d DeviceID) String() string {
	if !d.Shared {
		return d.UUID
	}
	return FormatDeviceID(d.UUID, d.Replica)
}

// parseReplica accepts only the canonical decimal form, so that every ID has
// exactly one spelling and Format(Parse(id)) == id.
func parseReplica(s string) (int, bool) {
	if s == "" || (len(s) > 1 && s[0] == '0') || strings.Trim(s, "0123456789") != "" {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil
}

// isUUID checks prefix followed by an 8-4-4-4-12 hex UUID, in either case
// (NVML prints lower case; nothing is gained by refusing upper).
func isUUID(prefix, s string) bool {
	rest, ok := strings.CutPrefix(s, prefix)
	if !ok || len(rest) != 36 {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		switch i {
		case 8, 13, 18, 23:
			if c != '-' {
				return false
			}
		default:
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F') {
				return false
			}
		}
	}
	return true
}

// GPUAllocations keeps the allocations of whole, time-sliced or MIG GPUs,
// whatever the resource is called (nvidia.com/gpu, nvidia.com/gpu.shared,
// nvidia.com/mig-1g.10gb, a rename): the device IDs, not the resource name,
// say what a device is. Within an allocation only GPU and MIG IDs are kept;
// one left with none is dropped. The result shares no slices with in.
func GPUAllocations(in []Allocation) []Allocation {
	var out []Allocation
	for _, a := range in {
		var ids []string
		for _, id := range a.DeviceIDs {
			if IsGPUOrMIG(id) {
				ids = append(ids, id)
			}
		}
		if len(ids) == 0 {
			continue
		}
		a.DeviceIDs = ids
		out = append(out, a)
	}
	return out
}

// MIGDeviceID is one MIG device ID as the NVIDIA device plugin advertises
// it: under the mixed and single MIG strategies the plugin uses the MIG
// device's UUID as NVML prints it, with the "::<n>" replica suffix when the
// MIG device is time-sliced (k8s-device-plugin v0.19.0, internal/rm).
type MIGDeviceID struct {
	// UUID is the MIG device's UUID: "MIG-<uuid>" (driver R470 and later)
	// or "MIG-GPU-<gpu uuid>/<gi>/<ci>" (R450, R460).
	UUID string
	// ParentUUID, GPUInstance and ComputeInstance are read from the old
	// form only; in the new form only NVML knows the parent, and
	// ParentUUID is "".
	ParentUUID                   string
	GPUInstance, ComputeInstance int
	// Replica and Shared are as in DeviceID.
	Replica int
	Shared  bool
}

// migPrefix starts every MIG device UUID NVML prints.
const migPrefix = "MIG-"

// ParseMIGDeviceID reads a MIG device ID: "MIG-<uuid>" or
// "MIG-GPU-<uuid>/<gi>/<ci>", each optionally followed by "::<n>", with
// <uuid> as in ParseDeviceID and gi, ci, n canonical non-negative
// decimals. Anything else is ErrNotMIG, wrapped with the ID.
func ParseMIGDeviceID(id string) (MIGDeviceID, error) {
	uuid, n, shared, ok := cutReplica(id)
	m := MIGDeviceID{UUID: uuid, Replica: n, Shared: shared}
	switch {
	case isUUID(migPrefix, uuid):
	case strings.HasPrefix(uuid, migPrefix+"GPU-"):
		parent, gi, ci, okOld := parseOldMIG(strings.TrimPrefix(uuid, migPrefix))
		if !okOld {
			return MIGDeviceID{}, fmt.Errorf("%w: %q: want MIG-GPU-<uuid>/<gpu instance>/<compute instance>", ErrNotMIG, id)
		}
		m.ParentUUID, m.GPUInstance, m.ComputeInstance = parent, gi, ci
	default:
		return MIGDeviceID{}, fmt.Errorf("%w: %q", ErrNotMIG, id)
	}
	if !ok {
		return MIGDeviceID{}, fmt.Errorf("%w: %q: replica after %q is not a non-negative decimal", ErrNotMIG, id, replicaSep)
	}
	return m, nil
}

// parseOldMIG reads "GPU-<uuid>/<gi>/<ci>".
func parseOldMIG(s string) (parent string, gi, ci int, ok bool) {
	parts := strings.Split(s, "/")
	if len(parts) != 3 || !isUUID("GPU-", parts[0]) {
		return "", 0, 0, false
	}
	gi, okGI := parseReplica(parts[1])
	ci, okCI := parseReplica(parts[2])
	return parts[0], gi, ci, okGI && okCI
}

// String returns the device ID this value was parsed from.
func (m MIGDeviceID) String() string {
	if !m.Shared {
		return m.UUID
	}
	return FormatDeviceID(m.UUID, m.Replica)
}

// IsGPUOrMIG reports whether id is a GPU or MIG device ID, time-sliced or
// not.
func IsGPUOrMIG(id string) bool {
	if _, err := ParseDeviceID(id); err == nil {
		return true
	}
	_, err := ParseMIGDeviceID(id)
	return err == nil
}
