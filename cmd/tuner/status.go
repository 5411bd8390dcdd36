package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	promapi "github.com/prometheus/client_golang/api"
	promv1 "github.com/prometheus/client_golang/api/prometheus/v1"
	"github.com/prometheus/common/model"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/gpuslice/gpuslice/internal/status"
)

// exporterFlags collects repeated --exporter NODE=URL.
type exporterFlags map[string]string

func (e exporterFlags) String() string { return fmt.Sprint(map[string]string(e)) }

func (e exporterFlags) Set(s string) error {
	node, u, ok := strings.Cut(s, "=")
	if !ok || node == "" {
		return fmt.Errorf("%q: want NODE=URL", s)
	}
	parsed, err := url.Parse(u)
	if err != nil || (parsed.Scheme != "http" && parsed.Scheme != "https") || parsed.Host == "" {
		return fmt.Errorf("%q: %q is not an http(s) URL", s, u)
	}
	e[node] = u
	return nil
}

// statusSynopsis is status's part of the usage text. TestStatusSynopsis
// checks that it names every flag statusFlags defines, so a new flag
// cannot be left out of it again.
const statusSynopsis = `gpuslice-tuner status [--kubeconfig FILE] [--exporter NODE=URL ...] [-o text|json]
                        [--prometheus URL [--prometheus.node-label LABEL]] [--timeout DURATION]`

type statusOptions struct {
	kubeconfig, output, promURL, nodeLabel string
	timeout                                time.Duration
	exporters                              exporterFlags
}

// statusFlags defines status's flags. A backquoted word in a flag's help
// text is its placeholder in -h, so each help text quotes only that.
func statusFlags(stderr io.Writer) (*flag.FlagSet, *statusOptions) {
	o := &statusOptions{exporters: exporterFlags{}}
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage:\n  %s\n\nflags:\n", statusSynopsis)
		fs.PrintDefaults()
	}
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "Kubeconfig `FILE`; empty means in-cluster.")
	fs.StringVar(&o.output, "o", "text", "Output format: text or json.")
	fs.DurationVar(&o.timeout, "timeout", 10*time.Second, "Time allowed for the API server and each exporter; more than 0.")
	fs.StringVar(&o.promURL, "prometheus", "", "`URL` of a Prometheus that scrapes the exporters (without /api/v1): the OOMS column then counts the last hour (OOMS(1H)) instead of since each exporter started.")
	fs.StringVar(&o.nodeLabel, "prometheus.node-label", "node", "The `LABEL` the Prometheus scrape config puts the node name in.")
	fs.Var(o.exporters, "exporter", "`NODE=URL` of a node's gpuslice-exporter /metrics (repeat per node), e.g. a kubectl port-forward to the exporter pod or its pod IP. NODE must be a node the API server lists.")
	return fs, o
}

// statusCommand is `gpuslice-tuner status`: one look at every GPU node,
// from the API server and one scrape of each node's exporter, printed as
// aligned text or JSON. It lives in the tuner's binary because it shows the
// tuner's decisions beside what they were made from, and a cluster that
// runs gpuslice has that binary (in its image) and a kubeconfig at hand.
func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer, now func() time.Time) error {
	fs, o := statusFlags(stderr)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: status: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: status: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if o.output != "text" && o.output != "json" {
		return fmt.Errorf("%w: status: -o %q: want text or json", errUsage, o.output)
	}
	// 0 would not mean "no limit": every request would fail at once with
	// a bare "context deadline exceeded".
	if o.timeout <= 0 {
		return fmt.Errorf("%w: status: --timeout %s: want more than 0", errUsage, o.timeout)
	}
	// The label stands unquoted in RecentOOMQuery's by clause and matcher,
	// so it must be a legacy name: promtool 2.42 fails to parse the query
	// with k8s.node in it ("unexpected character: '.'").
	if !model.LegacyValidation.IsValidLabelName(o.nodeLabel) {
		return fmt.Errorf("%w: status: --prometheus.node-label %q is not a label name PromQL takes unquoted ([a-zA-Z_][a-zA-Z0-9_]*)", errUsage, o.nodeLabel)
	}
	client, err := kubeClient(o.kubeconfig)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, o.timeout)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(lctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("status: listing nodes: %w", err)
	}
	// An --exporter node the API server does not list (a typo, or a node
	// deleted since) fails the command, as `kubectl get nodes a typo`
	// does: the report of the listed nodes is still printed, and the exit
	// status 1 tells a script that a node it asked about is missing from
	// it. Not a usage error: the command line is well formed, and the same
	// one succeeds once the node exists. Its URL is not scraped: the
	// report has no block to show it in.
	var unlisted []error
	for _, node := range status.Unlisted(nodes.Items, slices.Collect(maps.Keys(o.exporters))) {
		unlisted = append(unlisted, fmt.Errorf("status: --exporter %s=%s: the API server lists no node %q", node, o.exporters[node], node))
		delete(o.exporters, node)
	}
	scrapes := map[string]status.Scrape{}
	errs := map[string]error{}
	for node, u := range o.exporters {
		s, err := scrape(ctx, u, o.timeout)
		if err != nil {
			errs[node] = err
			continue
		}
		scrapes[node] = s
	}
	r := status.Build(nodes.Items, scrapes, errs)
	if o.promURL != "" {
		counts, err := recentOOMs(ctx, o.promURL, o.nodeLabel, o.timeout, now())
		if err != nil {
			return fmt.Errorf("status: %w", err)
		}
		r.SetRecentOOMs(counts)
	}
	if o.output == "json" {
		err = r.JSON(stdout)
	} else {
		err = r.Text(stdout, now())
	}
	if err != nil {
		return err
	}
	return errors.Join(unlisted...)
}

func scrape(ctx context.Context, u string, timeout time.Duration) (status.Scrape, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return nil, err
	}
	// The text format: the parser reads nothing else.
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scraping %s: %w", u, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scraping %s: %s", u, resp.Status)
	}
	return status.ParseScrape(u, resp.Body)
}

// RecentOOMQuery is the PromQL behind OOMS(1H): each container's GPU OOM
// events in the last hour, per node and GPU, whatever their source and
// kind. increase() copes with counter resets (it extrapolates, hence the
// rounding to whole events) but needs two samples, and the exporter
// creates the counters of some kinds at their first event: a series with
// no sample an hour ago counts its last value in the hour (it may have
// ended since). A rolled-out exporter counts no history again
// (internal/oom), so each series, instance included, is its own.
func RecentOOMQuery(nodeLabel string) string {
	m := "gpuslice_gpu_oom_events_total{" + nodeLabel + `!=""}`
	return "round(sum by (" + nodeLabel + ", uuid, namespace, pod, container) (" +
		"(last_over_time(" + m + "[1h]) unless " + m + " offset 1h) or increase(" + m + "[1h])))"
}

// recentOOMs asks Prometheus for RecentOOMQuery at now; statusCommand has
// checked nodeLabel.
func recentOOMs(ctx context.Context, u, nodeLabel string, timeout time.Duration, now time.Time) (map[status.OOMKey]float64, error) {
	c, err := promapi.NewClient(promapi.Config{Address: u})
	if err != nil {
		return nil, fmt.Errorf("--prometheus %q: %w", u, err)
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	q := RecentOOMQuery(nodeLabel)
	v, _, err := promv1.NewAPI(c).Query(ctx, q, now)
	if err != nil {
		return nil, fmt.Errorf("prometheus %s: query %s: %w", u, q, err)
	}
	vec, ok := v.(model.Vector)
	if !ok {
		return nil, fmt.Errorf("prometheus %s: query %s: got %s, want a vector", u, q, v.Type())
	}
	out := make(map[status.OOMKey]float64, len(vec))
	for _, smp := range vec {
		m := smp.Metric
		out[status.OOMKey{Node: string(m[model.LabelName(nodeLabel)]), UUID: string(m["uuid"]), Namespace: string(m["namespace"]),
			Pod: string(m["pod"]), Container: string(m["container"])}] = float64(smp.Value)
	}
	return out, nil
}
