package queue

import (
	"fmt"
	"strings"
)

// Account is the NATS account a farm's identities share; JetStream is enabled for it.
const Account = "TILEFARM"

// WorkerPublish is everything a worker identity may publish: the JetStream API requests a
// worker makes (read stream, consumer and bucket info; pull from the two shared consumers;
// direct reads of its buckets; list and pull from the TILES consumers of every pool), acks of its deliveries, its writes to the leases and failures
// buckets, its own events, its dead letters and progress reports. Nothing else: it cannot create, edit, purge or
// delete streams, consumers or buckets, enqueue tile jobs, or publish the coordinator's
// frame.completed. docs/reliability.md lists what is refused.
func WorkerPublish() []string {
	var p []string
	p = append(p, "$JS.API.INFO")
	for _, s := range []string{StreamTiles, StreamEvents, StreamDLQ, "KV_" + BucketLeases, "KV_" + BucketFailures,
		"KV_" + BucketDropped, "KV_" + BucketWorkers} {
		p = append(p, "$JS.API.STREAM.INFO."+s)
	}
	// Every TILES consumer is a pool's, made for workers: they list their names to find their pools.
	p = append(p, "$JS.API.CONSUMER.NAMES."+StreamTiles, "$JS.API.CONSUMER.INFO."+StreamTiles+".*", "$JS.API.CONSUMER.MSG.NEXT."+StreamTiles+".*")
	p = append(p, "$JS.ACK."+StreamTiles+".>")
	for _, b := range []string{BucketLeases, BucketFailures, BucketWorkers, BucketDropped} {
		p = append(p, "$JS.API.DIRECT.GET.KV_"+b+".>", "$JS.API.STREAM.MSG.GET.KV_"+b)
	}
	// Workers write their leases, failure counts and heartbeats; the dropped frames they only read.
	for _, b := range []string{BucketLeases, BucketFailures, BucketWorkers} {
		p = append(p, "$KV."+b+".>")
	}
	p = append(p, EventsTilePrefix+">", EventFrameAssembledSubject, EventFrameFailedSubject, EventsMoviePrefix+">", dlqSubjects, ProgressSubject)
	return p
}

// WorkerInboxPrefix is the inbox prefix of the worker identity whose nkey public key is pub:
// its connection takes it (nats.CustomInboxPrefix) and its credential may subscribe under it
// alone, so no worker reads another's replies and deliveries, nor the coordinator's, which
// keep nats' default _INBOX. A worker finds it from its own seed; nothing else names it.
func WorkerInboxPrefix(pub string) string { return "_INBOX_W." + pub }

// WorkerSubscribe is everything the worker identity pub may subscribe to: its own inbox, where
// the replies to its requests and the deliveries of its pulls arrive.
func WorkerSubscribe(pub string) []string { return []string{WorkerInboxPrefix(pub) + ".>"} }

// Event subjects the permissions name; they must agree with wire.Event.Subject.
const (
	EventsTilePrefix           = "events.tile."
	EventFrameAssembledSubject = "events.frame.assembled"
	EventFrameFailedSubject    = "events.frame.failed"
	EventsMoviePrefix          = "events.movie."
)

// AccountConfig is the nats-server configuration of a farm's account with its nkey users: the
// coordinator, who may do anything in the account, and one user per worker identity, limited
// to WorkerPublish and its own WorkerSubscribe. The embedded server uses it; an external
// cluster adds it to its configuration (docs/reliability.md).
func AccountConfig(coordinatorNkey string, workerNkeys ...string) string {
	quote := func(ss []string) string {
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = fmt.Sprintf("%q", s)
		}
		return strings.Join(q, ", ")
	}
	var users strings.Builder
	fmt.Fprintf(&users, "      { nkey: %q }\n", coordinatorNkey)
	publish := quote(WorkerPublish())
	for _, w := range workerNkeys {
		fmt.Fprintf(&users, `      { nkey: %q, permissions: {
          publish: { allow: [%s] }
          subscribe: { allow: [%s] }
      } }
`, w, publish, quote(WorkerSubscribe(w)))
	}
	return fmt.Sprintf(`accounts {
  %s {
    jetstream: enabled
    users: [
%s    ]
  }
}
`, Account, users.String())
}
