// Command etcd is the etcd server, built from the version that the pinned
// Kubernetes release was tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
