package coordinator

import (
	"fmt"
	"testing"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/queue"
)

// Property: a job is given up only when every live worker of its pool has blocklisted it.
func TestEveryoneBlocklisted(t *testing.T) {
	w := func(name string, tags []string, jobs ...string) api.Worker {
		return api.Worker{Name: name, Tags: tags, Blocklisted: jobs}
	}
	gpu := []string{"gpu"}
	pools := map[string]queue.Pool{"j1": {}, "j2": {}, "jg": {Requires: gpu}}
	poolOf := func(job string) (queue.Pool, bool) { p, ok := pools[job]; return p, ok }
	for _, c := range []struct {
		ws   []api.Worker
		want string
	}{
		{nil, "[]"},
		{[]api.Worker{w("a", nil, "j1")}, "[{j1 [a]}]"},
		{[]api.Worker{w("a", nil, "j1", "j2"), w("b", nil, "j2")}, "[{j2 [a b]}]"},
		{[]api.Worker{w("a", nil, "j1"), w("b", nil)}, "[]"},
		// Only the gpu worker renders jg: its blocklist is the pool's.
		{[]api.Worker{w("a", gpu, "jg"), w("b", nil)}, "[{jg [a]}]"},
		{[]api.Worker{w("a", gpu, "jg"), w("b", gpu)}, "[]"},
		// A job no longer known is left alone.
		{[]api.Worker{w("a", nil, "gone")}, "[]"},
	} {
		got := everyoneBlocklisted(c.ws, poolOf)
		if s := fmt.Sprint(got); s != c.want {
			t.Errorf("everyoneBlocklisted(%v) = %v, want %v", c.ws, s, c.want)
		}
	}
}
