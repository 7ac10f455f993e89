package web

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// The page and its files are served without the API; every other path is the API's.
func TestWebHandlerRoutes(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-From", "api")
		w.WriteHeader(http.StatusUnauthorized)
	})
	srv := httptest.NewServer(Handler(api))
	defer srv.Close()
	for _, c := range []struct {
		path, want, ctype string
		code              int
		fromAPI           bool
	}{
		{path: "/", code: 200, want: `<script src="/ui/app.js"`, ctype: "text/html"},
		{path: "/ui/app.js", code: 200, want: "sessionStorage", ctype: "text/javascript"},
		{path: "/ui/style.css", code: 200, want: "[hidden]", ctype: "text/css"},
		{path: "/ui/nope.js", code: 404},
		{path: "/v1/jobs", code: 401, fromAPI: true},
		{path: "/v1/events", code: 401, fromAPI: true},
		{path: "/healthz", code: 401, fromAPI: true},
		{path: "/metrics", code: 401, fromAPI: true},
		{path: "/favicon.ico", code: 401, fromAPI: true},
	} {
		resp, err := http.Get(srv.URL + c.path)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != c.code || (resp.Header.Get("X-From") == "api") != c.fromAPI {
			t.Errorf("GET %s = %d (from the API: %v), want %d (from the API: %v)", c.path, resp.StatusCode, resp.Header.Get("X-From") == "api", c.code, c.fromAPI)
			continue
		}
		if c.want != "" && !strings.Contains(string(body), c.want) {
			t.Errorf("GET %s: body does not hold %q", c.path, c.want)
		}
		if c.ctype != "" {
			if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, c.ctype) {
				t.Errorf("GET %s: Content-Type %q, want %s", c.path, ct, c.ctype)
			}
			if csp := resp.Header.Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
				t.Errorf("GET %s: Content-Security-Policy %q", c.path, csp)
			}
		}
	}
}

// The page holds no inline script and loads nothing from another origin, as its policy
// requires.
func TestWebPageIsSelfContained(t *testing.T) {
	for _, name := range []string{"static/index.html", "static/app.js", "static/style.css"} {
		b, err := static.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		s := string(b)
		for _, bad := range []string{"http://", "https://", "<script>", "EventSource(", "?token", "&token"} {
			if strings.Contains(s, bad) {
				t.Errorf("%s holds %q", name, bad)
			}
		}
	}
}
