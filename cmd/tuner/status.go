package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

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

// statusCommand is `gpuslice-tuner status`: one look at every GPU node,
// from the API server and one scrape of each node's exporter, printed as
// aligned text or JSON. It lives in the tuner's binary because it shows the
// tuner's decisions beside what they were made from, and a cluster that
// runs gpuslice has that binary (in its image) and a kubeconfig at hand.
func statusCommand(ctx context.Context, args []string, stdout, stderr io.Writer, now func() time.Time) error {
	fs := flag.NewFlagSet("status", flag.ContinueOnError)
	fs.SetOutput(stderr)
	kubeconfig := fs.String("kubeconfig", "", "Kubeconfig; empty means in-cluster.")
	output := fs.String("o", "text", "Output format: text or json.")
	timeout := fs.Duration("timeout", 10*time.Second, "Time allowed for the API server and each exporter.")
	exporters := exporterFlags{}
	fs.Var(exporters, "exporter", "NODE=URL of a node's gpuslice-exporter /metrics (repeat per node), e.g. one `kubectl port-forward` or the exporter's pod IP.")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("%w: status: %w", errUsage, err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: status: unexpected argument %q", errUsage, fs.Arg(0))
	}
	if *output != "text" && *output != "json" {
		return fmt.Errorf("%w: status: -o %q: want text or json", errUsage, *output)
	}
	client, err := kubeClient(*kubeconfig)
	if err != nil {
		return fmt.Errorf("status: %w", err)
	}
	lctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	nodes, err := client.CoreV1().Nodes().List(lctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("status: listing nodes: %w", err)
	}
	scrapes := map[string]status.Scrape{}
	errs := map[string]error{}
	for node, u := range exporters {
		s, err := scrape(ctx, u, *timeout)
		if err != nil {
			errs[node] = err
			continue
		}
		scrapes[node] = s
	}
	r := status.Build(nodes.Items, scrapes, errs)
	if *output == "json" {
		return r.JSON(stdout)
	}
	return r.Text(stdout, now())
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
