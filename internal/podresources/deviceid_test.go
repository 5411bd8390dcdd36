package podresources

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

const (
	gpuA = "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348"
	gpuB = "GPU-0c1d2e3f-4a5b-6c7d-8e9f-a0b1c2d3e4f5"
)

func TestParseDeviceID(t *testing.T) {
	tests := []struct {
		id      string
		want    DeviceID
		wantErr bool
	}{
		{id: gpuA, want: DeviceID{UUID: gpuA}},
		{id: gpuA + "::0", want: DeviceID{UUID: gpuA, Replica: 0, Shared: true}},
		{id: gpuA + "::7", want: DeviceID{UUID: gpuA, Replica: 7, Shared: true}},
		{id: gpuB + "::123", want: DeviceID{UUID: gpuB, Replica: 123, Shared: true}},
		{id: strings.ToUpper(gpuA[4:]) + "::1", wantErr: true}, // no GPU- prefix
		{id: "GPU-" + strings.ToUpper(gpuA[4:]) + "::1", want: DeviceID{UUID: "GPU-" + strings.ToUpper(gpuA[4:]), Replica: 1, Shared: true}},
		{id: "", wantErr: true},
		{id: "0", wantErr: true},                                // a CPU ID
		{id: "GPU-0", wantErr: true},                            // not a UUID
		{id: "gpu-" + gpuA[4:], wantErr: true},                  // prefix is case-sensitive in NVML
		{id: gpuA + "::", wantErr: true},                        // empty replica
		{id: gpuA + "::-1", wantErr: true},                      // negative
		{id: gpuA + "::+1", wantErr: true},                      // sign
		{id: gpuA + "::01", wantErr: true},                      // not canonical
		{id: gpuA + "::1.0", wantErr: true},                     // not an integer
		{id: gpuA + "::0x1", wantErr: true},                     // not decimal
		{id: gpuA + "::1::2", wantErr: true},                    // two separators
		{id: gpuA + ":1", wantErr: true},                        // single colon
		{id: gpuA + " ", wantErr: true},                         // trailing space
		{id: gpuA + "::99999999999999999999999", wantErr: true}, // overflows int
		{id: "GPU-5ba4538b234f-2c18-6a7a-458d0a7fb348", wantErr: true},
		{id: "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb34g", wantErr: true},
		{id: "MIG-5ba4538b-234f-2c18-6a7a-458d0a7fb348", wantErr: true},
		{id: "MIG-5ba4538b-234f-2c18-6a7a-458d0a7fb348::2", wantErr: true},
		{id: "MIG-" + gpuA + "/7/0", wantErr: true}, // old-style MIG ID
		{id: "nvidia0", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			got, err := ParseDeviceID(tc.id)
			if tc.wantErr {
				if !errors.Is(err, ErrNotGPU) {
					t.Fatalf("ParseDeviceID(%q) error = %v, want ErrNotGPU", tc.id, err)
				}
				if !strings.Contains(err.Error(), tc.id) {
					t.Errorf("error %q does not name the ID", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDeviceID(%q) error = %v", tc.id, err)
			}
			if got != tc.want {
				t.Errorf("ParseDeviceID(%q) = %+v, want %+v", tc.id, got, tc.want)
			}
			if got.String() != tc.id {
				t.Errorf("String() = %q, want %q", got.String(), tc.id)
			}
		})
	}
}

func TestFormatDeviceID(t *testing.T) {
	if got, want := FormatDeviceID(gpuA, 3), gpuA+"::3"; got != want {
		t.Errorf("FormatDeviceID = %q, want %q", got, want)
	}
}

func FuzzParseDeviceID(f *testing.F) {
	f.Add(gpuA, 0)
	f.Add(gpuB+"::12", 12)
	f.Add("MIG-"+gpuA[4:]+"::1", 1)
	f.Add("0", -1)
	f.Fuzz(func(t *testing.T, id string, replica int) {
		d, err := ParseDeviceID(id)
		if err != nil && !errors.Is(err, ErrNotGPU) {
			t.Fatalf("ParseDeviceID(%q) error %v is not ErrNotGPU", id, err)
		}
		if err == nil {
			// Every accepted ID has exactly one spelling.
			if d.String() != id {
				t.Fatalf("ParseDeviceID(%q).String() = %q", id, d.String())
			}
			if d.Replica < 0 || (!d.Shared && d.Replica != 0) || !strings.HasPrefix(d.UUID, "GPU-") {
				t.Fatalf("ParseDeviceID(%q) = %+v", id, d)
			}
			if replica >= 0 {
				back, err := ParseDeviceID(FormatDeviceID(d.UUID, replica))
				want := DeviceID{UUID: d.UUID, Replica: replica, Shared: true}
				if err != nil || back != want {
					t.Fatalf("ParseDeviceID(FormatDeviceID(%q, %d)) = %+v, %v; want %+v", d.UUID, replica, back, err, want)
				}
			}
		}
		// Formatting never makes a different GPU ID out of its input.
		if back, err := ParseDeviceID(FormatDeviceID(id, replica)); err == nil && (back.UUID != id || back.Replica != replica) {
			t.Fatalf("ParseDeviceID(FormatDeviceID(%q, %d)) = %+v", id, replica, back)
		}
	})
}

func TestGPUAllocations(t *testing.T) {
	in := []Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0", gpuA + "::3"}},
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "example.com/cpu-pinning", DeviceIDs: []string{"0", "1"}},
		{Namespace: "ml", Pod: "infer", Container: "srv", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpuB + "::1"}},
		{Namespace: "ml", Pod: "whole", Container: "c", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuB}},
		{Namespace: "lab", Pod: "mig", Container: "c", Resource: "nvidia.com/mig-1g.10gb", DeviceIDs: []string{"MIG-5ba4538b-234f-2c18-6a7a-458d0a7fb348"}},
		{Namespace: "lab", Pod: "renamed", Container: "c", Resource: "example.com/a6000-slice", DeviceIDs: []string{gpuA + "::5"}},
		{Namespace: "lab", Pod: "mixed", Container: "c", Resource: "odd", DeviceIDs: []string{"sriov-0", gpuA + "::6"}},
		{Namespace: "lab", Pod: "mig-shared", Container: "c", Resource: "nvidia.com/gpu", DeviceIDs: []string{"MIG-" + gpuA + "/7/0::2", "MIG-nope"}},
		{Namespace: "lab", Pod: "empty", Container: "c", Resource: "nvidia.com/gpu"},
	}
	want := []Allocation{
		{Namespace: "ml", Pod: "train", Container: "main", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuA + "::0", gpuA + "::3"}},
		{Namespace: "ml", Pod: "infer", Container: "srv", Resource: "nvidia.com/gpu.shared", DeviceIDs: []string{gpuB + "::1"}},
		{Namespace: "ml", Pod: "whole", Container: "c", Resource: "nvidia.com/gpu", DeviceIDs: []string{gpuB}},
		{Namespace: "lab", Pod: "mig", Container: "c", Resource: "nvidia.com/mig-1g.10gb", DeviceIDs: []string{"MIG-5ba4538b-234f-2c18-6a7a-458d0a7fb348"}},
		{Namespace: "lab", Pod: "renamed", Container: "c", Resource: "example.com/a6000-slice", DeviceIDs: []string{gpuA + "::5"}},
		{Namespace: "lab", Pod: "mixed", Container: "c", Resource: "odd", DeviceIDs: []string{gpuA + "::6"}},
		{Namespace: "lab", Pod: "mig-shared", Container: "c", Resource: "nvidia.com/gpu", DeviceIDs: []string{"MIG-" + gpuA + "/7/0::2"}},
	}
	got := GPUAllocations(in)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("GPUAllocations() mismatch (-want +got):\n%s", diff)
	}
	// The result must not alias the input.
	got[0].DeviceIDs[0] = "changed"
	if in[0].DeviceIDs[0] != gpuA+"::0" {
		t.Error("GPUAllocations() result shares DeviceIDs with its input")
	}
	if GPUAllocations(nil) != nil {
		t.Error("GPUAllocations(nil) != nil")
	}
}

const migA = "MIG-4ec5b3ae-5a4c-5c4f-a8a5-9d0f3e8e6b11"

// TestParseMIGDeviceID uses the forms NVIDIA's plugin v0.19.0 accepts as
// MIG UUIDs (api/config/v1 IsMigUUID) and advertises (the NVML UUID, with
// "::<n>" when time-sliced).
func TestParseMIGDeviceID(t *testing.T) {
	tests := []struct {
		id      string
		want    MIGDeviceID
		wantErr bool
	}{
		{id: migA, want: MIGDeviceID{UUID: migA}},
		{id: migA + "::0", want: MIGDeviceID{UUID: migA, Shared: true}},
		{id: migA + "::12", want: MIGDeviceID{UUID: migA, Replica: 12, Shared: true}},
		{id: "MIG-" + strings.ToUpper(migA[4:]), want: MIGDeviceID{UUID: "MIG-" + strings.ToUpper(migA[4:])}},
		{id: "MIG-" + gpuA + "/7/0", want: MIGDeviceID{UUID: "MIG-" + gpuA + "/7/0", ParentUUID: gpuA, GPUInstance: 7, ComputeInstance: 0}},
		{id: "MIG-" + gpuB + "/13/2::3", want: MIGDeviceID{UUID: "MIG-" + gpuB + "/13/2", ParentUUID: gpuB, GPUInstance: 13, ComputeInstance: 2, Replica: 3, Shared: true}},
		{id: "MIG-" + gpuA + "/0/0", want: MIGDeviceID{UUID: "MIG-" + gpuA + "/0/0", ParentUUID: gpuA}},
		{id: gpuA, wantErr: true},                                      // a whole GPU
		{id: gpuA + "::1", wantErr: true},                              // a GPU replica
		{id: "MIG-", wantErr: true},                                    // nothing after the prefix
		{id: "mig-" + migA[4:], wantErr: true},                         // prefix is case-sensitive
		{id: "MIG-4ec5b3ae5a4c-5c4f-a8a5-9d0f3e8e6b11", wantErr: true}, // misplaced dash
		{id: migA + "::", wantErr: true},                               // empty replica
		{id: migA + "::01", wantErr: true},                             // not canonical
		{id: migA + "::-1", wantErr: true},                             // negative
		{id: migA + "::1::2", wantErr: true},                           // two separators
		{id: "MIG-" + gpuA + "/7", wantErr: true},                      // no compute instance
		{id: "MIG-" + gpuA + "/7/0/1", wantErr: true},                  // one part too many
		{id: "MIG-" + gpuA + "/x/0", wantErr: true},                    // not a number
		{id: "MIG-" + gpuA + "/07/0", wantErr: true},                   // not canonical
		{id: "MIG-" + gpuA + "/-1/0", wantErr: true},                   // negative
		{id: "MIG-GPU-0/1/0", wantErr: true},                           // parent not a UUID
		{id: "MIG-" + migA + "/1/0", wantErr: true},                    // parent is not a GPU
		{id: "0", wantErr: true},
		{id: "", wantErr: true},
	}
	for _, tc := range tests {
		t.Run(tc.id, func(t *testing.T) {
			got, err := ParseMIGDeviceID(tc.id)
			if tc.wantErr {
				if !errors.Is(err, ErrNotMIG) {
					t.Fatalf("ParseMIGDeviceID(%q) error = %v, want ErrNotMIG", tc.id, err)
				}
				if !strings.Contains(err.Error(), tc.id) {
					t.Errorf("error %q does not name the ID", err)
				}
				if IsGPUOrMIG(tc.id) != (parseDeviceIDErr(tc.id) == nil) {
					t.Errorf("IsGPUOrMIG(%q) disagrees with ParseDeviceID", tc.id)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseMIGDeviceID(%q) error = %v", tc.id, err)
			}
			if got != tc.want {
				t.Errorf("ParseMIGDeviceID(%q) = %+v, want %+v", tc.id, got, tc.want)
			}
			if got.String() != tc.id {
				t.Errorf("String() = %q, want %q", got.String(), tc.id)
			}
			if !IsGPUOrMIG(tc.id) {
				t.Errorf("IsGPUOrMIG(%q) = false", tc.id)
			}
			// A MIG ID is never a GPU ID: the device plugin's whole-GPU
			// code must not take one for its own.
			if _, err := ParseDeviceID(tc.id); !errors.Is(err, ErrNotGPU) {
				t.Errorf("ParseDeviceID(%q) error = %v, want ErrNotGPU", tc.id, err)
			}
		})
	}
}

// parseDeviceIDErr is ParseDeviceID's error alone.
func parseDeviceIDErr(id string) error {
	_, err := ParseDeviceID(id)
	return err
}

func FuzzParseMIGDeviceID(f *testing.F) {
	f.Add(migA)
	f.Add(migA + "::3")
	f.Add("MIG-" + gpuA + "/7/0::1")
	f.Add(gpuA)
	f.Fuzz(func(t *testing.T, id string) {
		m, err := ParseMIGDeviceID(id)
		if err != nil {
			if !errors.Is(err, ErrNotMIG) {
				t.Fatalf("ParseMIGDeviceID(%q) error %v is not ErrNotMIG", id, err)
			}
			return
		}
		if m.String() != id || !strings.HasPrefix(m.UUID, "MIG-") || m.Replica < 0 || (!m.Shared && m.Replica != 0) {
			t.Fatalf("ParseMIGDeviceID(%q) = %+v", id, m)
		}
		if m.ParentUUID != "" && (!strings.HasPrefix(m.ParentUUID, "GPU-") || m.UUID != fmt.Sprintf("MIG-%s/%d/%d", m.ParentUUID, m.GPUInstance, m.ComputeInstance)) {
			t.Fatalf("ParseMIGDeviceID(%q) = %+v: parent does not spell the ID", id, m)
		}
		if _, err := ParseDeviceID(id); err == nil {
			t.Fatalf("%q parses as both a GPU and a MIG device", id)
		}
	})
}
