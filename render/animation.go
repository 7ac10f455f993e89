package render

import "sort"

// easing selects how values move between two keyframes.
type easing uint8

const (
	easeLinear easing = iota // constant speed between keyframes
	easeSmooth               // smoothstep: eases in and out of every keyframe
)

// key is one keyframe of a track.
type key struct {
	frame int
	v     Vec
}

// track is one animated property: keyframes sorted by frame. Outside the
// keyframed range the value is clamped to the first or last keyframe. An empty
// track holds the property's base value.
type track []key

// sortTrack sorts keys by frame and reports the first duplicate frame, if any.
func sortTrack(t track) (dup int, ok bool) {
	sort.SliceStable(t, func(i, j int) bool { return t[i].frame < t[j].frame })
	for i := 1; i < len(t); i++ {
		if t[i].frame == t[i-1].frame {
			return t[i].frame, false
		}
	}
	return 0, true
}

// eval returns the track's value at frame f, or base if the track is empty.
func (t track) eval(f int, e easing, base Vec) Vec {
	switch {
	case len(t) == 0:
		return base
	case f <= t[0].frame:
		return t[0].v
	case f >= t[len(t)-1].frame:
		return t[len(t)-1].v
	}
	i := sort.Search(len(t), func(i int) bool { return t[i].frame > f }) // t[i-1].frame <= f < t[i].frame
	a, b := t[i-1], t[i]
	u := float64(f-a.frame) / float64(b.frame-a.frame)
	if e == easeSmooth {
		u = u * u * (3 - 2*u)
	}
	return a.v.Lerp(b.v, u)
}
