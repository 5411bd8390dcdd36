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
// Anything else is ErrNotGPU, wrapped with the ID. This is the only place that
// knows the replica ID format.
func ParseDeviceID(id string) (DeviceID, error) {
	uuid, replica, shared := strings.Cut(id, replicaSep)
	if !isGPUUUID(uuid) {
		return DeviceID{}, fmt.Errorf("%w: %q", ErrNotGPU, id)
	}
	if !shared {
		return DeviceID{UUID: uuid}, nil
	}
	n, ok := parseReplica(replica)
	if !ok {
		return DeviceID{}, fmt.Errorf("%w: %q: replica %q is not a non-negative decimal", ErrNotGPU, id, replica)
	}
	return DeviceID{UUID: uuid, Replica: n, Shared: true}, nil
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

// isGPUUUID checks "GPU-" followed by an 8-4-4-4-12 hex UUID, in either case
// (NVML prints lower case; nothing is gained by refusing upper).
func isGPUUUID(s string) bool {
	rest, ok := strings.CutPrefix(s, "GPU-")
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

// GPUAllocations keeps the allocations of whole or time-sliced GPUs, whatever
// the resource is called (nvidia.com/gpu, nvidia.com/gpu.shared, a rename):
// the device IDs, not the resource name, say what a device is. Within an
// allocation only GPU IDs are kept; one left with none is dropped. The result
// shares no slices with in.
func GPUAllocations(in []Allocation) []Allocation {
	var out []Allocation
	for _, a := range in {
		var ids []string
		for _, id := range a.DeviceIDs {
			if _, err := ParseDeviceID(id); err == nil {
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
