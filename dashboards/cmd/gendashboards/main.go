// Command gendashboards writes gpuslice's Grafana dashboards as JSON files
// (make dashboards). Run it from the repository root; -out names the folder.
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/gpuslice/gpuslice/dashboards"
)

func main() {
	out := flag.String("out", "dashboards", "folder to write the dashboard JSON files into")
	flag.Parse()
	if err := dashboards.WriteAll(*out); err != nil {
		fmt.Fprintln(os.Stderr, "gendashboards:", err)
		os.Exit(1)
	}
}
