package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// The pure parts of test-gpu: what nvidia-smi and the exporter print,
// parsed apart from the commands that print it, and the table.

// pmonSample is one line of `nvidia-smi pmon -s u`: a process's SM share
// in percent on one GPU in one sample; SM is -1 where pmon printed "-"
// (no sample for it in that period).
type pmonSample struct {
	GPU int
	PID int
	SM  float64
}

// parsePmon reads `nvidia-smi pmon -s u` output:
//
//	# gpu         pid   type     sm    mem    enc    dec    jpg    ofa    command
//	# Idx           #    C/G      %      %      %      %      %      %    name
//	    0       12345     C     41      3      -      -      -      -    python3
//
// Comment lines are skipped; the columns are found from the first header
// line, since driver versions add columns (jpg, ofa, ccpm…).
func parsePmon(r io.Reader) ([]pmonSample, error) {
	sc := bufio.NewScanner(r)
	gpuCol, pidCol, smCol := 0, 1, 3
	var out []pmonSample
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		f := strings.Fields(strings.TrimPrefix(line, "#"))
		if strings.HasPrefix(line, "#") {
			if len(f) > 0 && f[0] == "gpu" {
				for i, name := range f {
					switch name {
					case "gpu":
						gpuCol = i
					case "pid":
						pidCol = i
					case "sm":
						smCol = i
					}
				}
			}
			continue
		}
		if len(f) <= max(gpuCol, pidCol, smCol) {
			return nil, fmt.Errorf("pmon line %q: too few columns", line)
		}
		if f[pidCol] == "-" {
			continue // a GPU without any process in that sample
		}
		gpu, err := strconv.Atoi(f[gpuCol])
		if err != nil {
			return nil, fmt.Errorf("pmon line %q: gpu: %w", line, err)
		}
		pid, err := strconv.Atoi(f[pidCol])
		if err != nil {
			return nil, fmt.Errorf("pmon line %q: pid: %w", line, err)
		}
		sm := -1.0
		if f[smCol] != "-" {
			if sm, err = strconv.ParseFloat(f[smCol], 64); err != nil {
				return nil, fmt.Errorf("pmon line %q: sm: %w", line, err)
			}
		}
		out = append(out, pmonSample{GPU: gpu, PID: pid, SM: sm})
	}
	return out, sc.Err()
}

// pmonMeans is each PID's mean SM share over the samples, as a ratio; a
// "-" counts as 0 (pmon prints it when the process ran nothing).
func pmonMeans(samples []pmonSample) map[int]float64 {
	sum, n := map[int]float64{}, map[int]int{}
	for _, s := range samples {
		sum[s.PID] += max(s.SM, 0) / 100
		n[s.PID]++
	}
	out := make(map[int]float64, len(sum))
	for pid, v := range sum {
		out[pid] = v / float64(n[pid])
	}
	return out
}

// computeApp is one row of `nvidia-smi --query-compute-apps=pid,gpu_uuid,used_memory --format=csv,noheader,nounits`.
type computeApp struct {
	PID         int
	GPUUUID     string
	UsedMiB     uint64
	UsedUnknown bool // "[N/A]" (no permission, or the driver cannot tell)
}

// parseComputeApps reads that CSV. Memory is in MiB, as nvidia-smi prints it.
func parseComputeApps(r io.Reader) ([]computeApp, error) {
	sc := bufio.NewScanner(r)
	var out []computeApp
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "No running") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 3 {
			return nil, fmt.Errorf("compute-apps line %q: want pid, gpu_uuid, used_memory", line)
		}
		for i := range f {
			f[i] = strings.TrimSpace(f[i])
		}
		pid, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("compute-apps line %q: pid: %w", line, err)
		}
		app := computeApp{PID: pid, GPUUUID: f[1]}
		if mib, err := strconv.ParseUint(f[2], 10, 64); err == nil {
			app.UsedMiB = mib
		} else {
			app.UsedUnknown = true
		}
		out = append(out, app)
	}
	return out, sc.Err()
}

// series is one sample of the exporter's exposition.
type series struct {
	Labels map[string]string
	Value  float64
}

// parseMetrics reads the Prometheus text format into series by metric name.
func parseMetrics(text []byte) (map[string][]series, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(bytes.NewReader(text))
	if err != nil {
		return nil, err
	}
	out := make(map[string][]series, len(families))
	for name, mf := range families {
		for _, m := range mf.GetMetric() {
			s := series{Labels: map[string]string{}}
			for _, l := range m.GetLabel() {
				s.Labels[l.GetName()] = l.GetValue()
			}
			switch {
			case m.Gauge != nil:
				s.Value = m.GetGauge().GetValue()
			case m.Counter != nil:
				s.Value = m.GetCounter().GetValue()
			case m.Untyped != nil:
				s.Value = m.GetUntyped().GetValue()
			default:
				continue
			}
			out[name] = append(out[name], s)
		}
	}
	return out, nil
}

// find returns the value of the series of name whose labels include want.
func find(m map[string][]series, name string, want map[string]string) (float64, bool) {
	for _, s := range m[name] {
		match := true
		for k, v := range want {
			match = match && s.Labels[k] == v
		}
		if match {
			return s.Value, true
		}
	}
	return 0, false
}

// sum adds the values of the series of name whose labels include want.
func sum(m map[string][]series, name string, want map[string]string) float64 {
	total := 0.0
	for _, s := range m[name] {
		match := true
		for k, v := range want {
			match = match && s.Labels[k] == v
		}
		if match {
			total += s.Value
		}
	}
	return total
}

// Result of one check.
type status string

const (
	pass status = "PASS"
	fail status = "FAIL"
	skip status = "SKIP"
)

// row is one line of the final table.
type row struct {
	Check  string
	Status status
	Detail string
}

// renderTable prints rows as an aligned text table, then a count line.
func renderTable(w io.Writer, rows []row) {
	wc, ws := len("check"), len("result")
	for _, r := range rows {
		wc, ws = max(wc, len(r.Check)), max(ws, len(r.Status))
	}
	fmt.Fprintf(w, "%-*s  %-*s  %s\n", wc, "check", ws, "result", "detail")
	fmt.Fprintf(w, "%s  %s  %s\n", strings.Repeat("-", wc), strings.Repeat("-", ws), strings.Repeat("-", 6))
	counts := map[status]int{}
	for _, r := range rows {
		counts[r.Status]++
		fmt.Fprintf(w, "%-*s  %-*s  %s\n", wc, r.Check, ws, r.Status, r.Detail)
	}
	fmt.Fprintf(w, "%d passed, %d failed, %d skipped\n", counts[pass], counts[fail], counts[skip])
}

// podSlice and the scope name follow the kubelet's systemd cgroup
// driver with containerd: the UID's dashes become underscores.
func podSlice(qos, uid string) string {
	return "kubepods-" + qos + "-pod" + strings.ReplaceAll(uid, "-", "_") + ".slice"
}

// cgroupDir is a container's cgroup v2 directory under root
// (/sys/fs/cgroup) for a pod of QoS class qos (besteffort, burstable).
func cgroupDir(root, qos, uid, containerID string) string {
	return root + "/kubepods.slice/kubepods-" + qos + ".slice/" + podSlice(qos, uid) + "/cri-containerd-" + containerID + ".scope"
}

// criLine is one line of a container log in the CRI format the kubelet
// writes: time, stream, F (a full line), text.
func criLine(at string, stream, text string) string {
	return at + " " + stream + " F " + text + "\n"
}

// within reports whether got is within tol of want.
func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol }

// parseStatTicks reads utime + stime (USER_HZ ticks) from a
// /proc/<pid>/stat line; the command name may hold spaces and parentheses,
// so the fields are counted from the last ')'.
func parseStatTicks(stat []byte) (uint64, error) {
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return 0, fmt.Errorf("stat %q: no command name", stat)
	}
	f := strings.Fields(string(stat[i+1:]))
	// f[0] is field 3 (state); utime and stime are fields 14 and 15.
	if len(f) < 13 {
		return 0, fmt.Errorf("stat %q: too few fields", stat)
	}
	utime, err := strconv.ParseUint(f[11], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat utime: %w", err)
	}
	stime, err := strconv.ParseUint(f[12], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("stat stime: %w", err)
	}
	return utime + stime, nil
}
