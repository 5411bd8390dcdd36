package realnode_test

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/gpuslice/gpuslice/internal/testproc"
)

// scraper scrapes one exporter at a fixed interval, as Prometheus would,
// and adds up the OOM counters across exporter restarts the way increase()
// does: a counter lower than before started again from 0.
type scraper struct {
	interval time.Duration

	mu    sync.Mutex
	addr  string
	last  map[string]float64 // series → last value seen from this process
	total map[string]float64 // pod → OOM events counted, all sources
	err   error
	stop  chan struct{}
	done  chan struct{}
}

func newScraper(addr string, interval time.Duration) *scraper {
	s := &scraper{interval: interval, addr: addr, last: map[string]float64{}, total: map[string]float64{},
		stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			s.scrapeOnce()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

func (s *scraper) scrapeOnce() {
	s.mu.Lock()
	defer s.mu.Unlock()
	body, err := scrape(s.addr)
	if err != nil {
		s.err = err
		return
	}
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, "gpuslice_gpu_oom_events_total{") {
			continue
		}
		series := line[:strings.LastIndexByte(line, ' ')]
		v, err := strconv.ParseFloat(line[len(series)+1:], 64)
		if err != nil {
			continue
		}
		pod := label(series, "pod")
		prev, seen := s.last[series]
		switch {
		case !seen:
			s.total[pod] += v // born at v after its first event (or 0)
		case v >= prev:
			s.total[pod] += v - prev
		default: // reset: a new exporter process
			s.total[pod] += v
		}
		s.last[series] = v
	}
}

// restarted points the scraper at a new exporter process: its series start
// again.
func (s *scraper) restarted(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addr = addr
	s.last = map[string]float64{}
}

func (s *scraper) count(pod string) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.total[pod]
}

func (s *scraper) close() {
	close(s.stop)
	<-s.done
}

func label(series, name string) string {
	i := strings.Index(series, name+`="`)
	if i < 0 {
		return ""
	}
	rest := series[i+len(name)+2:]
	return rest[:strings.IndexByte(rest, '"')]
}

// runsEnded is how many runs of the pod's container have ended: one per
// restart plus the first; -1 while the newest run has not ended (its OOM
// may not have happened yet).
func runsEnded(p *corev1.Pod) int {
	if len(p.Status.ContainerStatuses) == 0 {
		return -1
	}
	c := p.Status.ContainerStatuses[0]
	if c.State.Running != nil || (c.State.Waiting != nil && c.State.Waiting.Reason == "ContainerCreating") {
		return -1
	}
	if c.State.Terminated == nil && c.LastTerminationState.Terminated == nil {
		return -1
	}
	return int(c.RestartCount) + 1
}

// TestEveryOOMCounted: crash-looping containers whose process OOMs 2 s
// after it starts, a restartPolicy: Never pod that OOMs in its first second
// and one whose first line is the OOM, each seen by three exporters scraped
// every 5 s, 15 s and 60 s; the 15 s exporter is restarted mid-way. Every
// run is counted exactly once by each exporter (across the restart for the
// 15 s one), however the real kubelet names, keeps and removes the logs.
func TestEveryOOMCounted(t *testing.T) {
	n := need(t)
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeConfig(t, cfg, 8)
	startPlugin(t, cfg)
	waitAllocatable(t, gpuRes, 8, 60*time.Second)

	intervals := []time.Duration{5 * time.Second, 15 * time.Second, 60 * time.Second}
	scrapers := make([]*scraper, len(intervals))
	procs := make([]*testproc.Process, len(intervals))
	for i, iv := range intervals {
		p, addr := startExporter(t)
		procs[i] = p
		scrapers[i] = newScraper(addr, iv)
		defer scrapers[i].close()
	}
	const wantRuns = 5
	loop := createPod(t, fakeCUDAPod("oom-loop", podOpts{args: []string{"-memory", "0s=1Gi,2s=100Gi", "-framework", "pytorch"}}))
	never := createPod(t, fakeCUDAPod("oom-never", podOpts{restart: corev1.RestartPolicyNever,
		args: []string{"-memory", "0s=1Gi,500ms=100Gi", "-framework", "cuda"}}))
	first := createPod(t, fakeCUDAPod("oom-firstline", podOpts{restart: corev1.RestartPolicyNever,
		args: []string{"-memory", "0s=100Gi", "-framework", "llamacpp", "-quiet"}}))
	// Its only line has no newline: containerd writes it tagged P (the
	// runtime's last output, not ended), and no F line follows.
	unended := createPod(t, fakeCUDAPod("oom-unended", podOpts{restart: corev1.RestartPolicyNever,
		args: []string{"-memory", "0s=100Gi", "-framework", "cupy", "-quiet", "-no-final-newline"}}))
	_ = n

	// Restart the 15 s exporter once the loop has run twice.
	testproc.Eventually(t, 120*time.Second, 500*time.Millisecond, func() string {
		if r := runsEnded(getPod(t, loop.Name)); r < 2 {
			return fmt.Sprintf("oom-loop has ended %d runs, waiting for 2", r)
		}
		return ""
	})
	scrapers[1].scrapeOnce() // what Prometheus saw last of the old process
	_ = procs[1].Stop()
	_, addr := startExporter(t)
	scrapers[1].restarted(addr)
	t.Logf("15 s exporter restarted after run %d", runsEnded(getPod(t, loop.Name)))

	// When the kubelet reports a container Waiting in CrashLoopBackOff, its
	// lastState is the run that just died, with the status's own container
	// ID and restartCount at that run's number (kubelet_pods.go; the
	// exporter files that termination under that run: appendTerminations).
	// Checked whenever a poll finds it so. At one poll a second over the
	// loop's last three runs, this kubelet (v1.37.1) was not once seen so
	// in 2026-11-29's run.
	backoffs := 0
	testproc.Eventually(t, 6*time.Minute, time.Second, func() string {
		p := getPod(t, loop.Name)
		if cs := p.Status.ContainerStatuses; len(cs) == 1 && cs[0].State.Waiting != nil && cs[0].State.Waiting.Reason == "CrashLoopBackOff" {
			last := cs[0].LastTerminationState.Terminated
			if last == nil || last.ContainerID == "" || last.ContainerID != cs[0].ContainerID {
				t.Errorf("in back-off: lastState %+v, container ID %q; want the run that died, under the status's container ID", last, cs[0].ContainerID)
			}
			backoffs++
		}
		if r := runsEnded(p); r < wantRuns {
			return fmt.Sprintf("oom-loop has ended %d runs (%s)", r, podWhy(p))
		}
		return ""
	})
	t.Logf("oom-loop seen in CrashLoopBackOff at %d polls", backoffs)
	// One more scrape of each after every run has ended; a run that began
	// meanwhile is waited for too.
	var runs int
	for {
		runs = runsEnded(getPod(t, loop.Name))
		if runs < 0 {
			time.Sleep(time.Second)
			continue
		}
		for _, s := range scrapers {
			s.scrapeOnce()
		}
		if runsEnded(getPod(t, loop.Name)) == runs {
			break
		}
	}
	for _, p := range []*corev1.Pod{never, first, unended} {
		if got := getPod(t, p.Name); got.Status.Phase != corev1.PodFailed {
			t.Errorf("%s: phase %s, want Failed after its OOM (%s)", p.Name, got.Status.Phase, podWhy(got))
		}
	}
	log := strings.TrimSpace(containerLog(t, getPod(t, unended.Name), "cuda"))
	t.Logf("%s: its log file holds %q", unended.Name, log)
	if f := strings.Fields(log); len(f) < 4 || f[1] != "stderr" || f[2] != "P" || !strings.Contains(log, "OutOfMemoryError") || strings.Count(log, "\n") != 0 {
		t.Errorf("%s: log %q, want the one OOM line on stderr tagged P", unended.Name, log)
	}
	want := map[string]int{loop.Name: runs, never.Name: 1, first.Name: 1, unended.Name: 1}
	for i, s := range scrapers {
		for pod, w := range want {
			got := s.count(pod)
			t.Logf("scrape every %v: %s: %d runs ended, %v OOMs counted", intervals[i], pod, w, got)
			if got != float64(w) {
				t.Errorf("scrape every %v: %s: %v OOMs counted, want %d (one per run)", intervals[i], pod, got, w)
			}
		}
	}
}
