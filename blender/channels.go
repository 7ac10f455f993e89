package blender

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// rule is how one channel of a tile combines across the passes (sample ranges) it renders in,
// so the combined tile equals one render of all its samples. Each rule was found by rendering
// a plate's halves and quarters against the whole (docs/design.md, "Blender scenes"), and each
// has a test that fails if it is replaced by a mean.
type rule uint8

const (
	// ruleMean: the pass is a mean over samples (Combined, the colour passes, Normal, UV, Mist,
	// AO, Emit, Environment, denoising data, AOVs, light groups): sums of mean × samples.
	ruleMean rule = iota
	// ruleFirst: Cycles writes the pass at the frame's first sample only (Depth, Position, object
	// and material index); later ranges hold the background's value. The range from sample 0
	// has it.
	ruleFirst
	// ruleWeighted: the pass is a ratio of sums, value = Σlight / Σweight, with the weight a
	// channel of its own (the light passes DiffDir, DiffInd, GlossDir, GlossInd, TransDir,
	// TransInd by their colour pass; Vector by the alpha of its layer on a transparent film):
	// sums of value × weight ×
	// samples, divided by the weight's sums.
	ruleWeighted
	// ruleCrypto: a Cryptomatte pass holds (id, coverage) pairs in the order Cycles first met
	// each id, except the layer's first Cryptomatte pass (Object, else Material, else Asset),
	// which Cycles alone sorts by coverage (a stable insertion sort). Ranges merge by id,
	// coverage × samples added, new ids after the ones met before; the sorted pass is sorted
	// when the tile's values are read.
	ruleCrypto
)

// channelPlan is how every channel of a tile combines: a rule per channel, the weight channel
// of each weighted one, the Cryptomatte groups, and why the tile must render in one pass (a
// pass no rule combines exactly), if it must.
type channelPlan struct {
	rules   []rule
	weight  []int // for ruleWeighted: the index of the weight channel (a mean channel)
	crypto  []cryptoGroup
	onePass []string
}

// cryptoGroup is one Cryptomatte pass of a layer (CryptoObject, CryptoMaterial, CryptoAsset):
// the channel indices of its ranks' ids and coverages, and whether Cycles sorts it by coverage.
type cryptoGroup struct {
	ids, covs []int
	sorted    bool
}

var (
	cryptoPass = regexp.MustCompile(`^(Crypto(?:Object|Material|Asset))(\d\d)$`)
	// meanPasses are the passes measured to be means over samples.
	meanPasses = map[string]bool{"Combined": true, "AO": true, "Emit": true, "Env": true, "Normal": true, "UV": true,
		"Mist": true, "DiffCol": true, "GlossCol": true, "TransCol": true, "Denoising Albedo": true,
		"Denoising Normal": true, "Denoising Depth": true}
	firstPasses = map[string]bool{"Depth": true, "IndexOB": true, "IndexMA": true, "Position": true}
	// lightPasses are the light passes Cycles divides by their colour pass.
	lightPasses = map[string]string{"DiffDir": "DiffCol", "DiffInd": "DiffCol", "GlossDir": "GlossCol", "GlossInd": "GlossCol",
		"TransDir": "TransCol", "TransInd": "TransCol"}
)

// passNames50 are the passes Blender 5.0 renamed, by their new name: 3.4 to 4.5 write the
// short names the rules above use ("DiffCol"), 5.0 the names its interface shows ("Diffuse
// Color"). The rules are the same on every line; only the names differ.
var passNames50 = map[string]string{"Ambient Occlusion": "AO", "Emission": "Emit", "Environment": "Env",
	"Diffuse Color": "DiffCol", "Diffuse Direct": "DiffDir", "Diffuse Indirect": "DiffInd",
	"Glossy Color": "GlossCol", "Glossy Direct": "GlossDir", "Glossy Indirect": "GlossInd",
	"Transmission Color": "TransCol", "Transmission Direct": "TransDir", "Transmission Indirect": "TransInd",
	"Object Index": "IndexOB", "Material Index": "IndexMA"}

// shortPass is the name the rules know a pass by (passNames50).
func shortPass(pass string) string {
	if short, ok := passNames50[pass]; ok {
		return short
	}
	return pass
}

// channelOf finds the channel of pass (a short name) in the layer, named as any line names it.
func channelOf(index map[string]int, layer, pass, ch string) (int, bool) {
	if i, ok := index[layer+"."+pass+"."+ch]; ok {
		return i, true
	}
	for long, short := range passNames50 {
		if short == pass {
			i, ok := index[layer+"."+long+"."+ch]
			return i, ok
		}
	}
	return 0, false
}

// splitChannel splits "Layer.Pass.Channel" by the view layers' names (which may hold dots).
func splitChannel(name string, layers []Layer) (layer, pass, channel string, ok bool) {
	best := -1
	for i, l := range layers {
		if strings.HasPrefix(name, l.Name+".") && (best < 0 || len(l.Name) > len(layers[best].Name)) {
			best = i
		}
	}
	if best < 0 {
		return "", "", "", false
	}
	rest := name[len(layers[best].Name)+1:]
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 || i == len(rest)-1 {
		return "", "", "", false
	}
	return layers[best].Name, rest[:i], rest[i+1:], true
}

// planChannels works out how each channel of the description's tiles combines.
func planChannels(d *Description) (*channelPlan, error) {
	n := len(d.Channels)
	p := &channelPlan{rules: make([]rule, n), weight: make([]int, n)}
	index := make(map[string]int, n)
	for i, c := range d.Channels {
		if _, dup := index[c]; dup {
			return nil, fmt.Errorf("channel %q appears twice", c)
		}
		index[c] = i
	}
	p.onePass = append(p.onePass, d.OnePass...)
	if d.ShadowCatcher {
		p.onePass = append(p.onePass, "a shadow catcher, whose passes Blender derives from hidden ones")
	}
	type groupKey struct{ layer, pass string }
	groups := map[groupKey]map[int][4]int{} // level -> r, g, b, a indices
	var order []groupKey
	unknown := map[string]bool{}
	for i, c := range d.Channels {
		layer, pass, ch, ok := splitChannel(c, d.Layers)
		if !ok {
			return nil, fmt.Errorf("channel %q names no view layer of the scene", c)
		}
		l := d.Layers[slices.IndexFunc(d.Layers, func(l Layer) bool { return l.Name == layer })]
		if !slices.Contains(l.AOVs, pass) && !isLightgroup(pass, l) {
			pass = shortPass(pass)
		}
		switch {
		case meanPasses[pass] || slices.Contains(l.AOVs, pass) || isLightgroup(pass, l):
			p.rules[i] = ruleMean
		case firstPasses[pass]:
			p.rules[i] = ruleFirst
		case pass == "DiffInd" && d.Volumes:
			// A volume's scattered light lands in DiffInd unweighted by DiffCol (measured:
			// 4-68% off when combined by the ratio): no rule known.
			unknown["DiffInd beside a volume"] = true
		case lightPasses[pass] != "":
			w, ok := channelOf(index, layer, lightPasses[pass], ch)
			if !ok {
				unknown[fmt.Sprintf("%s without %s", pass, lightPasses[pass])] = true
				continue
			}
			p.rules[i], p.weight[i] = ruleWeighted, w
		case pass == "Vector":
			w, ok := index[layer+".Combined.A"]
			switch {
			case !d.FilmTransparent || !ok:
				unknown["Vector on an opaque film"] = true
				continue
			case d.ShadowCatcher:
				unknown["Vector beside a shadow catcher"] = true
				continue
			}
			p.rules[i], p.weight[i] = ruleWeighted, w
		default:
			m := cryptoPass.FindStringSubmatch(pass)
			if m == nil {
				unknown[pass] = true
				continue
			}
			p.rules[i] = ruleCrypto
			k := groupKey{layer, m[1]}
			if groups[k] == nil {
				groups[k] = map[int][4]int{}
				order = append(order, k)
			}
			level := int(m[2][0]-'0')*10 + int(m[2][1]-'0')
			slots := groups[k][level]
			at := strings.Index("rgba", ch)
			if len(ch) != 1 || at < 0 {
				return nil, fmt.Errorf("channel %q: a Cryptomatte channel is r, g, b or a", c)
			}
			slots[at] = i + 1 // 0 is "missing"
			groups[k][level] = slots
		}
	}
	first := map[string]string{} // layer -> its first Cryptomatte pass, the one Cycles sorts
	for _, kind := range []string{"CryptoObject", "CryptoMaterial", "CryptoAsset"} {
		for _, k := range order {
			if k.pass == kind && first[k.layer] == "" {
				first[k.layer] = kind
			}
		}
	}
	for _, k := range order {
		levels := groups[k]
		g := cryptoGroup{sorted: first[k.layer] == k.pass}
		for level := 0; level < len(levels); level++ {
			slots, ok := levels[level]
			if !ok || slices.Contains(slots[:], 0) {
				return nil, fmt.Errorf("%s.%s: level %02d is missing or incomplete", k.layer, k.pass, level)
			}
			g.ids = append(g.ids, slots[0]-1, slots[2]-1)
			g.covs = append(g.covs, slots[1]-1, slots[3]-1)
		}
		if len(g.ids) > maxCryptoRanks {
			return nil, fmt.Errorf("%s.%s: %d ranks, at most %d", k.layer, k.pass, len(g.ids), maxCryptoRanks)
		}
		p.crypto = append(p.crypto, g)
	}
	for _, u := range slices.Sorted(maps.Keys(unknown)) {
		p.onePass = append(p.onePass, "the "+u+" pass")
	}
	return p, nil
}

func isLightgroup(pass string, l Layer) bool {
	lg, ok := strings.CutPrefix(pass, "Combined_")
	return ok && slices.Contains(l.Lightgroups, lg)
}

// maxCryptoRanks bounds a Cryptomatte pass's ranks (Blender's levels: at most 16).
const maxCryptoRanks = 32

// add combines one pass of samples [from, from+n) into sums: c values per pixel, the pass's
// means interleaved as the sums are. Cryptomatte groups are merged by id.
func (p *channelPlan) add(sum []float64, pass []float32, from, n int) {
	c := len(p.rules)
	fn := float64(n)
	var ids, ws [2 * maxCryptoRanks]float64
	for px := 0; px+c <= len(pass); px += c {
		s, v := sum[px:px+c], pass[px:px+c]
		for i, r := range p.rules {
			switch r {
			case ruleMean:
				s[i] += float64(v[i]) * fn
			case ruleFirst:
				if from == 0 {
					s[i] = float64(v[i])
				}
			case ruleWeighted:
				s[i] += float64(v[i]) * float64(v[p.weight[i]]) * fn
			}
		}
		for _, g := range p.crypto {
			k := len(g.ids)
			m := 0
			for j := 0; j < k && s[g.covs[j]] != 0; j++ { // what the tile has so far
				ids[m], ws[m] = s[g.ids[j]], s[g.covs[j]]
				m++
			}
		next:
			for j := 0; j < k; j++ { // the pass's pairs, added by id
				id, cov := float64(v[g.ids[j]]), float64(v[g.covs[j]])
				if cov == 0 {
					continue
				}
				for q := 0; q < m; q++ {
					if ids[q] == id {
						ws[q] += cov * fn
						continue next
					}
				}
				ids[m], ws[m] = id, cov*fn
				m++
			}
			for j := 0; j < k; j++ {
				if j < m && ws[j] != 0 {
					s[g.ids[j]], s[g.covs[j]] = ids[j], ws[j]
				} else {
					s[g.ids[j]], s[g.covs[j]] = 0, 0
				}
			}
		}
	}
}

// pixels writes the tile's values after samples [0, samples) into out.
func (p *channelPlan) pixels(sum []float64, samples int, out []float32) {
	c := len(p.rules)
	n := float64(samples)
	var ids, ws [maxCryptoRanks]float64
	for px := 0; px+c <= len(sum); px += c {
		s, o := sum[px:px+c], out[px:px+c]
		for i, r := range p.rules {
			switch r {
			case ruleMean:
				o[i] = float32(s[i] / n) // a division, so a one-pass tile is exactly Blender's floats
			case ruleFirst:
				o[i] = float32(s[i])
			case ruleWeighted:
				if w := s[p.weight[i]]; w != 0 {
					o[i] = float32(s[i] / w)
				} else {
					o[i] = 0
				}
			}
		}
		for _, g := range p.crypto {
			k := len(g.ids)
			for j := range k {
				ids[j], ws[j] = s[g.ids[j]], s[g.covs[j]]
			}
			if g.sorted { // as Cycles: a stable sort, best coverage first
				for a := 1; a < k && ws[a] != 0; a++ {
					for b := a; b > 0 && ws[b] > ws[b-1]; b-- {
						ids[b], ids[b-1] = ids[b-1], ids[b]
						ws[b], ws[b-1] = ws[b-1], ws[b]
					}
				}
			}
			for j := range k {
				o[g.ids[j]] = float32(ids[j])
				o[g.covs[j]] = float32(ws[j] / n)
			}
		}
	}
}
