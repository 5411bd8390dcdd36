package realnode_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/realnode"
)

// exampleReceiverURL is the placeholder the shipped example configuration
// gives its webhook receivers ("replace the webhook URLs with your own").
const exampleReceiverURL = "http://alert-receiver.monitoring.svc:8080"

// alertmanager is a real Alertmanager (Debian's prometheus-alertmanager)
// running the shipped example configuration, alerts/alertmanager-example.yaml,
// with its webhook receivers pointed at a recorder in the test: the only
// change, as the file's header asks of users.
type alertmanager struct {
	addr string // host:port, for Prometheus's alerting config

	mu       sync.Mutex
	received []webhookCall
}

// webhookCall is one notification a webhook receiver got: the receiver
// (the URL path the example gives it) and Alertmanager's payload.
type webhookCall struct {
	Path    string
	Payload struct {
		Receiver string `json:"receiver"`
		Status   string `json:"status"`
		Alerts   []struct {
			Status string            `json:"status"`
			Labels map[string]string `json:"labels"`
		} `json:"alerts"`
	}
}

func runAlertmanager(t *testing.T) *alertmanager {
	t.Helper()
	bin, err := exec.LookPath("prometheus-alertmanager")
	if err != nil {
		t.Fatalf("prometheus-alertmanager not in PATH (Debian: apt-get install prometheus-alertmanager; hack/test-deps.sh installs it): %v", err)
	}
	am := &alertmanager{}
	rec := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var c webhookCall
		c.Path = r.URL.Path
		body, _ := io.ReadAll(r.Body)
		if err := json.Unmarshal(body, &c.Payload); err != nil {
			t.Errorf("webhook %s: %v\n%s", r.URL.Path, err, body)
		}
		am.mu.Lock()
		am.received = append(am.received, c)
		am.mu.Unlock()
	}))
	t.Cleanup(rec.Close)

	example := filepath.Join(realnode.Repo(), "alerts", "alertmanager-example.yaml")
	data, err := os.ReadFile(example)
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(data), exampleReceiverURL); n != 2 {
		t.Fatalf("%s names %s %d times; the test points the default and gpu-oom receivers (2) at its recorder", example, exampleReceiverURL, n)
	}
	dir := t.TempDir()
	cfg := filepath.Join(dir, "alertmanager.yml")
	if err := os.WriteFile(cfg, []byte(strings.ReplaceAll(string(data), exampleReceiverURL, rec.URL)), 0o644); err != nil {
		t.Fatal(err)
	}
	// amtool accepts both the file as shipped and as run.
	for _, f := range []string{example, cfg} {
		if out, err := exec.Command("amtool", "check-config", f).CombinedOutput(); err != nil {
			t.Fatalf("amtool check-config %s: %v\n%s", f, err, out)
		}
	}
	am.addr = testproc.FreeAddr(t)
	testproc.Start(t, "alertmanager", nil, bin, "--config.file="+cfg, "--storage.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+am.addr, "--cluster.listen-address=", "--log.level=warn")
	testproc.Eventually(t, 30*time.Second, 200*time.Millisecond, func() string {
		resp, err := http.Get("http://" + am.addr + "/-/ready")
		if err != nil {
			return err.Error()
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return "alertmanager not ready: " + resp.Status
		}
		return ""
	})
	return am
}

// active says why Alertmanager's API (v2 /api/v2/alerts) has no active alert
// name with every one of labels, routed to receiver alone.
func (a *alertmanager) active(name string, labels map[string]string, receiver string) string {
	var alerts []struct {
		Labels    map[string]string `json:"labels"`
		Receivers []struct {
			Name string `json:"name"`
		} `json:"receivers"`
		Status struct {
			State string `json:"state"`
		} `json:"status"`
	}
	if err := getJSON("http://"+a.addr+"/api/v2/alerts", &alerts); err != nil {
		return err.Error()
	}
	var seen []string
	for _, al := range alerts {
		var receivers []string
		for _, r := range al.Receivers {
			receivers = append(receivers, r.Name)
		}
		seen = append(seen, fmt.Sprintf("%v %s -> %v", al.Labels, al.Status.State, receivers))
		if al.Labels["alertname"] != name || !hasLabels(al.Labels, labels) {
			continue
		}
		if al.Status.State != "active" || !slices.Equal(receivers, []string{receiver}) {
			return fmt.Sprintf("alert %s is %s, routed to %v, want active and routed to [%s]", name, al.Status.State, receivers, receiver)
		}
		return ""
	}
	return fmt.Sprintf("Alertmanager has no alert %s%v; it has %q", name, labels, seen)
}

// notified says why the webhook of receiver (the example's URL path
// /<receiver>) got no firing notification of alert name with labels.
func (a *alertmanager) notified(receiver, name string, labels map[string]string) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var seen []string
	for _, c := range a.received {
		for _, al := range c.Payload.Alerts {
			seen = append(seen, fmt.Sprintf("%s (%s): %s %v", c.Path, c.Payload.Receiver, al.Status, al.Labels))
			if c.Path == "/"+receiver && c.Payload.Receiver == receiver && al.Status == "firing" &&
				al.Labels["alertname"] == name && hasLabels(al.Labels, labels) {
				return ""
			}
		}
	}
	return fmt.Sprintf("receiver %s got no notification of %s%v; notifications: %q", receiver, name, labels, seen)
}

// notifiedOf lists the receivers whose webhook got a notification of
// alert name.
func (a *alertmanager) notifiedOf(name string) []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []string
	for _, c := range a.received {
		for _, al := range c.Payload.Alerts {
			if al.Labels["alertname"] == name && !slices.Contains(out, c.Payload.Receiver) {
				out = append(out, c.Payload.Receiver)
			}
		}
	}
	return out
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}
