package queue

import (
	"errors"
	"testing"
	"time"
)

func TestDefaultConfigValid(t *testing.T) {
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatalf("DefaultConfig().Validate() = %v", err)
	}
}

func TestConfigValidateRejects(t *testing.T) {
	cases := map[string]func(*Config){
		"zero ack wait":       func(c *Config) { c.AckWait = 0 },
		"zero max deliver":    func(c *Config) { c.MaxDeliver = 0 },
		"backoff too long":    func(c *Config) { c.MaxDeliver = 2; c.Backoff = []time.Duration{time.Second, time.Second, time.Second} },
		"negative backoff":    func(c *Config) { c.Backoff = []time.Duration{-time.Second} },
		"zero dedup":          func(c *Config) { c.DedupWindow = 0 },
		"dedup beyond events": func(c *Config) { c.DedupWindow = 30 * 24 * time.Hour },
		"tiny lease ttl":      func(c *Config) { c.LeaseTTL = time.Millisecond },
		"zero replicas":       func(c *Config) { c.Replicas = 0 },
		"six replicas":        func(c *Config) { c.Replicas = 6 },
	}
	for name, mutate := range cases {
		t.Run(name, func(t *testing.T) {
			c := DefaultConfig()
			mutate(&c)
			if err := c.Validate(); !errors.Is(err, ErrInvalidConfig) {
				t.Fatalf("Validate() = %v, want ErrInvalidConfig", err)
			}
		})
	}
	c := DefaultConfig()
	c.MaxDeliver = 3
	c.Backoff = []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}
	if err := c.Validate(); err != nil {
		t.Fatalf("backoff of exactly MaxDeliver steps rejected: %v", err)
	}
}
