package node

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// Property: profiles are never served beyond loopback without the API token: serveDebug
// refuses to start there without one, and with one every request must carry it.
func TestDebugListenBeyondLoopbackNeedsTheToken(t *testing.T) {
	if _, err := serveDebug("0.0.0.0:0", ""); err == nil || !strings.Contains(err.Error(), "TILEFARM_API_TOKEN") {
		t.Fatalf("serveDebug beyond loopback without a token = %v, want a refusal naming the token", err)
	}
	for _, c := range []struct {
		addr, token string
	}{{"127.0.0.1:0", ""}, {"127.0.0.1:0", "a-token-of-sixteen-chars"}} { // a token is required wherever it is set
		addr := freeAddr(t, c.addr)
		stop, err := serveDebug(addr, c.token)
		if err != nil {
			t.Fatalf("serveDebug(%s): %v", addr, err)
		}
		url := "http://" + addr + "/debug/pprof/"
		get := func(token string) int {
			req, _ := http.NewRequest("GET", url, nil)
			if token != "" {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			return resp.StatusCode
		}
		if c.token != "" {
			if code := get(""); code != http.StatusUnauthorized {
				t.Errorf("profiles on %s without the token: %d, want 401", addr, code)
			}
		}
		if code := get(c.token); code != http.StatusOK {
			t.Errorf("profiles on %s with the token %q: %d, want 200", addr, c.token, code)
		}
		stop()
	}
}

// freeAddr is a free port on the host of addr.
func freeAddr(t *testing.T, addr string) string {
	t.Helper()
	host := strings.Split(addr, ":")[0]
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", host+":0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}
