// Package flagenv lets every command-line flag also come from the
// environment, as GPUSLICE_<FLAG> with dots and dashes turned into
// underscores (--web.listen-address → GPUSLICE_WEB_LISTEN_ADDRESS), which is
// how DaemonSets usually pass settings. A flag given on the command line wins.
// It also holds the checks the programs share on their flags' values.
package flagenv

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"
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

// NonNegative checks the named duration and integer flags of fs, once
// parsed and applied, naming the first whose value is negative: for these
// programs 0 means a flag's default, and a negative value is an error, not
// a default in disguise.
func NonNegative(fs *flag.FlagSet, names ...string) error {
	for _, n := range names {
		f := fs.Lookup(n)
		if f == nil {
			return fmt.Errorf("flagenv: no flag --%s", n)
		}
		var negative bool
		switch v := f.Value.(flag.Getter).Get().(type) {
		case time.Duration:
			negative = v < 0
		case int:
			negative = v < 0
		case int64:
			negative = v < 0
		default:
			return fmt.Errorf("flagenv: --%s is a %T, not a duration or an integer", n, v)
		}
		if negative {
			return fmt.Errorf("--%s=%s: must not be negative (0: the default)", n, f.Value)
		}
	}
	return nil
}
