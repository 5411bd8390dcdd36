package dpconfig

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// deviceListStrategies are the values NVIDIA's plugin knows
// (api/config/v1 consts.go); it refuses to start on any other.
var deviceListStrategies = []string{"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"}

// maxResourceNameLength is NVIDIA's limit on a fully qualified resource name.
const maxResourceNameLength = 63

func validate(c Config) Errors {
	var errs Errors
	fail := func(path, format string, args ...any) {
		errs = append(errs, &FieldError{Path: path, Msg: fmt.Sprintf(format, args...)})
	}
	if c.Version != "" && c.Version != Version {
		fail(keyVersion, "unknown version %q, the only version is %q", c.Version, Version)
	}
	switch c.MigStrategy {
	case "", "none", "single", "mixed":
	default:
		fail(keyFlags+"."+keyMig, "unknown MIG strategy %q, want none, single or mixed", c.MigStrategy)
	}
	for i, st := range c.DeviceListStrategy {
		if !slices.Contains(deviceListStrategies, st) {
			fail(fmt.Sprintf("%s.%s[%d]", pathPlugin, keyListStrategy, i), "unknown device list strategy %q, want one of %s",
				st, strings.Join(deviceListStrategies, ", "))
		}
	}
	switch c.DeviceIDStrategy {
	case "", "uuid", "index":
	default:
		fail(pathPlugin+"."+keyIDStrategy, "unknown device ID strategy %q, want uuid or index", c.DeviceIDStrategy)
	}
	if c.MPS && len(c.Resources) > 0 {
		fail(keySharing, "mps and timeSlicing are mutually exclusive; set one of them")
	}
	checkResources(c.Resources, c.RenameByDefault, pathResources, fail)
	if c.MPS {
		checkMPS(c, fail)
	}
	return errs
}

// checkMPS adds what NVIDIA's plugin (v0.19) and its mps-control-daemon
// require of sharing.mps beyond the shared rules. They share every GPU
// through one daemon per resource and silently ignore "devices" and
// "rename" (api/config/v1 DisableResourceNamingInConfig), and refuse to
// start MPS with migStrategy mixed (cmd/nvidia-device-plugin main.go).
func checkMPS(c Config, fail func(path, format string, args ...any)) {
	m := c.MPSSharing
	if len(m.Resources) == 0 {
		fail(pathMPSRes, "no resources specified (leave out sharing.mps for exclusive GPUs)")
	}
	checkResources(m.Resources, m.RenameByDefault, pathMPSRes, fail)
	if c.MigStrategy == "mixed" {
		fail(keyFlags+"."+keyMig, "MPS sharing does not work with migStrategy mixed (NVIDIA's plugin refuses it)")
	}
	for i, r := range m.Resources {
		path := fmt.Sprintf("%s[%d]", pathMPSRes, i)
		if !m.RenameByDefault && r.Rename != "" {
			fail(path+"."+keyRename, "NVIDIA's plugin ignores rename under sharing.mps; use renameByDefault (name.shared) or leave it out")
		}
		if r.Devices.Count != 0 || r.Devices.List != nil {
			fail(path+"."+keyDevices, "NVIDIA's plugin shares every GPU under sharing.mps and ignores devices; leave it out or write \"all\"")
		}
	}
}

// checkResources applies the rules both sharing strategies share to one
// strategy's resources list at path.
func checkResources(resources []Resource, renameByDefault bool, pathRes string, fail func(path, format string, args ...any)) {
	names := map[string]int{}
	advertised := map[string]int{}
	for i, r := range resources {
		path := fmt.Sprintf("%s[%d]", pathRes, i)
		nameDup := false
		if err := checkResourceName(r.Name); err != "" {
			fail(path+"."+keyName, "%s", err)
		} else if j, dup := names[r.Name]; dup {
			nameDup = true
			fail(path+"."+keyName, "%q already configured in resources[%d]", r.Name, j)
		} else {
			names[r.Name] = i
		}
		if r.Rename != "" {
			if err := checkResourceName(r.Rename); err != "" {
				fail(path+"."+keyRename, "%s", err)
			} else if renameByDefault && r.Rename != r.Name+SharedSuffix {
				fail(path+"."+keyRename, "%q conflicts with renameByDefault, which names this resource %q; remove one of them",
					r.Rename, r.Name+SharedSuffix)
			}
		}
		adv := advertisedName(renameByDefault, r)
		if j, dup := advertised[adv]; dup && !nameDup {
			field := keyName
			if r.Rename != "" {
				field = keyRename
			}
			fail(path+"."+field, "%q is already advertised by resources[%d]", adv, j)
		} else if !dup {
			advertised[adv] = i
		}
		checkDevices(r.Devices, path+"."+keyDevices, fail)
		if r.Replicas < 2 {
			fail(path+"."+keyReplicas, "must be >= 2, got %d", r.Replicas)
		}
	}
}

func checkDevices(d Devices, path string, fail func(path, format string, args ...any)) {
	set := 0
	if d.All {
		set++
	}
	if d.Count != 0 {
		set++
		if d.Count < 0 {
			fail(path, "a count of devices must be > 0, got %d", d.Count)
		}
	}
	if d.List != nil {
		set++
		if len(d.List) == 0 {
			fail(path, "an empty list selects no GPU; leave the resource out instead")
		}
	}
	if set != 1 {
		fail(path, "must be exactly one of \"all\", a count or a list")
	}
	for j, ref := range d.List {
		if !isGPUIndex(ref) && !isMIGIndex(ref) && !isGPUUUID(ref) && !isMIGUUID(ref) {
			fail(fmt.Sprintf("%s[%d]", path, j), "%q is not a GPU index, MIG index (gpu:mig) or GPU/MIG UUID", ref)
		}
	}
}

// checkResourceName applies NVIDIA's rule for resource names: under
// nvidia.com/, at most 63 characters, and the part after the slash a DNS
// subdomain. It returns "" for a valid name.
func checkResourceName(name string) string {
	if !strings.HasPrefix(name, resourceNS) {
		return fmt.Sprintf("resource name %q must start with %q", name, resourceNS)
	}
	if len(name) > maxResourceNameLength {
		return fmt.Sprintf("resource name %q is longer than %d characters", name, maxResourceNameLength)
	}
	if msgs := validation.IsDNS1123Subdomain(strings.TrimPrefix(name, resourceNS)); len(msgs) > 0 {
		return fmt.Sprintf("resource name %q is not valid: %s", name, strings.Join(msgs, "; "))
	}
	return ""
}

func isUint(s string) bool {
	_, err := strconv.ParseUint(s, 10, 0)
	return err == nil
}

func isGPUIndex(s string) bool { return isUint(s) }

func isMIGIndex(s string) bool {
	gpu, mig, ok := strings.Cut(s, ":")
	return ok && isUint(gpu) && isUint(mig)
}

func isGPUUUID(s string) bool {
	rest, ok := strings.CutPrefix(s, "GPU-")
	return ok && isUUID(rest)
}

// isMIGUUID accepts both MIG UUID forms: MIG-<uuid> and
// MIG-GPU-<uuid>/<gi>/<ci>.
func isMIGUUID(s string) bool {
	rest, ok := strings.CutPrefix(s, "MIG-")
	if !ok {
		return false
	}
	if isUUID(rest) {
		return true
	}
	parts := strings.Split(rest, "/")
	return len(parts) == 3 && isGPUUUID(parts[0]) && isUint(parts[1]) && isUint(parts[2])
}

// isUUID accepts the 8-4-4-4-12 hex form and the same 32 digits without
// dashes.
func isUUID(s string) bool {
	switch len(s) {
	case 36:
		for i, r := range s {
			if i == 8 || i == 13 || i == 18 || i == 23 {
				if r != '-' {
					return false
				}
			} else if !isHex(r) {
				return false
			}
		}
		return true
	case 32:
		for _, r := range s {
			if !isHex(r) {
				return false
			}
		}
		return true
	}
	return false
}

func isHex(r rune) bool {
	return '0' <= r && r <= '9' || 'a' <= r && r <= 'f' || 'A' <= r && r <= 'F'
}
