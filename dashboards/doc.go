// Package dashboards builds gpuslice's Grafana dashboards as code, with
// github.com/grafana/grafana-foundation-sdk/go, and writes them as the JSON
// files kept beside it (gpu-sharing-cluster.json, gpu-sharing-node.json), which
// users import and the Helm chart ships as ConfigMaps.
//
// Regenerate with `go run ./dashboards/cmd/gendashboards` (make dashboards);
// the tests fail when the committed JSON is stale or a query reads a metric
// that metricnames does not list.
package dashboards
