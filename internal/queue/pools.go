package queue

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Pool is the workers that may render a job's tiles: those running its renderer build (a
// Blender job's Settings.Build) and carrying every tag it requires. Each pool has its own
// subjects and consumers, so a tile reaches only workers of its pool, without being pulled
// and handed back by the others (docs/design.md, "Dispatch"). The zero Pool, any worker, keeps
// the subjects and consumers of a farm without pools.
type Pool struct {
	Build    string   `json:"build,omitempty"`
	Requires []string `json:"requires,omitempty"` // sorted, without repeats
	// Job and Slots make the pool one job's own, holding at most Slots of its tiles at once
	// (its consumers' MaxAckPending): submit --max-slots. Its assemblies go to the pool
	// without them.
	Job   string `json:"job,omitempty"`
	Slots int    `json:"slots,omitempty"`
}

// Capabilities are what a worker can render: its renderer builds and its operator's tags.
type Capabilities struct {
	Builds []string
	Tags   []string
}

// IsDefault reports whether p is the pool of every worker.
func (p Pool) IsDefault() bool { return p.Build == "" && len(p.Requires) == 0 && p.Job == "" }

// id names a pool in subjects and consumer names: a hash of what makes it.
func (p Pool) id() string {
	if p.IsDefault() {
		return ""
	}
	h := sha256.Sum256([]byte(p.Build + "\x00" + strings.Join(p.Requires, ",") + "\x00" + p.Job + "\x00" + strconv.Itoa(p.Slots)))
	return "p" + hex.EncodeToString(h[:6])
}

// Assemblies is the pool that assembles p's frames: the same build and tags, no slot limit.
func (p Pool) Assemblies() Pool { return Pool{Build: p.Build, Requires: p.Requires} }

// Subject is where p's tiles of band b are published.
func (p Pool) Subject(b Band) string {
	if p.IsDefault() {
		return b.Subject()
	}
	return SubjectRender + "." + p.id() + "." + b.String()
}

// Consumer is p's shared durable pull consumer of band b.
func (p Pool) Consumer(b Band) string {
	if p.IsDefault() {
		return b.Consumer()
	}
	return ConsumerWorkers + "-" + p.id() + "-" + b.String()
}

// AssembleSubject is where the assemblies of p's frames are published.
func (p Pool) AssembleSubject() string {
	if a := p.Assemblies(); !a.IsDefault() {
		return SubjectAssemble + "." + a.id()
	}
	return SubjectAssemble
}

// assemblers is the consumer of AssembleSubject.
func (p Pool) assemblers() string {
	if a := p.Assemblies(); !a.IsDefault() {
		return ConsumerAssemblers + "-" + a.id()
	}
	return ConsumerAssemblers
}

// IsAssembleSubject reports whether subject carries frame assembly jobs, of any pool.
func IsAssembleSubject(subject string) bool {
	return subject == SubjectAssemble || strings.HasPrefix(subject, SubjectAssemble+".")
}

// Serves reports whether a worker with caps may render p's tiles.
func (p Pool) Serves(caps Capabilities) bool {
	if p.Build != "" && !slices.Contains(caps.Builds, p.Build) {
		return false
	}
	for _, t := range p.Requires {
		if !slices.Contains(caps.Tags, t) {
			return false
		}
	}
	return true
}

// String describes p for an operator: "any worker", "workers tagged gpu", "blender/3.4.1 ...".
func (p Pool) String() string {
	var parts []string
	if p.Build != "" {
		parts = append(parts, p.Build)
	}
	if len(p.Requires) > 0 {
		parts = append(parts, "tagged "+strings.Join(p.Requires, ","))
	}
	if len(parts) == 0 {
		parts = append(parts, "any worker")
	}
	if p.Slots > 0 {
		parts = append(parts, fmt.Sprintf("at most %d slots", p.Slots))
	}
	return strings.Join(parts, ", ")
}

// MetaPool is the consumer metadata key holding a pool's consumer's Pool (JSON): workers list
// the TILES consumers and pull from the pools they serve.
const MetaPool = "tilefarm.pool"

// consumerConfig is the configuration of every TILES consumer: explicit acks, the farm's
// ack-wait and backoff, no server-side delivery limit (a hand-back is free; the safety net
// is the workers', MetaMaxDeliver), and the farm's limits in its metadata.
func (cfg Config) consumerConfig(name, subject, what string, pool Pool, maxPending int) jetstream.ConsumerConfig {
	meta := map[string]string{MetaMaxFailures: strconv.Itoa(cfg.MaxFailures), MetaMaxDeliver: strconv.Itoa(cfg.MaxDeliver)}
	if !pool.IsDefault() {
		data, _ := json.Marshal(pool)
		meta[MetaPool] = string(data)
	}
	return jetstream.ConsumerConfig{
		Durable:       name,
		Description:   "shared pull consumer of tileworkers: " + what,
		FilterSubject: subject,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       cfg.AckWait,
		MaxDeliver:    -1,
		BackOff:       cfg.Backoff,
		MaxAckPending: maxPending,
		MaxWaiting:    maxWaiting,
		Metadata:      meta,
	}
}

// poolConsumers are the consumer configurations of pool p: one per band and its assemblers.
func (cfg Config) poolConsumers(p Pool) []jetstream.ConsumerConfig {
	slots := maxAckPending
	if p.Slots > 0 {
		slots = p.Slots
	}
	a := p.Assemblies()
	out := []jetstream.ConsumerConfig{cfg.consumerConfig(p.assemblers(), p.AssembleSubject(), "frame assembly jobs of "+a.String(), a, maxAckPending)}
	for b := range NumBands {
		out = append(out, cfg.consumerConfig(p.Consumer(b), p.Subject(b), "tile render jobs of the "+b.String()+" priority band of "+p.String(), p, slots))
	}
	return out
}

// ID names the pool: a hash of what makes it, "" for the pool of every worker.
func (p Pool) ID() string { return p.id() }

// EnsurePool creates p's consumers unless this Queue made them already (or retired them
// since); the coordinator calls it before it publishes a job's tiles, and for every unfinished
// job when it starts.
func (f *Queue) EnsurePool(ctx context.Context, p Pool) error {
	if p.IsDefault() {
		return nil
	}
	id := p.id()
	if _, ok := f.pools.Load(id); ok {
		return nil
	}
	for _, c := range f.Cfg.poolConsumers(p) {
		if _, err := ensureConsumer(ctx, f.JS, c); err != nil {
			return fmt.Errorf("pool %s: %w", p, err)
		}
	}
	f.pools.Store(id, p)
	f.poolsMade.Add(1)
	return nil
}

// TilePools lists the pools other than the default one that have tile consumers in TILES,
// each once: what RetirePool may retire.
func (f *Queue) TilePools(ctx context.Context) ([]Pool, error) {
	seen := map[string]bool{}
	var out []Pool
	lister := f.Tiles.ConsumerNames(ctx)
	for name := range lister.Name() {
		if !strings.HasPrefix(name, ConsumerWorkers+"-p") {
			continue // the default pool's bands, and every pool's assemblers
		}
		src, err := f.poolSource(ctx, name)
		if err != nil {
			if errors.Is(err, jetstream.ErrConsumerNotFound) {
				continue // deleted meanwhile
			}
			return nil, fmt.Errorf("reading consumer %s/%s: %w", StreamTiles, name, err)
		}
		if src.cons == nil || src.asm || seen[src.pool.id()] {
			continue
		}
		seen[src.pool.id()] = true
		out = append(out, src.pool)
	}
	if err := lister.Err(); err != nil {
		return nil, fmt.Errorf("listing the consumers of %s: %w", StreamTiles, err)
	}
	return out, nil
}

// ErrPoolBusy is RetirePool finding a tile of the pool held by a worker: it is retired later.
var ErrPoolBusy = errors.New("a tile of the pool is held by a worker")

// RetirePool deletes the tile consumers of pool p (its assemblers stay: a finished job's
// preview movie still goes there) and purges their subjects, so workers stop pulling it and
// nothing is left in TILES that no consumer delivers. The coordinator retires a pool only
// when no frame it still wants rendered is dispatched there (docs/design.md, "Dispatch"):
// what waits there are stale copies. A tile a worker holds (delivered, not acked) may be the
// one copy of a tile rendering when its frame moved, which a redelivery must still reach if
// the worker dies: while there is one, the pool stays (ErrPoolBusy). EnsurePool makes it anew
// when a job needs it again.
func (f *Queue) RetirePool(ctx context.Context, p Pool) error {
	if p.IsDefault() {
		return errors.New("retiring a pool: the pool of every worker stays")
	}
	for b := range NumBands {
		c, err := f.JS.Consumer(ctx, StreamTiles, p.Consumer(b))
		if errors.Is(err, jetstream.ErrConsumerNotFound) {
			continue
		} else if err != nil {
			return fmt.Errorf("retiring pool %s: %w", p, err)
		}
		if c.CachedInfo().NumAckPending > 0 {
			return fmt.Errorf("retiring pool %s: %w", p, ErrPoolBusy)
		}
	}
	f.pools.Delete(p.id())
	for b := range NumBands {
		if err := f.JS.DeleteConsumer(ctx, StreamTiles, p.Consumer(b)); err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
			return fmt.Errorf("retiring pool %s: deleting consumer %s: %w", p, p.Consumer(b), err)
		}
		if err := f.Tiles.Purge(ctx, jetstream.WithPurgeSubject(p.Subject(b))); err != nil {
			return fmt.Errorf("retiring pool %s: purging %s: %w", p, p.Subject(b), err)
		}
	}
	return nil
}

// ensureConsumer creates or updates the TILES consumer cfg. A consumer that exists keeps its
// MaxWaiting, which the server never lets change: a farm made before it was set keeps the
// server's default until its consumers are made anew.
func ensureConsumer(ctx context.Context, js jetstream.JetStream, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if c, err := js.Consumer(ctx, StreamTiles, cfg.Durable); err == nil {
		cfg.MaxWaiting = c.CachedInfo().Config.MaxWaiting
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("reading consumer %s/%s: %w", StreamTiles, cfg.Durable, err)
	}
	c, err := js.CreateOrUpdateConsumer(ctx, StreamTiles, cfg)
	if err != nil {
		return nil, fmt.Errorf("setting up consumer %s/%s: %w", StreamTiles, cfg.Durable, err)
	}
	return c, nil
}

// Sources are the consumers a worker pulls from: the default pool's and those of every pool
// it serves, found by listing the TILES consumers at most every sourcesRefresh.
type Sources struct {
	q    *Queue
	caps Capabilities

	mu        sync.Mutex
	refreshed time.Time
	made      uint64                         // Queue.poolsMade at the last listing
	tiles     [NumBands][]jetstream.Consumer // the default pool's first
	asm       []jetstream.Consumer           // the default assemblers first
	known     map[string]poolSource          // by consumer name
	pools     []string                       // the pools it pulls tiles from, described (Pool.String)
	turn      int                            // rotates the pools a band is pulled from first, so no pool starves another
	// home and homeAsm are where the worker's last tile and assembly came from: an idle pull
	// waits there, so the pool a worker is busy with delivers at once, the others within
	// bandIdle. Both start as the default pool's.
	home, homeAsm jetstream.Consumer
	// avoid are tile consumers the worker does not pull from until the time given, by name
	// (Avoid).
	avoid map[string]time.Time
}

// sourcesRefresh is how often a worker looks for new pools: a job of a new pool waits at most
// this long for its first tile to be taken (no wait for a worker sharing the coordinator's
// Queue: Queue.poolsMade).
const sourcesRefresh = 2 * time.Second

// SetCapabilities changes what the worker serves (once it knows its renderer builds); the
// next pull lists the pools afresh.
func (s *Sources) SetCapabilities(caps Capabilities) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.caps, s.refreshed = caps, time.Time{}
}

// Sources returns the consumers of the pools a worker with caps serves.
func (f *Queue) Sources(caps Capabilities) *Sources {
	s := &Sources{q: f, caps: caps, known: map[string]poolSource{}, home: f.Bands[BandNormal], homeAsm: f.Assemblers}
	for b := range NumBands {
		s.tiles[b] = []jetstream.Consumer{f.Bands[b]}
	}
	s.asm = []jetstream.Consumer{f.Assemblers}
	return s
}

// refresh lists the names of the TILES consumers when the last listing is older than
// sourcesRefresh, and reads a consumer's pool (its metadata) only the first time its name is
// seen: a names listing costs the server a fraction of listing every consumer's info, which a
// fleet of workers each asking every 2 s made a tenth of JetStream's work (docs/benchmarks.md,
// "Fleet"). A failed listing keeps the pools known so far.
func (s *Sources) refresh(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	made := s.q.poolsMade.Load()
	if time.Since(s.refreshed) < sourcesRefresh && made == s.made {
		return
	}
	s.refreshed, s.made = time.Now(), made
	var tiles [NumBands][]jetstream.Consumer
	var asm []jetstream.Consumer
	pools := []string{Pool{}.String()}
	listed := map[string]bool{}
	lister := s.q.Tiles.ConsumerNames(ctx)
	for name := range lister.Name() {
		listed[name] = true
		src, ok := s.known[name]
		if !ok {
			var err error
			if src, err = s.q.poolSource(ctx, name); err != nil {
				continue // deleted meanwhile, or not readable now: looked at again next time
			}
			s.known[name] = src
		}
		if src.cons == nil || !src.pool.Serves(s.caps) {
			continue
		}
		switch {
		case src.asm:
			asm = append(asm, src.cons)
		default:
			for b := range NumBands {
				if name == src.pool.Consumer(b) {
					tiles[b] = append(tiles[b], src.cons)
				}
			}
			if p := src.pool.String(); !slices.Contains(pools, p) {
				pools = append(pools, p)
			}
		}
	}
	if err := lister.Err(); err != nil && !errors.Is(err, context.Canceled) {
		s.q.logger().Warn("listing the farm's pools; keeping those known", "err", err)
		return
	}
	for name := range s.known {
		if !listed[name] {
			delete(s.known, name) // a retired pool's: what a worker knows does not grow with finished jobs
		}
	}
	for b := range NumBands {
		s.tiles[b] = append([]jetstream.Consumer{s.q.Bands[b]}, tiles[b]...)
	}
	s.asm = append([]jetstream.Consumer{s.q.Assemblers}, asm...)
	slices.Sort(pools[1:])
	s.pools = pools
}

// Pools describes the pools the worker pulls tiles from (Pool.String), the default pool's
// first, as its last listing found them: what its heartbeat tells the monitor.
func (s *Sources) Pools() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.pools == nil {
		return []string{Pool{}.String()}
	}
	return slices.Clone(s.pools)
}

// poolSource is a TILES consumer as a worker sees it: a pool's consumer of tiles or of
// assemblies, or (cons nil) one of no pool, the default pool's, which a worker always has.
type poolSource struct {
	cons jetstream.Consumer
	pool Pool
	asm  bool
}

// poolSource reads the consumer name once: its pool from its metadata.
func (f *Queue) poolSource(ctx context.Context, name string) (poolSource, error) {
	c, err := f.Tiles.Consumer(ctx, name)
	if err != nil {
		return poolSource{}, err
	}
	info := c.CachedInfo()
	raw, ok := info.Config.Metadata[MetaPool]
	if !ok {
		return poolSource{}, nil
	}
	var p Pool
	if err := json.Unmarshal([]byte(raw), &p); err != nil {
		return poolSource{}, nil
	}
	return poolSource{cons: c, pool: p, asm: IsAssembleSubject(info.Config.FilterSubject)}, nil
}

// consumerGone reports whether a pull failed because its consumer no longer exists: a pool
// the coordinator retired since the worker last listed them (a pull of a consumer that is not
// there has no responder).
func consumerGone(err error) bool {
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted) ||
		errors.Is(err, nats.ErrNoResponders)
}

// forget drops consumer c, a pool's, from every list and makes the next pull list the pools
// afresh; the default pool's consumers, which are never retired, stay.
func (s *Sources) forget(c jetstream.Consumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if c == s.q.Assemblers || slices.Contains(s.q.Bands[:], c) {
		s.refreshed = time.Time{}
		return
	}
	drop := func(cs []jetstream.Consumer) []jetstream.Consumer {
		return slices.DeleteFunc(slices.Clone(cs), func(x jetstream.Consumer) bool { return x == c })
	}
	for b := range NumBands {
		s.tiles[b] = drop(s.tiles[b])
	}
	s.asm = drop(s.asm)
	if s.home == c {
		s.home = s.q.Bands[BandNormal]
	}
	if s.homeAsm == c {
		s.homeAsm = s.q.Assemblers
	}
	s.refreshed = time.Time{}
}

// settle records where a pulled message came from (see home) and returns it. A pull whose
// consumer is gone returns nothing, and the consumer is forgotten.
func (s *Sources) settle(msg jetstream.Msg, err error, from jetstream.Consumer, asm bool) (jetstream.Msg, error) {
	if err != nil && consumerGone(err) {
		s.forget(from)
		return nil, nil
	}
	if msg != nil {
		s.mu.Lock()
		if asm {
			s.homeAsm = from
		} else {
			s.home = from
		}
		s.mu.Unlock()
	}
	return msg, err
}

// homes returns where idle pulls of tiles and of assemblies wait; tile is nil while the
// tile home is avoided.
func (s *Sources) homes() (tile, asm jetstream.Consumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tile = s.home
	if s.avoided(tile, time.Now()) {
		tile = nil
	}
	return tile, s.homeAsm
}

// Avoid keeps every tile pull of the worker off the consumer called name until until. A
// worker that handed back a tile of a job it blocklisted avoids the consumer past the moment
// the tile is delivered again, so the tile goes to a pull of another worker: which waiting
// pull JetStream serves first is no promise, and a worker still pulling there may be served
// the same tile every time (docs/design.md, "Failures, deliveries and the failure budget").
func (s *Sources) Avoid(name string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.avoid == nil {
		s.avoid = map[string]time.Time{}
	}
	if until.After(s.avoid[name]) {
		s.avoid[name] = until
	}
}

// avoided reports whether c is avoided at now; s.mu is held. Avoidances past are forgotten.
func (s *Sources) avoided(c jetstream.Consumer, now time.Time) bool {
	if len(s.avoid) == 0 || c == nil {
		return false
	}
	name := c.CachedInfo().Name
	until, ok := s.avoid[name]
	if ok && !now.Before(until) {
		delete(s.avoid, name)
		return false
	}
	return ok
}

// snapshot returns the consumers to pull tiles from per band, less those avoided, and the
// assemblers, pools rotated by one each call.
func (s *Sources) snapshot() (tiles [NumBands][]jetstream.Consumer, asm []jetstream.Consumer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.turn++
	now := time.Now()
	for b := range NumBands {
		for _, c := range rotate(s.tiles[b], s.turn) {
			if !s.avoided(c, now) {
				tiles[b] = append(tiles[b], c)
			}
		}
	}
	return tiles, rotate(s.asm, s.turn)
}

// rotate returns cs starting at its turn-th element (modulo its length).
func rotate(cs []jetstream.Consumer, turn int) []jetstream.Consumer {
	if len(cs) < 2 {
		return cs
	}
	i := turn % len(cs)
	return append(slices.Clone(cs[i:]), cs[:i]...)
}
