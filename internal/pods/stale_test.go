package pods

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

// TestInformerErrWhenListsFail: after its first sync, an informer whose
// lists and watches are refused (RBAC revoked, the API server gone) says
// so in Err, with the API server's answer, rather than serving a stale
// cache as healthy; once they succeed again Err is nil.
func TestInformerErrWhenListsFail(t *testing.T) {
	var broken atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if broken.Load() {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"pods is forbidden: revoked","reason":"Forbidden","code":403}`))
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") == "true" {
			// A watch that ends at once: the reflector lists and
			// watches again, soon.
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
			return
		}
		list := corev1.PodList{Items: []corev1.Pod{*pod("ml", "yolo", "uid-1", "n1", nil)}}
		list.ResourceVersion = "1"
		_ = json.NewEncoder(w).Encode(list)
	}))
	defer srv.Close()
	inf, err := NewInformer(&rest.Config{Host: srv.URL}, "n1", 0)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if err := inf.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := inf.Err(); err != nil {
		t.Fatalf("synced: Err %v", err)
	}
	waitErr := func(want bool) error {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := inf.Err()
			if (err != nil) == want || time.Now().After(deadline) {
				return err
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	broken.Store(true)
	if err := waitErr(true); err == nil || !strings.Contains(err.Error(), "forbidden") || !strings.Contains(err.Error(), "n1") {
		t.Errorf("lists refused: Err %v, want the API server's answer and the node", err)
	}
	broken.Store(false)
	if err := waitErr(false); err != nil {
		t.Errorf("lists served again: Err %v, want nil", err)
	}
}
