package signals

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	promconfig "github.com/prometheus/common/config"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	listersv1 "k8s.io/client-go/listers/core/v1"

	"github.com/gpuslice/gpuslice/internal/tuner/config"
	"github.com/gpuslice/gpuslice/internal/tuner/policy"
)

// maxConcurrentScrapes bounds how many exporters are scraped at once.
const maxConcurrentScrapes = 16

// maxBody bounds one exporter's answer; a node's exposition is a few
// hundred kilobytes at most.
const maxBody = 32 << 20

// Target is one exporter to scrape.
type Target struct {
	// Node is the node the exporter reports on.
	Node string
	URL  string
	// ID tells two exporters of one node apart (during a rollout); each has
	// its own OOM counter baseline.
	ID string
}

// ExportersOptions configures NewExporters.
type ExportersOptions struct {
	Config config.Exporters
	// Client discovers exporter pods; nil (or Config.Targets set) scrapes
	// only Config.Targets.
	Client kubernetes.Interface
	// Interval between scrapes: policy.sampleInterval.
	Interval time.Duration
	// Keep is how much history to keep: at least policy.window.
	Keep   time.Duration
	Logger *slog.Logger
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// Exporters is the `exporters` source: it scrapes gpuslice-exporter's
// /metrics every interval and keeps the window in memory.
type Exporters struct {
	o      ExportersOptions
	log    *slog.Logger
	now    func() time.Time
	client *http.Client
	window *Window
	// pods is the exporter pod informer; nil with static targets.
	pods    informers.SharedInformerFactory
	podList listersv1.PodLister
	sel     labels.Selector

	mu       sync.Mutex
	trackers map[string]*oomTracker // by Target.ID
	failing  map[string]bool        // by Target.ID, to log state changes only
	idle     map[string]idleLook    // by node: the latest scrape's holders
}

// NewExporters builds the source; Run starts it.
func NewExporters(o ExportersOptions) (*Exporters, error) {
	if o.Interval <= 0 || o.Keep <= 0 {
		return nil, fmt.Errorf("signals: interval (%s) and keep (%s) must be > 0", o.Interval, o.Keep)
	}
	client, err := promconfig.NewClientFromConfig(o.Config.HTTPClient, "gpuslice-tuner")
	if err != nil {
		return nil, fmt.Errorf("signals.exporters.httpClient: %w", err)
	}
	client.Timeout = o.Config.Timeout
	e := &Exporters{o: o, log: o.Logger, now: o.Now, client: client, window: NewWindow(o.Keep),
		trackers: map[string]*oomTracker{}, failing: map[string]bool{}}
	if e.log == nil {
		e.log = slog.Default()
	}
	if e.now == nil {
		e.now = time.Now
	}
	if len(o.Config.Targets) == 0 && o.Client != nil {
		if e.sel, err = labels.Parse(o.Config.LabelSelector); err != nil {
			return nil, fmt.Errorf("signals.exporters.labelSelector: %w", err)
		}
		e.pods = informers.NewSharedInformerFactoryWithOptions(o.Client, 0, informers.WithNamespace(o.Config.Namespace),
			informers.WithTweakListOptions(func(lo *metav1.ListOptions) { lo.LabelSelector = e.sel.String() }))
		e.podList = e.pods.Core().V1().Pods().Lister()
	}
	return e, nil
}

// Observe implements Source from the in-memory window.
func (e *Exporters) Observe(ctx context.Context, now time.Time, window time.Duration) (map[string][]policy.GPUObservation, error) {
	return e.window.Observe(ctx, now, window)
}

// Run scrapes every interval until ctx ends.
func (e *Exporters) Run(ctx context.Context) error {
	if e.pods != nil {
		e.pods.Start(ctx.Done())
		defer e.pods.Shutdown()
		for typ, ok := range e.pods.WaitForCacheSync(ctx.Done()) {
			if !ok && ctx.Err() == nil {
				return fmt.Errorf("signals: syncing the %v informer", typ)
			}
		}
	}
	tick := time.NewTicker(e.o.Interval)
	defer tick.Stop()
	for {
		e.ScrapeOnce(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// Targets returns the exporters to scrape now: the static list, or the
// running exporter pods (none before Run has synced the pod informer).
func (e *Exporters) Targets() ([]Target, error) {
	c := e.o.Config
	if e.pods == nil {
		out := make([]Target, 0, len(c.Targets))
		for _, t := range c.Targets {
			out = append(out, Target{Node: t.Node, URL: t.URL, ID: t.Node + " " + t.URL})
		}
		return out, nil
	}
	pods, err := e.podList.Pods(c.Namespace).List(e.sel)
	if err != nil {
		return nil, err
	}
	// One exporter per node: during a DaemonSet's surge (or with two
	// matching DaemonSets) two run there, and both count every OOM of the
	// node's pods. A ready one before one that is not, then the oldest,
	// kept until it goes; the next one's first reading is its baseline.
	pick := map[string]*corev1.Pod{}
	for _, p := range pods {
		if p.Status.Phase != corev1.PodRunning || p.Status.PodIP == "" || p.Spec.NodeName == "" || p.DeletionTimestamp != nil {
			continue
		}
		if o := pick[p.Spec.NodeName]; o == nil || preferred(p, o) {
			pick[p.Spec.NodeName] = p
		}
	}
	var out []Target
	for _, p := range pick {
		port := c.Port
		for _, ctr := range p.Spec.Containers {
			for _, cp := range ctr.Ports {
				if cp.Name == c.PortName && c.PortName != "" {
					port = int(cp.ContainerPort)
				}
			}
		}
		url := c.Scheme + "://" + net.JoinHostPort(p.Status.PodIP, strconv.Itoa(port)) + c.Path
		out = append(out, Target{Node: p.Spec.NodeName, URL: url, ID: string(p.UID) + " " + url})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// preferred says whether exporter pod a is to be scraped rather than b on
// their node: ready first, then the older, then by name.
func preferred(a, b *corev1.Pod) bool {
	if ra, rb := podReady(a), podReady(b); ra != rb {
		return ra
	}
	if !a.CreationTimestamp.Equal(&b.CreationTimestamp) {
		return a.CreationTimestamp.Before(&b.CreationTimestamp)
	}
	return a.Name < b.Name
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// ScrapeOnce scrapes every target once, concurrently, and adds what it read
// to the window. A target that fails leaves a gap, which the policy reads as
// time nobody watched.
func (e *Exporters) ScrapeOnce(ctx context.Context) {
	targets, err := e.Targets()
	if err != nil {
		e.log.Warn("listing exporter pods", "err", err)
		return
	}
	sem := make(chan struct{}, maxConcurrentScrapes)
	var wg sync.WaitGroup
	for _, t := range targets {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			e.scrape(ctx, t)
		}()
	}
	wg.Wait()

	e.mu.Lock()
	live := map[string]bool{}
	for _, t := range targets {
		live[t.ID] = true
	}
	for id := range e.trackers {
		if !live[id] {
			delete(e.trackers, id)
			delete(e.failing, id)
		}
	}
	for node, l := range e.idle {
		if e.now().Sub(l.at) > idleStale*e.o.Interval {
			delete(e.idle, node)
		}
	}
	e.mu.Unlock()
	e.window.Prune(e.now())
}

func (e *Exporters) scrape(ctx context.Context, t Target) {
	at := e.now()
	r, start, err := e.fetch(ctx, t.URL)
	e.mu.Lock()
	defer e.mu.Unlock()
	if err != nil {
		if !e.failing[t.ID] && ctx.Err() == nil {
			e.log.Warn("scraping exporter failed; its node gets no samples until it answers", "node", t.Node, "url", t.URL, "err", err)
		}
		e.failing[t.ID] = true
		return
	}
	if e.failing[t.ID] {
		e.log.Info("exporter answers again", "node", t.Node, "url", t.URL)
		delete(e.failing, t.ID)
	}
	tr := e.trackers[t.ID]
	if tr == nil {
		tr = newOOMTracker()
		e.trackers[t.ID] = tr
	}
	tr.started(start)
	e.window.Add(t.Node, tr.samples(r, at))
	if e.idle == nil {
		e.idle = map[string]idleLook{}
	}
	e.idle[t.Node] = idleLook{at: at, holders: r.holders()}
}

func (e *Exporters) fetch(ctx context.Context, url string) (Reading, float64, error) {
	ctx, cancel := context.WithTimeout(ctx, e.o.Config.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil, 0, fmt.Errorf("%s: HTTP %s", url, resp.Status)
	}
	r, start, err := parseExposition(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, 0, fmt.Errorf("%s: %w", url, err)
	}
	return r, start, nil
}
