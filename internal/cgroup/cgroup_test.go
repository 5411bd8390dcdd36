package cgroup

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// Every file under testdata is one layout; this table says what each holds.
// The IDs in the files are random, so a parser that returns a constant or
// mixes up fields fails here.
var fixtures = []struct {
	file    string
	want    Ref
	wantErr error
}{
	{"v1-cgroupfs-docker-burstable", Ref{"d7680c28-c50c-43d9-859e-b48ab3872191", "862e61d771c9acb4a2534a16eb5832dc4b29cff7a88c365722bbae7d4c95d1e7", "", QoSBurstable}, nil},
	{"v1-cgroupfs-containerd-guaranteed", Ref{"ee6018a3-681f-4408-a8ac-9225524f5fb9", "841b123f567f4857f47b2734fca01a1ff59fd40340d913c2b7dd564498191827", "", QoSGuaranteed}, nil},
	{"v1-cgroupfs-crio-besteffort", Ref{"937ea90d-dfb6-49c8-a319-e42e90f3d9e6", "d29d00c2b0df4f3e37487246c1c8c8f5b458026b02e52cbdb85d89f62dbf1654", RuntimeCRIO, QoSBestEffort}, nil},
	{"v1-systemd-containerd-burstable", Ref{"50efe90f-231c-4443-b59d-97a891954873", "7810fb4a9adb85e0934a36805b9bba8c30107731af9d23d3574f3ef2c8dcdb47", RuntimeContainerd, QoSBurstable}, nil},
	{"v1-systemd-docker-besteffort", Ref{"0136a4d5-24fc-48b2-bb41-fef8f28d8cd0", "22cbbde90b2e7a7845e24dc73803dc50cdf35a483026250dd3329e7178e149ec", RuntimeDocker, QoSBestEffort}, nil},
	{"v2-systemd-containerd-guaranteed", Ref{"dd297fc9-1df1-41d6-aba9-07935bbdc1cb", "ad4886ba3f7efe4eca2024b3e850f121e7dd3f6917768365673c1c3237dc648b", RuntimeContainerd, QoSGuaranteed}, nil},
	{"v2-systemd-containerd-burstable", Ref{"d63fb2ef-5de6-4e50-ada4-f86393f88f1b", "97a717fa4c6a188b9000c2caf149a83b17e5f49e2dcf8db361562fe7742f5842", RuntimeContainerd, QoSBurstable}, nil},
	{"v2-systemd-crio-besteffort", Ref{"486b75b8-64e8-4cc2-8237-9a7315986e48", "6a18be4d33764ded3c5b4b509542ab7857a9b2434a39a9418aec8ed5f6dcf3d2", RuntimeCRIO, QoSBestEffort}, nil},
	{"v2-systemd-crio-conmon", Ref{}, ErrNotInPod},
	{"v2-k3s-cgroupfs-besteffort", Ref{"857ba71d-88ba-4e12-b492-9b5a94a23296", "21ee1dc9bc79aec1969cbbfaaab8c29b3d5db1e9ab61e92b6c652a83ed6034af", "", QoSBestEffort}, nil},
	{"v2-k3s-systemd-burstable", Ref{"684e7dd5-fe26-4631-ac6a-e1182696ccc3", "83e012a293ef605448608214a79c26d8642751ebaeb1137c0b301cbfd7668ae0", RuntimeContainerd, QoSBurstable}, nil},
	{"v2-kind-nested-burstable", Ref{"ff092f32-7df2-41ae-b0d1-b1e1ad494f0b", "765a4a42e18bd7bd6c1d219ef6fed0518c1a29ac5067d2ef8854884f3313cfef", RuntimeContainerd, QoSBurstable}, nil},
	{"v2-kind-nested-guaranteed", Ref{"f3a96fc8-815b-4913-a724-ba0b4ca05545", "13704c040bf51148494b553c839bf320c96ba47ac896f1e973ad1fab2b6ebcb6", RuntimeContainerd, QoSGuaranteed}, nil},
	{"v2-cgroupns-systemd-relative", Ref{"5c505744-2dfb-4100-bd81-49afcecbc06f", "7d9ae3343ccda67b87627a2af2b5d3ceb06f7bdce281ffee514788210ef5d6a1", RuntimeContainerd, QoSBestEffort}, nil},
	{"v2-cgroupns-systemd-other-qos", Ref{"78dd1476-7951-4329-b8d2-c7c2e257a0a3", "36479be9c47cf28a8f44aed052687c29f222b9496d2ea0e2ebe97096a7d2f29c", RuntimeContainerd, QoSBurstable}, nil},
	{"v2-cgroupns-cgroupfs-relative", Ref{"e6b06e21-779b-4bcd-9e6d-21d11f7f3940", "d4a979ae65704f400de4ce11861e231c95c3aa6573adb720868404bc0c425052", "", ""}, nil},
	{"v2-cgroupns-root", Ref{}, ErrNotInPod},
	{"v2-deleted", Ref{"7e34515d-6f9c-4bfc-9dff-2cf7ab468b3a", "46347faaa035dbe68ec244e53ff6c217f840907eff919ce001a4e2a8e7f6f577", "", QoSBurstable}, nil},
	{"v2-systemd-nested-in-container", Ref{"c09c3c4e-1277-4928-b0c9-11e021cd32fc", "64d1dbde87a94c2405e6bec3a20449acee7f1b2f5f963382b946a86a17a15920", RuntimeContainerd, QoSBurstable}, nil},
	{"v2-cgroupfs-pod-level", Ref{"b4f1c4be-f30b-4663-8cd6-1491883f895c", "", "", QoSBurstable}, nil},
	{"v2-systemd-static-pod", Ref{"505ca6ff38d25273fee52955244d8f13", "acc8963a0abff0746e6a4dba31fadce49ecd4f70dcf07d3e5a879e43e60df9be", RuntimeContainerd, QoSBurstable}, nil},
	{"v2-host-init", Ref{}, ErrNotInPod},
	{"v2-host-service", Ref{}, ErrNotInPod},
	{"v2-host-user-session", Ref{}, ErrNotInPod},
	{"v2-docker-not-kubernetes", Ref{}, ErrNotInPod},
	{"v1-docker-not-kubernetes", Ref{}, ErrNotInPod},
	{"v1-host-process", Ref{}, ErrNotInPod},
	{"v2-podman-pod-not-kubernetes", Ref{}, ErrNotInPod},
	{"v2-k3s-colon-containerd-besteffort", Ref{"b7c2cbdb-9ab5-47ef-977e-97e39a73da6d", "66dda1e97c4fc48204b066f07fc1e28bab94a571820484e01576982d4cb9d32b", RuntimeContainerd, QoSBestEffort}, nil},
	{"v2-colon-crio-burstable", Ref{"3f1c8e2a-6d4b-4a7e-9c11-5e2b7d9a0c44", "c4e1f0a9b37d62e8a5f14b0c9d7e3a2861f5b4c0e9d8a7f6e5d4c3b2a1908f7e", RuntimeCRIO, QoSBurstable}, nil},
	{"v1-colon-docker-guaranteed", Ref{"0a9d4e7c-2b6f-4c1d-8e3a-7f5b9c2d1e60", "5b3e9a1c7d2f4e6a8b0c1d3e5f7a9b2c4d6e8f0a1b3c5d7e9f2a4b6c8d0e1f3a", RuntimeDocker, QoSGuaranteed}, nil},
	{"v2-colon-nested-containerd-burstable", Ref{"9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b", "8a7b6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d0e9f8a7b", RuntimeContainerd, QoSBurstable}, nil},
	// An unknown runtime prefix still names the pod: its processes count
	// for the pod, as in any other pod cgroup of an unlisted shape.
	{"v2-colon-unknown-prefix", Ref{"1b2c3d4e-5f6a-4b7c-8d9e-0f1a2b3c4d5e", "", "", QoSBestEffort}, nil},
	{"v2-colon-not-a-pod", Ref{}, ErrNotInPod},
}

func TestParseFixtures(t *testing.T) {
	seen := map[string]bool{}
	for _, tc := range fixtures {
		t.Run(tc.file, func(t *testing.T) {
			seen[tc.file+".cgroup"] = true
			data, err := os.ReadFile(filepath.Join("testdata", tc.file+".cgroup"))
			if err != nil {
				t.Fatal(err)
			}
			got, err := Parse(data)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Parse() error = %v, want %v", err, tc.wantErr)
			}
			if got != tc.want {
				t.Errorf("Parse() = %+v, want %+v", got, tc.want)
			}
		})
	}
	// A fixture nobody checks proves nothing.
	files, err := filepath.Glob(filepath.Join("testdata", "*.cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if !seen[filepath.Base(f)] {
			t.Errorf("%s has no entry in the fixtures table", f)
		}
	}
}

func TestParseLines(t *testing.T) {
	const (
		uid   = "3f0e1c2a-9b8d-4e7f-a6b5-c4d3e2f1a0b9"
		uidUS = "3f0e1c2a_9b8d_4e7f_a6b5_c4d3e2f1a0b9"
		cid   = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
		cid2  = "fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210"
	)
	tests := []struct {
		name    string
		in      string
		want    Ref
		wantErr error
		errHas  string // the error must name this (a line number, a reason)
	}{
		{name: "upper-case uid is lowered", in: "0::/kubepods/besteffort/pod" + strings.ToUpper(uid) + "/" + cid + "\n",
			want: Ref{PodUID: uid, ContainerID: cid, QoS: QoSBestEffort}},
		{name: "no trailing newline", in: "0::/kubepods/pod" + uid + "/" + cid,
			want: Ref{PodUID: uid, ContainerID: cid, QoS: QoSGuaranteed}},
		{name: "v1 line with the container wins over one with only the pod",
			in:   "2:cpu:/kubepods/burstable/pod" + uid + "\n1:memory:/kubepods/burstable/pod" + uid + "/" + cid + "\n",
			want: Ref{PodUID: uid, ContainerID: cid, QoS: QoSBurstable}},
		{name: "first complete v1 line wins",
			in:   "2:cpu:/kubepods/burstable/pod" + uid + "/" + cid + "\n1:memory:/kubepods/burstable/pod" + uid + "/" + cid2 + "\n",
			want: Ref{PodUID: uid, ContainerID: cid, QoS: QoSBurstable}},
		{name: "path with colon", in: "0::/kubepods/pod" + uid + "/" + cid + "/a:b\n",
			want: Ref{PodUID: uid, ContainerID: cid, QoS: QoSGuaranteed}},
		{name: "custom cgroup root before kubepods", in: "0::/k3s/kubepods/burstable/pod" + uid + "/" + cid + "\n",
			want: Ref{PodUID: uid, ContainerID: cid, QoS: QoSBurstable}},
		{name: "unknown container cgroup keeps the pod", in: "0::/kubepods.slice/kubepods-pod" + uidUS + ".slice/something-else.scope\n",
			want: Ref{PodUID: uid, QoS: QoSGuaranteed}},
		{name: "short container id is not taken", in: "0::/kubepods/pod" + uid + "/cri-containerd-abc.scope\n",
			want: Ref{PodUID: uid, QoS: QoSGuaranteed}},
		{name: "bare id as a systemd unit is not taken", in: "0::/kubepods/pod" + uid + "/" + cid + ".scope\n",
			want: Ref{PodUID: uid, QoS: QoSGuaranteed}},
		{name: "crio cgroupfs conmon", in: "0::/kubepods/pod" + uid + "/crio-conmon-" + cid + "\n",
			wantErr: ErrNotInPod, errHas: "conmon"},
		{name: "slice without kubepods is not a pod", in: "0::/machine.slice/machine-pod" + uidUS + ".slice/x.scope\n",
			wantErr: ErrNotInPod},
		{name: "qos slice without kubepods is not a pod", in: "0::/x.slice/x-burstable-pod" + uidUS + ".slice/x.scope\n",
			wantErr: ErrNotInPod},
		{name: "pod with a non-uuid is not a pod", in: "0::/kubepods/podcast/" + cid + "\n",
			wantErr: ErrNotInPod},
		{name: "empty", in: "", wantErr: ErrMalformed, errHas: "empty"},
		{name: "only newlines", in: "\n\n", wantErr: ErrMalformed, errHas: "empty"},
		{name: "garbage", in: "hello world\n", wantErr: ErrMalformed, errHas: "line 1"},
		{name: "garbage on line 3", in: "2:cpu:/\n1:memory:/\nnot a cgroup line\n", wantErr: ErrMalformed, errHas: "line 3"},
		{name: "non-numeric hierarchy", in: "x:cpu:/\n", wantErr: ErrMalformed, errHas: "hierarchy id"},
		{name: "empty hierarchy", in: "::/\n", wantErr: ErrMalformed, errHas: "hierarchy id"},
		{name: "two fields", in: "0:/kubepods\n", wantErr: ErrMalformed, errHas: "line 1"},
		{name: "relative path", in: "0::kubepods/pod" + uid + "\n", wantErr: ErrMalformed, errHas: "not absolute"},
		{name: "blank line between lines", in: "1:cpu:/\n\n0::/\n", wantErr: ErrMalformed, errHas: "line 2"},
		{name: "garbage after a pod line still fails", in: "0::/kubepods/pod" + uid + "/" + cid + "\n???\n", wantErr: ErrMalformed, errHas: "line 2"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Parse([]byte(tc.in))
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("Parse() error = %v, want %v", err, tc.wantErr)
			}
			if err != nil && !strings.Contains(err.Error(), tc.errHas) {
				t.Errorf("Parse() error = %q, want it to mention %q", err, tc.errHas)
			}
			if got != tc.want {
				t.Errorf("Parse() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

func TestReadPID(t *testing.T) {
	procfs := t.TempDir()
	write := func(pid, content string) {
		t.Helper()
		if err := os.MkdirAll(filepath.Join(procfs, pid), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(procfs, pid, "cgroup"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	data, err := os.ReadFile(filepath.Join("testdata", "v2-systemd-containerd-burstable.cgroup"))
	if err != nil {
		t.Fatal(err)
	}
	write("4242", string(data))
	write("7", "garbage\n")

	tests := []struct {
		name    string
		pid     int
		want    Ref
		wantErr error
		errHas  string
	}{
		{name: "pod process", pid: 4242, want: Ref{"d63fb2ef-5de6-4e50-ada4-f86393f88f1b", "97a717fa4c6a188b9000c2caf149a83b17e5f49e2dcf8db361562fe7742f5842", RuntimeContainerd, QoSBurstable}},
		{name: "gone", pid: 99999, wantErr: ErrProcessGone},
		{name: "malformed names the file", pid: 7, wantErr: ErrMalformed, errHas: filepath.Join(procfs, "7", "cgroup") + ": "},
		{name: "invalid pid", pid: 0, errHas: "invalid pid"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ReadPID(procfs, tc.pid)
			if tc.wantErr == nil && tc.errHas == "" && err != nil {
				t.Fatalf("ReadPID() error = %v", err)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Fatalf("ReadPID() error = %v, want %v", err, tc.wantErr)
			}
			if tc.errHas != "" && (err == nil || !strings.Contains(err.Error(), tc.errHas)) {
				t.Fatalf("ReadPID() error = %v, want it to mention %q", err, tc.errHas)
			}
			if got != tc.want {
				t.Errorf("ReadPID() = %+v, want %+v", got, tc.want)
			}
		})
	}
}

// TestReadPIDSelf reads this test process's own file from the real /proc: the
// kernel's format, whatever the machine, must never be called malformed.
func TestReadPIDSelf(t *testing.T) {
	if _, err := os.Stat("/proc/self/cgroup"); err != nil {
		t.Skip("no /proc/self/cgroup:", err)
	}
	_, err := ReadPID("/proc", os.Getpid())
	if err != nil && !errors.Is(err, ErrNotInPod) {
		t.Fatalf("ReadPID(/proc, self) = %v, want a Ref or ErrNotInPod", err)
	}
}

var (
	uidShape = regexp.MustCompile(`^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})$`)
	cidShape = regexp.MustCompile(`^([0-9a-f]{64})?$`)
)

func FuzzParse(f *testing.F) {
	files, err := filepath.Glob(filepath.Join("testdata", "*.cgroup"))
	if err != nil {
		f.Fatal(err)
	}
	for _, file := range files {
		data, err := os.ReadFile(file)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Add([]byte(""))
	f.Add([]byte("0::/kubepods/pod/x\n"))
	f.Add([]byte("1:a:b:c\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		ref, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrNotInPod) && !errors.Is(err, ErrMalformed) {
				t.Fatalf("Parse() error %v is neither ErrNotInPod nor ErrMalformed", err)
			}
			if ref != (Ref{}) {
				t.Fatalf("Parse() returned %+v with error %v", ref, err)
			}
			return
		}
		if !uidShape.MatchString(ref.PodUID) {
			t.Errorf("PodUID %q is not UUID-shaped", ref.PodUID)
		}
		if !cidShape.MatchString(ref.ContainerID) {
			t.Errorf("ContainerID %q is not 64 hex digits or empty", ref.ContainerID)
		}
		switch ref.Runtime {
		case "", RuntimeContainerd, RuntimeCRIO, RuntimeDocker:
		default:
			t.Errorf("Runtime %q is unknown", ref.Runtime)
		}
		if ref.ContainerID == "" && ref.Runtime != "" {
			t.Errorf("Runtime %q without a container ID", ref.Runtime)
		}
		switch ref.QoS {
		case "", QoSGuaranteed, QoSBurstable, QoSBestEffort:
		default:
			t.Errorf("QoS %q is unknown", ref.QoS)
		}
	})
}
