// Package bench holds benchmarks of whole programs (run by `make bench`),
// as opposed to the per-package Go benchmarks beside the code.
package bench
