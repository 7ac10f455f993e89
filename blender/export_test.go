package blender

import (
	"context"
	"slices"
)

// IdlePIDs lists the process ids of the pool's idle Blender processes, for tests that kill
// or freeze them.
func (p *Pool) IdlePIDs() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pids []int
	for _, proc := range p.idle {
		pids = append(pids, proc.cmd.Process.Pid)
	}
	return pids
}

// RenderPass renders samples [a, b) of the tile and returns every channel's mean over them
// as Blender wrote it, leaving the tile's sums alone: the raw material of the rule tests.
func (t *Tile) RenderPass(ctx context.Context, a, b int) ([]float32, error) {
	pix, _, err := t.pass(ctx, a, b)
	return pix, err
}

// Rules names the rule each channel of the scene's tiles combines by, by the channel's name
// and, where 5.0 renamed its pass, by the name 3.4 gives it too ("Beauty.DiffDir.R").
func (s *Scene) Rules() map[string]string {
	names := map[rule]string{ruleMean: "mean", ruleFirst: "first", ruleWeighted: "weighted", ruleCrypto: "crypto"}
	out := map[string]string{}
	for i, r := range s.plan(false).rules {
		c := s.Desc.Channels[i]
		out[c] = names[r]
		if layer, pass, ch, ok := splitChannel(c, s.Desc.Layers); ok {
			out[layer+"."+shortPass(pass)+"."+ch] = names[r]
		}
	}
	return out
}

// Combine combines passes (each the raw means of samples [ends[i-1], ends[i])) as a tile does,
// with the channels of rule asMean combined as means instead, and returns the tile's values.
func (s *Scene) Combine(passes [][]float32, ends []int, asMean string) []float32 {
	p := *s.plan(false)
	p.rules = slices.Clone(p.rules)
	var crypto []cryptoGroup
	rules := s.Rules()
	for i := range p.rules {
		if rules[s.Desc.Channels[i]] == asMean {
			p.rules[i] = ruleMean
		}
	}
	for _, g := range p.crypto {
		if asMean != "crypto" {
			crypto = append(crypto, g)
		}
	}
	p.crypto = crypto
	sum := make([]float64, len(passes[0]))
	from := 0
	for i, pass := range passes {
		p.add(sum, pass, from, ends[i]-from)
		from = ends[i]
	}
	out := make([]float32, len(sum))
	p.pixels(sum, from, out)
	return out
}
