// Package web serves the coordinator's live monitor: a single page of plain HTML, CSS and
// JavaScript, embedded in the binary, that reads everything it shows from the API with the
// caller's bearer token (docs/web.md).
package web

import (
	"embed"
	"io/fs"
	"net/http"
)

//go:embed static
var static embed.FS

// contentSecurityPolicy lets the page load its own files and nothing else: no inline script,
// nothing from another origin; images only from itself, and from the blobs it makes of the
// API's PNGs; media likewise, the job's preview movie played from the blob it makes of it.
const contentSecurityPolicy = "default-src 'self'; img-src 'self' blob: data:; media-src 'self' blob:; style-src 'self'; script-src 'self'; " +
	"connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"

// Handler serves the page at / and its files under /ui/, and hands every other request to
// api. The page and its files need no token: they hold no job data, and the page asks for the
// token the API wants (keeping it in the tab's sessionStorage, sending it as a bearer token)
// before it shows any.
func Handler(api http.Handler) http.Handler {
	files, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	mux := http.NewServeMux()
	fileServer := http.StripPrefix("/ui/", http.FileServerFS(files))
	mux.Handle("GET /ui/", secured(fileServer))
	mux.Handle("GET /{$}", secured(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.ServeFileFS(w, r, files, "index.html")
	})))
	mux.Handle("/", api)
	return mux
}

// secured adds the headers every file of the page is served with.
func secured(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
		w.Header().Set("X-Content-Type-Options", "nosniff")
		w.Header().Set("Referrer-Policy", "no-referrer")
		w.Header().Set("Cache-Control", "no-cache")
		h.ServeHTTP(w, r)
	})
}
