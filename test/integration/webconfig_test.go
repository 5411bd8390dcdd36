package integration

import (
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/gpuslice/gpuslice/internal/testproc"
	"github.com/gpuslice/gpuslice/test/simnode"
)

// TestExporterBasicAuth runs gpuslice-exporter with an exporter-toolkit web
// config requiring basic auth: /metrics answers 401 without the password
// and 200 with it, as any Prometheus exporter would.
func TestExporterBasicAuth(t *testing.T) {
	n, err := simnode.Demo("gpu-node-1", t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Sync(); err != nil {
		t.Fatal(err)
	}
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	webConfig := filepath.Join(t.TempDir(), "web.yml")
	if err := os.WriteFile(webConfig, []byte("basic_auth_users:\n  prometheus: "+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := testproc.FreeAddr(t)
	start(t, testproc.Build(t, "cmd/exporter"), "--web.listen-address="+addr, "--web.config.file="+webConfig,
		"--gpu.backend=sim", "--sim.file="+n.SimFile(), "--path.procfs="+n.Procfs(), "--path.pod-logs="+n.PodLogs(),
		"--kubelet.pod-resources-socket=", "--pods.source=none")
	url := "http://" + addr + "/metrics"
	status := func(user, pass string) int {
		req, _ := http.NewRequest(http.MethodGet, url, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	testproc.Eventually(t, 20*time.Second, 100*time.Millisecond, func() string {
		if s := status("prometheus", "s3cret"); s != http.StatusOK {
			return "with the password: " + http.StatusText(s)
		}
		return ""
	})
	if s := status("", ""); s != http.StatusUnauthorized {
		t.Errorf("without a password: %d, want 401", s)
	}
	if s := status("prometheus", "wrong"); s != http.StatusUnauthorized {
		t.Errorf("with a wrong password: %d, want 401", s)
	}
}
