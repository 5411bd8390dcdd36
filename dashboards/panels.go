package dashboards

import (
	"github.com/grafana/grafana-foundation-sdk/go/common"
	"github.com/grafana/grafana-foundation-sdk/go/dashboard"
	"github.com/grafana/grafana-foundation-sdk/go/stat"
	"github.com/grafana/grafana-foundation-sdk/go/table"
	"github.com/grafana/grafana-foundation-sdk/go/timeseries"
)

// Field overrides shared by the panels that draw a limit (a GPU's total
// memory, advertised replicas) next to what is used of it.
func limitLine(color string) []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{
		{Id: "custom.stacking", Value: map[string]any{"mode": "none", "group": "A"}},
		{Id: "custom.fillOpacity", Value: 0},
		{Id: "custom.lineWidth", Value: 2},
		{Id: "custom.lineStyle", Value: map[string]any{"fill": "dash", "dash": []int{10, 10}}},
		{Id: "color", Value: map[string]any{"mode": "fixed", "fixedColor": color}},
	}
}

func dashed() []dashboard.DynamicConfigValue {
	return []dashboard.DynamicConfigValue{
		{Id: "custom.lineStyle", Value: map[string]any{"fill": "dash", "dash": []int{10, 10}}},
	}
}

func legendTable(calcs ...string) *common.VizLegendOptionsBuilder {
	return common.NewVizLegendOptionsBuilder().
		DisplayMode(common.LegendDisplayModeTable).
		Placement(common.LegendPlacementBottom).
		ShowLegend(true).
		Calcs(calcs)
}

// timeSeries is a line chart with the settings every gpuslice chart shares.
func timeSeries(title, description, unit string, h, w uint32) *timeseries.PanelBuilder {
	return timeseries.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit(unit).
		Height(h).
		Span(w).
		FillOpacity(10).
		ShowPoints(common.VisibilityModeNever).
		Tooltip(common.NewVizTooltipOptionsBuilder().Mode(common.TooltipDisplayModeMulti).Sort(common.SortOrderDescending)).
		Legend(legendTable("lastNotNull", "max"))
}

// versus draws what is used (solid, query A) against its limit or target
// (dashed, query B).
func versus(title, description, unit string, h, w uint32, used, usedLegend, limit, limitLegend string) *timeseries.PanelBuilder {
	return timeSeries(title, description, unit, h, w).
		WithTarget(target("A", used, usedLegend)).
		WithTarget(target("B", limit, limitLegend)).
		OverrideByQuery("B", dashed())
}

// bars draws event counts per interval.
func bars(title, description string, h, w uint32) *timeseries.PanelBuilder {
	return timeSeries(title, description, "none", h, w).
		DrawStyle(common.GraphDrawStyleBars).
		FillOpacity(80).
		Decimals(0).
		Min(0).
		Stacking(common.NewStackingConfigBuilder().Mode(common.StackingModeNormal)).
		Legend(legendTable("sum"))
}

func thresholds(steps ...dashboard.Threshold) *dashboard.ThresholdsConfigBuilder {
	return dashboard.NewThresholdsConfigBuilder().
		Mode(dashboard.ThresholdsModeAbsolute).
		Steps(steps)
}

func step(value *float64, color string) dashboard.Threshold {
	return dashboard.Threshold{Value: value, Color: color}
}

func statPanel(title, description, unit, expr string) *stat.PanelBuilder {
	return stat.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Unit(unit).
		Height(4).
		Span(4).
		GraphMode(common.BigValueGraphModeArea).
		ColorMode(common.BigValueColorModeValue).
		Orientation(common.VizOrientationAuto).
		ReduceOptions(common.NewReduceDataOptionsBuilder().Calcs([]string{"lastNotNull"})).
		WithTarget(target("A", expr, ""))
}

// column is a table column: the label (or "Value") a query returns and the
// header shown for it.
type column struct{ field, header string }

// tablePanel shows an instant query as a table: the columns in the order
// given, the timestamp and the fields in hide left out.
func tablePanel(title, description string, h, w uint32, expr string, hide []string, columns []column) *table.PanelBuilder {
	excluded := map[string]bool{"Time": true}
	for _, f := range hide {
		excluded[f] = true
	}
	rename, index := map[string]string{}, map[string]int{}
	for i, c := range columns {
		rename[c.field] = c.header
		index[c.field] = i
	}
	return table.NewPanelBuilder().
		Title(title).
		Description(description).
		Datasource(datasource()).
		Height(h).
		Span(w).
		Decimals(0).
		Footer(common.NewTableFooterOptionsBuilder().Show(false).Reducer([]string{"sum"})).
		WithTarget(instantTable("A", expr)).
		WithTransformation(dashboard.DataTransformerConfig{
			Id: "organize",
			Options: map[string]any{
				"excludeByName": excluded,
				"renameByName":  rename,
				"indexByName":   index,
			},
		})
}
