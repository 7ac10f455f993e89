package queue

import "github.com/nats-io/nats.go"

// ProgressSubject carries tile progress reports on core NATS, outside every stream: progress
// is advisory (a lost report loses nothing, the next one or the tile's completion corrects
// it), so it costs the farm no storage and no acks.
const ProgressSubject = "progress.tiles"

// PublishProgress sends one progress report; it never blocks on the server.
func (f *Queue) PublishProgress(data []byte) error { return f.JS.Conn().Publish(ProgressSubject, data) }

// SubscribeProgress calls fn with every progress report until the subscription is drained.
func (f *Queue) SubscribeProgress(fn func(data []byte)) (*nats.Subscription, error) {
	return f.JS.Conn().Subscribe(ProgressSubject, func(m *nats.Msg) { fn(m.Data) })
}
