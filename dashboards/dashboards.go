package dashboards

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/grafana/grafana-foundation-sdk/go/cog"
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/prometheus"
)

// File is one generated dashboard and the name of the JSON file it is kept in.
type File struct {
	Name  string
	Build func() (dashboard.Dashboard, error)
}

// Files lists every dashboard this package generates.
func Files() []File {
	return []File{
		{Name: "gpu-sharing-cluster.json", Build: Cluster},
		{Name: "gpu-sharing-node.json", Build: Node},
	}
}

// Render returns a dashboard as the JSON kept in the repository: indented, with
// a final newline, the same bytes for the same dashboard.
func Render(d dashboard.Dashboard) ([]byte, error) {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	// PromQL's comparison operators would otherwise read as \u003e.
	enc.SetEscapeHTML(false)
	if err := enc.Encode(d); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// WriteAll builds every dashboard and writes its JSON file into dir.
func WriteAll(dir string) error {
	var errs []error
	for _, f := range Files() {
		d, err := f.Build()
		if err != nil {
			errs = append(errs, fmt.Errorf("build %s: %w", f.Name, err))
			continue
		}
		data, err := Render(d)
		if err != nil {
			errs = append(errs, fmt.Errorf("render %s: %w", f.Name, err))
			continue
		}
		if err := os.WriteFile(filepath.Join(dir, f.Name), data, 0o644); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// The uids are part of the dashboards' URLs (/d/<uid>) and of links between
// them; keep them stable.
const (
	clusterUID = "gpuslice-cluster"
	nodeUID    = "gpuslice-node"
)

var tags = []string{"gpuslice", "gpu"}

// Label selectors shared by the queries. The variables are multi-valued, so
// every matcher is a regex match.
const (
	gpuSel  = `node=~"$node", uuid=~"$gpu"`
	podSel  = gpuSel + `, namespace=~"$namespace"`
	nodeSel = `node=~"$node"`
)

// oomEvents and xidEvents count a counter's events over rng, per series.
func oomEvents(sel, rng string) string {
	return eventsOver("gpuslice_gpu_oom_events_total{"+sel+"}", rng)
}

func xidEvents(sel, rng string) string {
	return eventsOver("gpuslice_gpu_xid_errors_total{"+sel+"}", rng)
}

// eventsOver counts the events of a counter over rng. increase() needs two
// samples of a series, and the exporter creates some counters at their
// first event (an OOM of a kind it does not create at 0, an Xid outside
// the alerted ones): a series with no sample at rng's start counts its
// last value in rng (it may have ended since: a pod gone, an exporter
// rolled out), the others their increase. A rolled-out exporter is a new
// instance whose counters start again from 0 or from a first event (it
// does not count history again: internal/oom), so each series is matched
// with its own past, instance included. Not seen: a counter created again
// at the value it had, by an exporter restarted under the same instance
// (in place, or with hostNetwork) — docs/runbook.md.
func eventsOver(series, rng string) string {
	return "((last_over_time(" + series + "[" + rng + "]) unless " + series + " offset " + rng + ") or increase(" + series + "[" + rng + "]))"
}

// runbookURL is where the alerts' runbook_url annotations point too.
const runbookURL = "https://github.com/gpuslice/gpuslice/blob/main/docs/runbook.md"

// leaderOnly keeps a tuner series only from the replica holding the leader
// lease: a replica that lost the lease keeps exporting its last gauges,
// which would draw stale duplicate lines.
func leaderOnly(expr string) string {
	return expr + ` and on (job, instance) (gpuslice_tuner_leader == 1)`
}

func datasource() common.DataSourceRef {
	return common.DataSourceRef{Type: cog.ToPtr("prometheus"), Uid: cog.ToPtr("${datasource}")}
}

// target is a range query; legend is a Grafana legend template.
func target(refID, expr, legend string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().
		Datasource(datasource()).
		RefId(refID).
		Expr(expr).
		LegendFormat(legend).
		Range()
}

// instantTable is an instant query shaped as a table, one row per series.
func instantTable(refID, expr string) *prometheus.DataqueryBuilder {
	return prometheus.NewDataqueryBuilder().
		Datasource(datasource()).
		RefId(refID).
		Expr(expr).
		Format(prometheus.PromQueryFormatTable).
		Instant()
}

// variables returns the dashboard's template variables, each chained to the
// ones before it so choosing a node narrows the GPUs and namespaces offered.
// multiNode is false on the node dashboard, which shows one node at a time.
func variables(multiNode bool) []cog.Builder[dashboard.VariableModel] {
	ds := dashboard.NewDatasourceVariableBuilder("datasource").
		Label("Data source").
		Type("prometheus")
	node := queryVariable("node", "Node", `label_values(gpuslice_gpu_info, node)`, multiNode)
	gpu := queryVariable("gpu", "GPU", `label_values(gpuslice_gpu_info{node=~"$node"}, uuid)`, true)
	if !multiNode {
		// One node: show the GPU's index, which nvidia-smi and the panels'
		// legends use, instead of its UUID; the value stays the UUID. The
		// query_result line lists labels sorted by name, gpu before uuid.
		q := `query_result(gpuslice_gpu_info{node=~"$node"})`
		gpu = queryVariable("gpu", "GPU", q, true).
			Regex(`/\bgpu="(?<text>[^"]+)".*\buuid="(?<value>[^"]+)"/`)
	}
	namespace := queryVariable("namespace", "Namespace",
		`label_values(gpuslice_container_gpu_allocation{node=~"$node", uuid=~"$gpu"}, namespace)`, true)
	return []cog.Builder[dashboard.VariableModel]{ds, node, gpu, namespace}
}

func queryVariable(name, label, query string, multi bool) *dashboard.QueryVariableBuilder {
	v := dashboard.NewQueryVariableBuilder(name).
		Label(label).
		Datasource(datasource()).
		Query(dashboard.StringOrMap{String: cog.ToPtr(query)}).
		Definition(query).
		Refresh(dashboard.VariableRefreshOnTimeRangeChanged).
		Sort(dashboard.VariableSortNaturalAsc).
		Multi(multi).
		IncludeAll(multi)
	if multi {
		// ".*" rather than the list of values, so series that appear after the
		// variable was refreshed still show.
		v = v.AllValue(".*").
			Current(dashboard.VariableOption{
				Selected: cog.ToPtr(true),
				Text:     dashboard.StringOrArrayOfString{ArrayOfString: []string{"All"}},
				Value:    dashboard.StringOrArrayOfString{ArrayOfString: []string{"$__all"}},
			})
	}
	return v
}

// annotations marks CUDA OOMs and the tuner's replica changes on every
// time-series panel of a dashboard.
func annotations() []cog.Builder[dashboard.AnnotationQuery] {
	// A counter born at its first event has no earlier sample for changes()
	// to compare with; the second half catches that first event.
	oom := `changes(gpuslice_gpu_oom_events_total{` + podSel + `}[2m]) > 0` +
		` or (gpuslice_gpu_oom_events_total{` + podSel + `} > 0 unless gpuslice_gpu_oom_events_total{` + podSel + `} offset 2m)`
	tuner := `sum by (node, resource, direction) (changes(gpuslice_tuner_changes_total{` + nodeSel + `}[2m])) > 0`
	return []cog.Builder[dashboard.AnnotationQuery]{
		dashboard.NewAnnotationQueryBuilder().
			Name("CUDA OOM").
			Datasource(datasource()).
			Enable(true).
			IconColor("red").
			Expr(oom).
			Step("1m").
			TitleFormat("CUDA OOM").
			TextFormat("{{namespace}}/{{pod}} ({{container}}) on GPU {{gpu}} of {{node}}, seen in {{source}}, kind {{kind}}").
			TagKeys("node,namespace,pod"),
		dashboard.NewAnnotationQueryBuilder().
			Name("Tuner decisions").
			Datasource(datasource()).
			Enable(true).
			IconColor("blue").
			Expr(tuner).
			Step("1m").
			TitleFormat("Replicas {{direction}}").
			TextFormat("gpuslice-tuner moved {{resource}} replicas {{direction}} on {{node}}").
			TagKeys("node,resource,direction"),
	}
}

func links() []cog.Builder[dashboard.DashboardLink] {
	return []cog.Builder[dashboard.DashboardLink]{
		dashboard.NewDashboardLinkBuilder("GPU sharing").
			Type(dashboard.DashboardLinkTypeDashboards).
			Tooltip("The other gpuslice dashboards, same node and time range").
			Tags([]string{"gpuslice"}).
			AsDropdown(false).
			IncludeVars(true).
			KeepTime(true),
		dashboard.NewDashboardLinkBuilder("Alert runbook").
			Type(dashboard.DashboardLinkTypeLink).
			Url(runbookURL).
			Icon("doc").
			Tooltip("What each gpuslice alert means and what to do").
			TargetBlank(true),
	}
}

func newDashboard(uid, title, description string, multiNode bool) *dashboard.DashboardBuilder {
	return dashboard.NewDashboardBuilder(title).
		Uid(uid).
		Description(description).
		Tags(tags).
		Editable().
		Tooltip(dashboard.DashboardCursorSyncCrosshair).
		Time("now-6h", "now").
		Timezone(common.TimeZoneBrowser).
		Refresh("30s").
		Variables(variables(multiNode)).
		Annotations(annotations()).
		Links(links())
}

// assignIDs numbers the panels in layout order: Grafana needs unique ids for
// links to a panel and for repeats, and fixed ids keep the JSON stable.
func assignIDs(d *dashboard.Dashboard) {
	var id uint32
	for _, p := range d.Panels {
		switch {
		case p.Panel != nil:
			id++
			p.Panel.Id = cog.ToPtr(id)
		case p.RowPanel != nil:
			id++
			p.RowPanel.Id = id
			for i := range p.RowPanel.Panels {
				id++
				p.RowPanel.Panels[i].Id = cog.ToPtr(id)
			}
		}
	}
}

func build(b *dashboard.DashboardBuilder) (dashboard.Dashboard, error) {
	d, err := b.Build()
	if err != nil {
		return dashboard.Dashboard{}, err
	}
	assignIDs(&d)
	defaultPlacement(&d)
	return d, nil
}

// defaultPlacement removes the placement the SDK (v0.0.18) sets on every
// link and annotation, "inControlsMenu": Grafana 12.3 and later honour it
// and hide them in a menu. Without it they show above the panels.
func defaultPlacement(d *dashboard.Dashboard) {
	for i := range d.Links {
		d.Links[i].Placement = nil
	}
	for i := range d.Annotations.List {
		d.Annotations.List[i].Placement = nil
	}
}
