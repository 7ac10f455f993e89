// Package deps pins the farm's third-party modules while the packages that use them are written.
// It is removed once every module is imported by real code.
package deps

import (
	_ "github.com/klauspost/compress/zstd"
	_ "github.com/minio/minio-go/v7"
	_ "github.com/nats-io/nats-server/v2/server"
	_ "github.com/nats-io/nats.go"
	_ "github.com/nats-io/nats.go/jetstream"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "go.etcd.io/bbolt"
	_ "golang.org/x/term"
)
