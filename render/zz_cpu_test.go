package render

import (
	"context"
	"syscall"
	"testing"
	"time"
)

func cpuNow() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func TestZZCPU(t *testing.T) {
	sp, _ := ParseScene([]byte(spheresScene()), nil)
	for _, c := range []struct{ name string; s *Scene; w, h int }{{"spheres", sp, 256, 256}, {"cornell", loadExample(t, "cornell"), 256, 256}, {"shot", loadExample(t, "shot"), 384, 216}} {
		st := c.s.Defaults()
		st.Width, st.Height, st.SPP = c.w, c.h, 1<<20
		r := Rect{st.Width/2 - 32, st.Height/2 - 32, st.Width/2 + 32, st.Height/2 + 32}
		tl, _ := NewTile(c.s, st, 1, r)
		tl.Render(context.Background(), 0, 2)
		rays0 := tl.rays
		c0 := cpuNow()
		tl.Render(context.Background(), 2, 42)
		el := cpuNow() - c0
		t.Logf("%s: %.2f Mrays/cpu-s, %.0f samples/cpu-s", c.name, float64(tl.rays-rays0)/el.Seconds()/1e6, 40*4096/el.Seconds())
	}
}
