package simnode

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
)

// uid derives a stable pod UID from a name, so golden files do not change
// from run to run.
func uid(seed string) string {
	h := sha256.Sum256([]byte("uid/" + seed))
	x := hex.EncodeToString(h[:16])
	return fmt.Sprintf("%s-%s-%s-%s-%s", x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}

// containerID derives a stable 64-hex container ID.
func containerID(seed string) string {
	h := sha256.Sum256([]byte("cid/" + seed))
	return hex.EncodeToString(h[:])
}

// GPUUUID returns a stable GPU UUID for GPU i of a node.
func GPUUUID(node string, i int) string {
	h := sha256.Sum256([]byte(fmt.Sprintf("gpu/%s/%d", node, i)))
	x := hex.EncodeToString(h[:16])
	return fmt.Sprintf("GPU-%s-%s-%s-%s-%s", x[0:8], x[8:12], x[12:16], x[16:20], x[20:32])
}
