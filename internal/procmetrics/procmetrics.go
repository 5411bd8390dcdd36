// Package procmetrics serves the process_* metrics every Prometheus exporter
// has (CPU, memory, file descriptors, start time, network bytes), under the
// names and help of client_golang's process collector, reading per scrape
// only what changes.
//
// client_golang's collector reads the process's start time at every scrape,
// and to turn it into seconds since the epoch it reads and parses the whole
// of /proc/stat for the boot time: on a 16-CPU VM that was 0.14 ms of a
// gpuslice-exporter scrape (make test-gpu's CPU profile on an H200), more
// than the rest of the process metrics together. The start time never
// changes, nor do the limits once the Go runtime has raised the open-file
// limit at start, so they are read once, here.
package procmetrics

import (
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/procfs"
)

type collector struct {
	proc procfs.Proc
	// Read once: the start time and the limits.
	start, maxFDs, maxVsize float64

	cpu, openFDs, maxFDsDesc, vsize, maxVsizeDesc, rss, startDesc, in, out *prometheus.Desc
}

// New returns the collector of this process's metrics; where /proc cannot
// give them at start, client_golang's own collector.
func New() prometheus.Collector {
	p, err := procfs.NewProc(os.Getpid())
	if err != nil {
		return collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})
	}
	stat, err := p.Stat()
	if err != nil {
		return collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})
	}
	start, err := stat.StartTime()
	if err != nil {
		return collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})
	}
	limits, err := p.Limits()
	if err != nil {
		return collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})
	}
	d := func(name, help string) *prometheus.Desc { return prometheus.NewDesc(name, help, nil, nil) }
	return &collector{
		proc: p, start: start, maxFDs: float64(limits.OpenFiles), maxVsize: float64(limits.AddressSpace),
		cpu:          d("process_cpu_seconds_total", "Total user and system CPU time spent in seconds."),
		openFDs:      d("process_open_fds", "Number of open file descriptors."),
		maxFDsDesc:   d("process_max_fds", "Maximum number of open file descriptors."),
		vsize:        d("process_virtual_memory_bytes", "Virtual memory size in bytes."),
		maxVsizeDesc: d("process_virtual_memory_max_bytes", "Maximum amount of virtual memory available in bytes."),
		rss:          d("process_resident_memory_bytes", "Resident memory size in bytes."),
		startDesc:    d("process_start_time_seconds", "Start time of the process since unix epoch in seconds."),
		in:           d("process_network_receive_bytes_total", "Number of bytes received by the process over the network."),
		out:          d("process_network_transmit_bytes_total", "Number of bytes sent by the process over the network."),
	}
}

func (c *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.cpu, c.openFDs, c.maxFDsDesc, c.vsize, c.maxVsizeDesc, c.rss, c.startDesc, c.in, c.out} {
		ch <- d
	}
}

// Collect sends what it can read; a reading that fails is left out, as
// client_golang's collector leaves it out without ReportErrors.
func (c *collector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(c.startDesc, prometheus.GaugeValue, c.start)
	ch <- prometheus.MustNewConstMetric(c.maxFDsDesc, prometheus.GaugeValue, c.maxFDs)
	ch <- prometheus.MustNewConstMetric(c.maxVsizeDesc, prometheus.GaugeValue, c.maxVsize)
	if stat, err := c.proc.Stat(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.cpu, prometheus.CounterValue, stat.CPUTime())
		ch <- prometheus.MustNewConstMetric(c.vsize, prometheus.GaugeValue, float64(stat.VirtualMemory()))
		ch <- prometheus.MustNewConstMetric(c.rss, prometheus.GaugeValue, float64(stat.ResidentMemory()))
	}
	if fds, err := c.proc.FileDescriptorsLen(); err == nil {
		ch <- prometheus.MustNewConstMetric(c.openFDs, prometheus.GaugeValue, float64(fds))
	}
	if netstat, err := c.proc.Netstat(); err == nil {
		var in, out float64
		if netstat.InOctets != nil {
			in = *netstat.InOctets
		}
		if netstat.OutOctets != nil {
			out = *netstat.OutOctets
		}
		ch <- prometheus.MustNewConstMetric(c.in, prometheus.CounterValue, in)
		ch <- prometheus.MustNewConstMetric(c.out, prometheus.CounterValue, out)
	}
}
