// Package flagenv lets every command-line flag also come from the
// environment, as GPUSLICE_<FLAG> with dots and dashes turned into
// underscores (--web.listen-address → GPUSLICE_WEB_LISTEN_ADDRESS), which is
// how DaemonSets usually pass settings. A flag given on the command line wins.
package flagenv

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// Name returns the environment variable for a flag.
func Name(prefix, flagName string) string {
	r := strings.NewReplacer(".", "_", "-", "_")
	return prefix + strings.ToUpper(r.Replace(flagName))
}

// Apply sets every flag of fs that was not set on the command line from its
// environment variable, if present. Call it after fs.Parse. lookup is
// os.LookupEnv in programs.
func Apply(fs *flag.FlagSet, prefix string, lookup func(string) (string, bool)) error {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] || err != nil {
			return
		}
		env := Name(prefix, f.Name)
		if v, ok := lookup(env); ok {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("environment variable %s=%q for --%s: %w", env, v, f.Name, e)
			}
		}
	})
	return err
}
