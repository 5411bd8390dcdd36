// Package alerts holds gpuslice's Prometheus alerting rules
// (gpuslice-rules.yaml), their promtool unit tests (tests/), an example
// Alertmanager configuration that routes GPU OOM alerts to their own receiver,
// and the runbook the rules link to. It has no Go code to import: its tests run
// check.sh (promtool and amtool) and check that the rules only read metrics
// gpuslice exports and that every alert is documented and tested both ways.
package alerts
