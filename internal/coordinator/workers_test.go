package coordinator

import (
	"testing"

	"github.com/tilefarm/tilefarm/internal/api"
)

// Property: a job is given up only when every live worker has blocklisted it.
func TestEveryoneBlocklisted(t *testing.T) {
	w := func(name string, jobs ...string) api.Worker {
		return api.Worker{Name: name, Blocklisted: jobs}
	}
	for _, c := range []struct {
		ws   []api.Worker
		want []string
	}{
		{nil, nil},
		{[]api.Worker{w("a", "j1")}, []string{"j1"}},
		{[]api.Worker{w("a", "j1", "j2"), w("b", "j2")}, []string{"j2"}},
		{[]api.Worker{w("a", "j1"), w("b")}, nil},
	} {
		got := everyoneBlocklisted(c.ws)
		if len(got) != len(c.want) || (len(got) > 0 && got[0] != c.want[0]) {
			t.Errorf("everyoneBlocklisted(%v) = %v, want %v", c.ws, got, c.want)
		}
	}
}
