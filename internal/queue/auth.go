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
	// Every TILES consumer is a pool's, made for workers: they list them to find their pools.
	p = append(p, "$JS.API.CONSUMER.LIST."+StreamTiles, "$JS.API.CONSUMER.INFO."+StreamTiles+".*", "$JS.API.CONSUMER.MSG.NEXT."+StreamTiles+".*")
	p = append(p, "$JS.ACK."+StreamTiles+".>")
	for _, b := range []string{BucketLeases, BucketFailures, BucketWorkers, BucketDropped} {
		p = append(p, "$JS.API.DIRECT.GET.KV_"+b+".>", "$JS.API.STREAM.MSG.GET.KV_"+b)
	}
	// Workers write their leases, failure counts and heartbeats; the dropped frames they only read.
	for _, b := range []string{BucketLeases, BucketFailures, BucketWorkers} {
		p = append(p, "$KV."+b+".>")
	}
	p = append(p, EventsTilePrefix+">", EventFrameAssembledSubject, EventFrameFailedSubject, dlqSubjects, ProgressSubject)
	return p
}

// WorkerSubscribe is everything a worker identity may subscribe to: replies to its own
// requests and deliveries of its pulls.
func WorkerSubscribe() []string { return []string{"_INBOX.>"} }

// Event subjects the permissions name; they must agree with wire.Event.Subject.
const (
	EventsTilePrefix           = "events.tile."
	EventFrameAssembledSubject = "events.frame.assembled"
	EventFrameFailedSubject    = "events.frame.failed"
)

// AccountConfig is the nats-server configuration of a farm's account with two nkey users: the
// coordinator, who may do anything in the account, and workers, limited to WorkerPublish and
// WorkerSubscribe. The embedded server uses it; an external cluster adds it to its
// configuration (docs/reliability.md).
func AccountConfig(coordinatorNkey, workerNkey string) string {
	quote := func(ss []string) string {
		q := make([]string, len(ss))
		for i, s := range ss {
			q[i] = fmt.Sprintf("%q", s)
		}
		return strings.Join(q, ", ")
	}
	return fmt.Sprintf(`accounts {
  %s {
    jetstream: enabled
    users: [
      { nkey: %q }
      { nkey: %q, permissions: {
          publish: { allow: [%s] }
          subscribe: { allow: [%s] }
      } }
    ]
  }
}
`, Account, coordinatorNkey, workerNkey, quote(WorkerPublish()), quote(WorkerSubscribe()))
}
