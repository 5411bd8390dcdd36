// Package cgroup finds which Kubernetes pod and container a process belongs
// to from its /proc/<pid>/cgroup file.
//
// The exporter sees GPU processes only as PIDs (from NVML). The kubelet puts
// every container in a cgroup whose path names the pod UID and the container
// ID, so this file is the one place where a host PID meets Kubernetes.
//
// Understood layouts, on cgroup v1 (one line per hierarchy; any line that
// names a pod is used) and v2 ("0::<path>"):
//
//   - cgroupfs driver: /kubepods[/burstable|/besteffort]/pod<uid>/<container>
//   - systemd driver: .../kubepods[-burstable|-besteffort]-pod<uid_with_underscores>.slice/<container>
//     including a cgroup root other than "/" (kind, k3d:
//     /kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod<uid>.slice/...)
//   - container cgroups: a bare 64-hex ID (cgroupfs: containerd, Docker, k3s),
//     cri-containerd-<id>.scope, crio-<id>[.scope], docker-<id>.scope
//   - paths seen from inside a cgroup namespace, relative to its root, which
//     may climb out of it with "/.." segments
//   - the systemd "slice:prefix:name" form taken literally as one directory
//     name: /kubepods-besteffort-pod<uid>.slice:cri-containerd:<id> (and
//     crio:, docker:). runc's cgroupfs manager makes this when the runtime
//     hands it a systemd-style cgroupsPath, i.e. when the kubelet uses the
//     systemd driver and the runtime does not (k3s with the nvidia runtime
//     and SystemdCgroup = false). The container is then not below the pod's
//     slice but beside the whole kubepods tree.
//
// Decisions a caller may need to know:
//
//   - CRI-O's conmon (crio-conmon-<id>) is a monitor that runs on the host and
//     is only charged to the pod's cgroup; it is no container's process and
//     never uses a GPU, so it yields ErrNotInPod (the message names it).
//   - A process directly in the pod's cgroup (no container cgroup below it),
//     or in a container cgroup of a shape not listed above, yields a Ref with
//     the pod UID and an empty ContainerID.
//   - "0::/" is what a process inside the reader's own cgroup namespace root
//     looks like; it names nothing, so it yields ErrNotInPod.
//   - Static pods have a 32-hex-digit UID (a hash of their manifest) instead
//     of a dashed UUID; it is returned as is. Their mirror pod in the API has
//     another UID and carries this one in the kubernetes.io/config.mirror
//     annotation.
//   - QoS is "" when the path does not show it (a cgroupfs path seen through a
//     cgroup namespace, e.g. "/../../pod<uid>/<id>").
package cgroup

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// Runtimes named in Ref.Runtime.
const (
	RuntimeContainerd = "containerd"
	RuntimeCRIO       = "cri-o"
	RuntimeDocker     = "docker"
)

// QoS classes named in Ref.QoS.
const (
	QoSGuaranteed = "guaranteed"
	QoSBurstable  = "burstable"
	QoSBestEffort = "besteffort"
)

// Ref is where a process sits in Kubernetes.
type Ref struct {
	// PodUID is the pod's UID, lowercase with dashes (or 32 hex digits for a
	// static pod).
	PodUID string
	// ContainerID is the runtime's container ID, lowercase hex without any
	// runtime prefix; empty when the process is not in a container cgroup.
	ContainerID string
	// Runtime is RuntimeContainerd, RuntimeCRIO, RuntimeDocker, or "" when
	// the path does not say (cgroupfs paths hold a bare ID).
	Runtime string
	// QoS is QoSGuaranteed, QoSBurstable, QoSBestEffort, or "" when the path
	// does not say.
	QoS string
}

var (
	// ErrNotInPod means the process is on the host or in a container that
	// Kubernetes did not start.
	ErrNotInPod = errors.New("process is not in a kubernetes pod")
	// ErrMalformed means the file is not in the /proc/<pid>/cgroup format.
	ErrMalformed = errors.New("malformed cgroup file")
	// ErrProcessGone means the process exited before its file was read.
	ErrProcessGone = errors.New("process is gone")
)

// ReadPID reads and parses <procfs>/<pid>/cgroup. Errors name the file.
func ReadPID(procfs string, pid int) (Ref, error) {
	if pid <= 0 {
		return Ref{}, fmt.Errorf("cgroup: invalid pid %d", pid)
	}
	path := filepath.Join(procfs, strconv.Itoa(pid), "cgroup")
	data, err := os.ReadFile(path)
	if err != nil {
		// A process may exit between NVML listing it and this read; the
		// kernel then answers ENOENT (directory gone) or ESRCH (mid-exit).
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			return Ref{}, fmt.Errorf("%w: %w", ErrProcessGone, err)
		}
		return Ref{}, err
	}
	ref, err := Parse(data)
	if err != nil {
		return Ref{}, fmt.Errorf("%s: %w", path, err)
	}
	return ref, nil
}

// Parse reads the contents of a /proc/<pid>/cgroup file.
//
// Every line must have the form "<hierarchy-id>:<controllers>:<path>". Among
// the lines that name a pod, the first that also names a container wins.
func Parse(data []byte) (Ref, error) {
	data = bytes.TrimRight(data, "\n")
	if len(data) == 0 {
		return Ref{}, fmt.Errorf("%w: empty", ErrMalformed)
	}
	var (
		best   Ref
		found  bool
		notPod string // why a line in a pod's cgroup was not attributed
	)
	for i, line := range strings.Split(string(data), "\n") {
		p, err := linePath(line)
		if err != nil {
			return Ref{}, fmt.Errorf("%w: line %d: %q: %s", ErrMalformed, i+1, line, err)
		}
		ref, ok, why := parsePath(p)
		if why != "" && notPod == "" {
			notPod = why
		}
		if !ok {
			continue
		}
		if !found || (best.ContainerID == "" && ref.ContainerID != "") {
			best, found = ref, true
		}
	}
	if !found {
		if notPod != "" {
			return Ref{}, fmt.Errorf("%w: %s", ErrNotInPod, notPod)
		}
		return Ref{}, ErrNotInPod
	}
	return best, nil
}

// linePath checks one line's shape and returns its path.
func linePath(line string) (string, error) {
	id, rest, ok := strings.Cut(line, ":")
	if !ok {
		return "", errors.New("want <hierarchy-id>:<controllers>:<path>")
	}
	if id == "" || strings.Trim(id, "0123456789") != "" {
		return "", fmt.Errorf("hierarchy id %q is not a number", id)
	}
	// The path itself may hold colons; controller names never do.
	_, p, ok := strings.Cut(rest, ":")
	if !ok {
		return "", errors.New("want <hierarchy-id>:<controllers>:<path>")
	}
	// The kernel marks a cgroup removed while the process is still in it.
	p = strings.TrimSuffix(p, " (deleted)")
	if !strings.HasPrefix(p, "/") {
		return "", fmt.Errorf("path %q is not absolute", p)
	}
	return p, nil
}

// parsePath finds the pod and container in one cgroup path. why is set when
// the path is in a pod's cgroup but is deliberately not attributed.
func parsePath(p string) (ref Ref, ok bool, why string) {
	parts := strings.Split(p, "/")
	for i, part := range parts {
		if ref, ok := colonComponent(part); ok {
			return ref, true, ""
		}
		uid, qos, isPod := podComponent(part, parent(parts, i))
		if !isPod {
			continue
		}
		ref = Ref{PodUID: uid, QoS: qos}
		if i+1 < len(parts) {
			child := parts[i+1]
			if id, isConmon := conmonID(child); isConmon {
				return Ref{}, false, fmt.Sprintf("CRI-O conmon of container %s in pod %s", id, uid)
			}
			ref.ContainerID, ref.Runtime = containerComponent(child)
		}
		return ref, true, ""
	}
	return Ref{}, false, ""
}

// colonPrefixes are the "prefix" fields of "slice:prefix:name" cgroup paths:
// what containerd, CRI-O and cri-dockerd put there.
var colonPrefixes = map[string]string{
	"cri-containerd": RuntimeContainerd,
	"crio":           RuntimeCRIO,
	"docker":         RuntimeDocker,
}

// colonComponent recognises "<pod slice>:<prefix>:<container id>", one
// directory name. A pod slice with an unknown prefix or a malformed ID still
// names the pod, as a process in a pod cgroup of an unlisted shape does.
func colonComponent(part string) (Ref, bool) {
	fields := strings.Split(part, ":")
	if len(fields) != 3 {
		return Ref{}, false
	}
	uid, qos, ok := podComponent(fields[0], "")
	if !ok || !strings.HasSuffix(fields[0], ".slice") {
		return Ref{}, false
	}
	ref := Ref{PodUID: uid, QoS: qos}
	if rt, known := colonPrefixes[fields[1]]; known && validContainerID(fields[2]) {
		ref.ContainerID, ref.Runtime = fields[2], rt
	}
	return ref, true
}

// parent returns the component above parts[i], or "" when it is not a real
// name (the top, or a ".." climbing out of a cgroup namespace).
func parent(parts []string, i int) string {
	if i == 0 || parts[i-1] == ".." {
		return ""
	}
	return parts[i-1]
}

// podComponent recognises a pod's cgroup: "pod<uid>" (cgroupfs) or
// "<prefix>kubepods[-<qos>]-pod<uid_with_underscores>.slice" (systemd).
func podComponent(part, parentName string) (uid, qos string, ok bool) {
	if name, isSlice := strings.CutSuffix(part, ".slice"); isSlice {
		fields := strings.Split(name, "-")
		n := len(fields)
		if n < 2 {
			return "", "", false
		}
		raw, isPod := strings.CutPrefix(fields[n-1], "pod")
		if !isPod {
			return "", "", false
		}
		switch fields[n-2] {
		case "kubepods":
			qos = QoSGuaranteed
		case QoSBurstable, QoSBestEffort:
			if n < 3 || fields[n-3] != "kubepods" {
				return "", "", false
			}
			qos = fields[n-2]
		default:
			return "", "", false
		}
		uid, ok = normalizeUID(raw)
		return uid, qos, ok
	}
	raw, isPod := strings.CutPrefix(part, "pod")
	if !isPod {
		return "", "", false
	}
	uid, ok = normalizeUID(raw)
	switch parentName {
	case "kubepods":
		qos = QoSGuaranteed
	case QoSBurstable, QoSBestEffort:
		qos = parentName
	}
	return uid, qos, ok
}

// normalizeUID accepts a pod UID as the kubelet writes it into cgroup names:
// a UUID with dashes (cgroupfs) or underscores (systemd, where "-" means
// nesting), or the 32 hex digits of a static pod.
func normalizeUID(raw string) (string, bool) {
	uid := strings.ToLower(strings.ReplaceAll(raw, "_", "-"))
	if isUUID(uid) || (len(uid) == 32 && isHex(uid)) {
		return uid, true
	}
	return "", false
}

func isUUID(s string) bool {
	if len(s) != 36 {
		return false
	}
	for i := 0; i < len(s); i++ {
		switch i {
		case 8, 13, 18, 23:
			if s[i] != '-' {
				return false
			}
		default:
			if !isHexDigit(s[i]) {
				return false
			}
		}
	}
	return true
}

func isHex(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isHexDigit(s[i]) {
			return false
		}
	}
	return s != ""
}

func isHexDigit(c byte) bool {
	return ('0' <= c && c <= '9') || ('a' <= c && c <= 'f')
}

// containerIDLen is the length of the IDs that containerd, CRI-O and Docker
// generate; anything else is not taken for a container ID.
const containerIDLen = 64

// containerComponent reads the cgroup directly below a pod's.
func containerComponent(part string) (id, runtime string) {
	name := strings.TrimSuffix(part, ".scope")
	for _, p := range []struct{ prefix, runtime string }{
		{"cri-containerd-", RuntimeContainerd},
		{"crio-", RuntimeCRIO},
		{"docker-", RuntimeDocker},
	} {
		if rest, ok := strings.CutPrefix(name, p.prefix); ok {
			if validContainerID(rest) {
				return rest, p.runtime
			}
			return "", ""
		}
	}
	// A bare ID is only ever a directory, never a systemd unit.
	if name == part && validContainerID(part) {
		return part, ""
	}
	return "", ""
}

// conmonID reports whether part is CRI-O's conmon cgroup.
func conmonID(part string) (string, bool) {
	id, ok := strings.CutPrefix(strings.TrimSuffix(part, ".scope"), "crio-conmon-")
	return id, ok
}

func validContainerID(s string) bool {
	return len(s) == containerIDLen && isHex(s)
}
