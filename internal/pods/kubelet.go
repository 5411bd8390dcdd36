package pods

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// KubeletConfig says how to reach the kubelet's /pods endpoint.
type KubeletConfig struct {
	// URL is the kubelet's base URL, e.g. https://10.0.0.5:10250.
	URL string
	// TokenFile holds the bearer token (the service-account token); empty
	// sends none.
	TokenFile string
	// CAFile verifies the kubelet's serving certificate; empty uses the
	// system roots.
	CAFile string
	// InsecureSkipVerify accepts any kubelet certificate (self-signed kubelet
	// certificates are common on small clusters).
	InsecureSkipVerify bool
	// Interval is how often the pod list is refreshed.
	Interval time.Duration
	Logger   *slog.Logger
}

// Kubelet is a Source that polls the kubelet's /pods endpoint.
type Kubelet struct {
	cfg    KubeletConfig
	client *http.Client

	mu    sync.RWMutex
	byUID map[string]*corev1.Pod
	all   []*corev1.Pod
	err   error
}

// NewKubelet validates cfg; Start begins polling.
func NewKubelet(cfg KubeletConfig) (*Kubelet, error) {
	if cfg.URL == "" {
		return nil, fmt.Errorf("pods: the kubelet source needs --kubelet.url")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 10 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	tlsCfg := &tls.Config{InsecureSkipVerify: cfg.InsecureSkipVerify} //nolint:gosec // opt-in by flag, see KubeletConfig
	if cfg.CAFile != "" {
		pem, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return nil, fmt.Errorf("pods: kubelet CA file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("pods: kubelet CA file %s holds no PEM certificate", cfg.CAFile)
		}
		tlsCfg.RootCAs = pool
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.TLSClientConfig = tlsCfg
	return &Kubelet{
		cfg:    cfg,
		client: &http.Client{Transport: tr, Timeout: 10 * time.Second},
		err:    fmt.Errorf("pods: no pod list read from %s yet", cfg.URL),
	}, nil
}

// Start reads the pod list once (returning its error, which is not fatal:
// polling goes on) and then refreshes it every Interval until ctx ends.
func (k *Kubelet) Start(ctx context.Context) error {
	err := k.Refresh(ctx)
	go func() {
		t := time.NewTicker(k.cfg.Interval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				if err := k.Refresh(ctx); err != nil {
					k.cfg.Logger.Warn("reading pods from the kubelet", "url", k.cfg.URL, "err", err)
				}
			}
		}
	}()
	return err
}

// Refresh reads /pods now. On failure the previous list is kept (a kubelet
// restart should not make every container unattributed) and Err reports it.
func (k *Kubelet) Refresh(ctx context.Context) error {
	list, err := k.fetch(ctx)
	k.mu.Lock()
	defer k.mu.Unlock()
	k.err = err
	if err != nil {
		return err
	}
	k.byUID = make(map[string]*corev1.Pod, len(list.Items))
	k.all = make([]*corev1.Pod, 0, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		k.byUID[string(p.UID)] = p
		k.all = append(k.all, p)
	}
	return nil
}

func (k *Kubelet) fetch(ctx context.Context) (*corev1.PodList, error) {
	url := strings.TrimSuffix(k.cfg.URL, "/") + "/pods"
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("pods: %w", err)
	}
	if k.cfg.TokenFile != "" {
		// Read each time: projected service-account tokens are rotated.
		tok, err := os.ReadFile(k.cfg.TokenFile)
		if err != nil {
			return nil, fmt.Errorf("pods: kubelet token: %w", err)
		}
		req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("pods: GET %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return nil, fmt.Errorf("pods: GET %s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	var list corev1.PodList
	if err := json.NewDecoder(resp.Body).Decode(&list); err != nil {
		return nil, fmt.Errorf("pods: GET %s: decoding pod list: %w", url, err)
	}
	return &list, nil
}

// Get implements Source.
func (k *Kubelet) Get(uid string) (*corev1.Pod, bool) {
	k.mu.RLock()
	defer k.mu.RUnlock()
	p, ok := k.byUID[uid]
	return p, ok
}

// List implements Source.
func (k *Kubelet) List() []*corev1.Pod {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.all
}

// Err implements Source.
func (k *Kubelet) Err() error {
	k.mu.RLock()
	defer k.mu.RUnlock()
	return k.err
}

// Static is a fixed Source, for tests and benchmarks.
type Static struct {
	byUID map[string]*corev1.Pod
	all   []*corev1.Pod
}

// NewStatic indexes pods.
func NewStatic(pods []*corev1.Pod) *Static {
	s := &Static{byUID: make(map[string]*corev1.Pod, len(pods)), all: pods}
	for _, p := range pods {
		s.byUID[string(p.UID)] = p
	}
	return s
}

// Get implements Source.
func (s *Static) Get(uid string) (*corev1.Pod, bool) { p, ok := s.byUID[uid]; return p, ok }

// List implements Source.
func (s *Static) List() []*corev1.Pod { return s.all }

// Err implements Source.
func (s *Static) Err() error { return nil }
