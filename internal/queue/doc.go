// Package queue wires tilefarm to NATS JetStream: an embedded server for single-machine farms and tests,
// the TILES work-queue stream with its one shared durable pull consumer, the EVENTS and DLQ streams, the
// fencing-token leases in the "leases" KV bucket, and the dead-letter path.
//
// JetStream gives the farm at-least-once delivery, a dedup window and ack-wait as a visibility timeout; it
// never gives exactly-once. Everything here is built so that a duplicate is harmless rather than impossible:
// publishes carry a Nats-Msg-Id, leases carry the KV revision as a fencing token, and a dead letter is copied
// before it is removed, never the other way round.
package queue
