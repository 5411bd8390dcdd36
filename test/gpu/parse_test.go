package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParsePmon(t *testing.T) {
	tests := []struct {
		name string
		text string
		want []pmonSample
	}{
		{"driver 580 columns", `# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command
# Idx           #    C/G      %      %      %      %      %      %    name
    0       4242     C     41      3      -      -      -      -    python3
    0       4343     C      -      -      -      -      -      -    python3
    0          -     -      -      -      -      -      -      -    -
`, []pmonSample{{0, 4242, 41}, {0, 4343, -1}}},
		{"older columns, two GPUs", `# gpu        pid  type    sm   mem   enc   dec   command
# Idx          #   C/G     %     %     %     %   name
    0      100     C    53    20     0     0   python
    1      200     C    32    10     0     0   python
`, []pmonSample{{0, 100, 53}, {1, 200, 32}}},
		{"no header: default columns", "    0  7  C  12  1  -  -  python3\n", []pmonSample{{0, 7, 12}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePmon(strings.NewReader(tc.text))
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	if _, err := parsePmon(strings.NewReader("    0  x  C  12  1  -  -  python3\n")); err == nil {
		t.Error("a bad PID parsed")
	}
}

func TestPmonMeans(t *testing.T) {
	got := pmonMeans([]pmonSample{{0, 1, 40}, {0, 1, 50}, {0, 2, -1}, {0, 2, 30}})
	want := map[int]float64{1: 0.45, 2: 0.15}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestParseComputeApps(t *testing.T) {
	text := `4242, GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348, 16384
4343, GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348, [N/A]
`
	got, err := parseComputeApps(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := []computeApp{
		{PID: 4242, GPUUUID: "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348", UsedMiB: 16384},
		{PID: 4343, GPUUUID: "GPU-5ba4538b-234f-2c18-6a7a-458d0a7fb348", UsedUnknown: true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
	if got, err := parseComputeApps(strings.NewReader("No running processes found\n")); err != nil || len(got) != 0 {
		t.Errorf("no processes: %v, %v", got, err)
	}
	if _, err := parseComputeApps(strings.NewReader("1, GPU-x\n")); err == nil {
		t.Error("a short line parsed")
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP gpuslice_container_gpu_utilization_ratio x
# TYPE gpuslice_container_gpu_utilization_ratio gauge
gpuslice_container_gpu_utilization_ratio{container="main",gpu="0",namespace="test-gpu",pod="a",uuid="GPU-1"} 0.53
gpuslice_container_gpu_utilization_ratio{container="main",gpu="0",namespace="test-gpu",pod="b",uuid="GPU-1"} 0.32
# TYPE gpuslice_gpu_oom_events_total counter
gpuslice_gpu_oom_events_total{container="main",kind="device",namespace="test-gpu",pod="a",source="log"} 1
gpuslice_gpu_oom_events_total{container="main",kind="process-cap",namespace="test-gpu",pod="a",source="log"} 0
`
	m, err := parseMetrics([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := find(m, "gpuslice_container_gpu_utilization_ratio", map[string]string{"pod": "b"}); !ok || v != 0.32 {
		t.Errorf("pod b: %v, %v", v, ok)
	}
	if v := sum(m, "gpuslice_container_gpu_utilization_ratio", map[string]string{"namespace": "test-gpu"}); !within(v, 0.85, 1e-9) {
		t.Errorf("sum %v, want 0.85", v)
	}
	if v := sum(m, "gpuslice_gpu_oom_events_total", map[string]string{"pod": "a"}); v != 1 {
		t.Errorf("oom %v", v)
	}
}

func TestRenderTable(t *testing.T) {
	var b bytes.Buffer
	renderTable(&b, []row{{"/healthz", pass, "200"}, {"OOM counted once: jax", skip, "jax not installed"}, {"x", fail, "y"}})
	want := `check                  result  detail
---------------------  ------  ------
/healthz               PASS    200
OOM counted once: jax  SKIP    jax not installed
x                      FAIL    y
1 passed, 1 failed, 1 skipped
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestCgroupDir(t *testing.T) {
	got := cgroupDir("/sys/fs/cgroup", "besteffort", "0c3f7a64-11aa-4b2e-9d1c-0123456789ab", "abc123")
	want := "/sys/fs/cgroup/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod0c3f7a64_11aa_4b2e_9d1c_0123456789ab.slice/cri-containerd-abc123.scope"
	if got != want {
		t.Errorf("got %s\nwant %s", got, want)
	}
}

func TestCRILine(t *testing.T) {
	if got := criLine("2026-11-26T05:00:00.000000001Z", "stdout", "torch.OutOfMemoryError: CUDA out of memory."); got != "2026-11-26T05:00:00.000000001Z stdout F torch.OutOfMemoryError: CUDA out of memory.\n" {
		t.Errorf("got %q", got)
	}
}

func TestParseStatTicks(t *testing.T) {
	stat := []byte("4242 (python3 (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 150 25 0 0 20 0 12 0 100 0 0\n")
	if got, err := parseStatTicks(stat); err != nil || got != 175 {
		t.Errorf("= %d, %v; want 175", got, err)
	}
	if _, err := parseStatTicks([]byte("4242 python3 S")); err == nil {
		t.Error("a line without a command name parsed")
	}
}

// TestCannotRunWithoutDriver: on a machine without nvidia-smi the test
// says so in one line and does nothing else.
func TestCannotRunWithoutDriver(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if got := cannotRun("python3"); !strings.Contains(got, "no nvidia-smi") {
		t.Errorf("cannotRun = %q, want it to name the missing nvidia-smi", got)
	}
}

// The MPS check runs the chart's own daemon script: it must be found in
// the template, whole, with every /mps path moved under the root given.
func TestChartDaemonScript(t *testing.T) {
	template, err := os.ReadFile(filepath.Join("..", "..", chartTemplate))
	if err != nil {
		t.Fatal(err)
	}
	script, err := chartDaemonScript(template, "/tmp/tgmps1")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"set -eu", "nvidia-cuda-mps-control -d", "touch /tmp/tgmps1/$0/.started", "trap stop TERM INT", "CUDA_MPS_PIPE_DIRECTORY=/tmp/tgmps1/$res/pipe"} {
		if !strings.Contains(script, want) {
			t.Errorf("script lacks %q:\n%s", want, script)
		}
	}
	if strings.Contains(script, "/mps/") || strings.Contains(script, "env:") {
		t.Errorf("script keeps a /mps path or runs past its block:\n%s", script)
	}
	if _, err := chartDaemonScript([]byte("kind: DaemonSet\n"), "/tmp/x"); err == nil {
		t.Error("a template without the container gave a script")
	}
}
