package dashboards

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/cog/plugins"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
)

// strictDecode decodes a dashboard strictly and names every error's path.
// The SDK returns its error list as an error even when the list is empty (a
// typed nil), so an empty list is success.
func strictDecode(data []byte) error {
	var d dashboard.Dashboard
	err := d.UnmarshalJSONStrict(data)
	var list cog.BuildErrors
	if !errors.As(err, &list) {
		return err
	}
	var errs []error
	for _, e := range list {
		errs = append(errs, fmt.Errorf("%s: %s", e.Path, e.Message))
	}
	return errors.Join(errs...)
}

// No Grafana server can run here (none in Debian, npm or the Go module
// proxy in a runnable form), so the committed JSON is decoded strictly
// against the dashboard schema the SDK is generated from: the dashboard,
// its panels' options and field config per panel type, and the Prometheus
// queries. Unknown fields and wrong types are errors.
func TestDashboardsMatchSDKSchema(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	for _, f := range Files() {
		t.Run(f.Name, func(t *testing.T) {
			data, err := os.ReadFile(f.Name)
			if err != nil {
				t.Fatal(err)
			}
			if err := strictDecode(data); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestSchemaCheckCatchesBreakage: the strict decoding must be able to say no.
func TestSchemaCheckCatchesBreakage(t *testing.T) {
	plugins.RegisterDefaultPlugins()
	tests := []struct{ name, old, new string }{
		{"unknown panel option", `"reduceOptions": {`, `"reduceOption": {`},
		{"wrong type in a query", `"refId": "A"`, `"refId": 1`},
		{"unknown dashboard field", `"editable": true`, `"editable": true, "edittable": true`},
	}
	data, err := os.ReadFile("gpu-sharing-cluster.json")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if !bytes.Contains(data, []byte(tc.old)) {
				t.Fatalf("the dashboard no longer contains %q; update this test", tc.old)
			}
			if err := strictDecode(bytes.Replace(data, []byte(tc.old), []byte(tc.new), 1)); err == nil {
				t.Error("strict decoding accepted the broken dashboard")
			}
		})
	}
}
