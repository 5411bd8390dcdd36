package dra

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"
)

// TestInformerErrNamesTheRefusal: an informer whose lists are refused (no
// RBAC for ResourceSlices) says why in Err, not only that it has not
// synced.
func TestInformerErrNamesTheRefusal(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`{"kind":"Status","apiVersion":"v1","status":"Failure","message":"resourceslices.resource.k8s.io is forbidden: no RBAC","reason":"Forbidden","code":403}`))
	}))
	defer srv.Close()
	inf, err := NewInformer(&rest.Config{Host: srv.URL}, "n1")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	go func() { _ = inf.Start(ctx) }()
	for ctx.Err() == nil {
		if err := inf.Err(); err != nil && strings.Contains(err.Error(), "forbidden") {
			if !strings.Contains(err.Error(), "n1") {
				t.Errorf("Err %v does not name the node", err)
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Errorf("lists refused for 20 s: Err %v, want the API server's answer", inf.Err())
}
