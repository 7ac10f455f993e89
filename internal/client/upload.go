package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/flight"
)

// SceneStore is where a scene is uploaded to: a coordinator over HTTP (Client) or the one in
// this process (coordinator render).
type SceneStore interface {
	HasScene(ctx context.Context, version string) (bool, error)
	MissingContent(ctx context.Context, refs []api.ContentRef) ([]api.ContentRef, error)
	PutContent(ctx context.Context, ref api.ContentRef, r io.Reader) error
	PutScene(ctx context.Context, version string, manifest []byte) error
}

// UploadParallel is how many files an upload sends at once by default.
const UploadParallel = 4

// UploadProgress counts what an upload has sent, safe to read while it runs (a progress bar).
type UploadProgress struct {
	// FilesTotal and BytesTotal are what the farm lacked: set once it has answered.
	FilesTotal, BytesTotal atomic.Int64
	Files, Bytes           atomic.Int64 // sent so far
}

// UploadReport says what an upload did.
type UploadReport struct {
	Files        int   // files the scene names
	Bytes        int64 // their bytes, in all
	SharedFiles  int   // files on the studio's share, not uploaded
	SentFiles    int   // files uploaded now: the farm lacked them
	SentBytes    int64
	ManifestSent bool // false: the farm had the scene already
}

// UploadScene sends what the farm lacks of scene b: it asks which files' hashes the store
// lacks (in batches), uploads only those (parallel at a time, each streamed from b's source,
// never held whole), then the manifest. A file any earlier job sent is not sent again, so a
// resubmit after one texture changed sends that texture and the manifest. p (may be nil) counts
// progress as it goes.
func UploadScene(ctx context.Context, s SceneStore, b *bundle.Bundle, parallel int, p *UploadProgress) (UploadReport, error) {
	if p == nil {
		p = &UploadProgress{}
	}
	if parallel <= 0 {
		parallel = UploadParallel
	}
	rep := UploadReport{Files: len(b.Files)}
	version := b.Version()
	has, err := s.HasScene(ctx, version)
	if err != nil {
		return rep, err
	}
	byHash := map[string]string{} // a name of each content sent, for its error and its source
	var refs []api.ContentRef
	for _, name := range b.Names() {
		f := b.Files[name]
		rep.Bytes += f.Size
		if f.Shared != "" {
			rep.SharedFiles++
			continue
		}
		if _, dup := byHash[f.SHA256]; dup {
			continue
		}
		byHash[f.SHA256] = name
		refs = append(refs, api.ContentRef{SHA256: f.SHA256, Size: f.Size})
	}
	if has {
		return rep, nil
	}
	manifest := b.Encode()
	for try := 0; ; try++ {
		missing, err := askMissing(ctx, s, refs)
		if err != nil {
			return rep, err
		}
		for _, m := range missing {
			p.FilesTotal.Add(1)
			p.BytesTotal.Add(m.Size)
		}
		if err := uploadAll(ctx, s, b, missing, byHash, parallel, p); err != nil {
			return rep, err
		}
		rep.SentFiles, rep.SentBytes = rep.SentFiles+len(missing), p.BytesTotal.Load()
		err = s.PutScene(ctx, version, manifest)
		if try == 0 && IsContentMissing(err) {
			continue // the farm's scene gc took files it had said it had: they are sent again
		}
		if err != nil {
			return rep, fmt.Errorf("storing the scene's manifest: %w", err)
		}
		rep.ManifestSent = true
		return rep, nil
	}
}

// SubmitAfterUpload submits req once upload (UploadScene, or one drawing its progress) has
// stored its scene, uploading it once more if the farm's scene gc took the scene between the
// two (IsSceneMissing).
func (c *Client) SubmitAfterUpload(ctx context.Context, req api.SubmitRequest, upload func() error) (api.SubmitResult, error) {
	for try := 0; ; try++ {
		if err := upload(); err != nil {
			return api.SubmitResult{}, err
		}
		res, err := c.SubmitUploaded(ctx, req)
		if try == 0 && IsSceneMissing(err) {
			continue
		}
		return res, err
	}
}

// askMissing asks which of refs the farm lacks, in batches.
func askMissing(ctx context.Context, s SceneStore, refs []api.ContentRef) ([]api.ContentRef, error) {
	var missing []api.ContentRef
	for i := 0; i < len(refs); i += api.MaxContentAsked {
		m, err := s.MissingContent(ctx, refs[i:min(i+api.MaxContentAsked, len(refs))])
		if err != nil {
			return nil, fmt.Errorf("asking the farm which files it lacks: %w", err)
		}
		missing = append(missing, m...)
	}
	return missing, nil
}

// IsContentMissing reports whether a manifest was refused for naming files the farm does not
// have (Coordinator.PutScene): uploading them again stores them.
func IsContentMissing(err error) bool {
	return errors.Is(err, api.ErrBadInput) && strings.Contains(err.Error(), "files the farm does not have")
}

// uploadAll uploads missing, parallel at a time; the first failure stops the rest. A farm busy
// with other uploads (api.ErrBusy) is waited for.
func uploadAll(ctx context.Context, s SceneStore, b *bundle.Bundle, missing []api.ContentRef, byHash map[string]string, parallel int, p *UploadProgress) error {
	return flight.Each(ctx, len(missing), parallel, func(ctx context.Context, i int) error {
		name := byHash[missing[i].SHA256]
		if err := uploadOne(ctx, s, b, name, missing[i], p); err != nil {
			return fmt.Errorf("uploading %s: %w", name, err)
		}
		return nil
	})
}

// addressed is a SceneStore that sends to any of several coordinator addresses (Client).
type addressed interface{ Addresses() int }

// uploadOne streams one file, retrying while the farm is busy with other uploads, and from its
// start at each other address of the farm while the one it went to does not answer (a
// streamed body cannot be sent again by the request itself).
func uploadOne(ctx context.Context, s SceneStore, b *bundle.Bundle, name string, ref api.ContentRef, p *UploadProgress) error {
	others := 0 // addresses left to try
	if a, ok := s.(addressed); ok {
		others = a.Addresses() - 1
	}
	for {
		if err := ctx.Err(); err != nil {
			return err
		}
		r, err := b.Open(ctx, name)
		if err != nil {
			return err
		}
		cr := &countingReader{r: r, n: &p.Bytes}
		err = s.PutContent(ctx, ref, cr)
		r.Close()
		var busy *api.BusyError
		if errors.As(err, &busy) || errors.Is(err, api.ErrBusy) {
			p.Bytes.Add(-cr.read) // sent again
			wait := time.Second
			if busy != nil && busy.RetryAfter > 0 {
				wait = busy.RetryAfter
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(wait):
			}
			continue
		}
		if errors.Is(err, api.ErrUnavailable) && others > 0 && ctx.Err() == nil {
			others--
			p.Bytes.Add(-cr.read) // sent again, to the next address (Client.across made it current)
			continue
		}
		if err != nil {
			return err
		}
		p.Files.Add(1)
		return nil
	}
}

// countingReader adds what it reads to n.
type countingReader struct {
	r    io.Reader
	n    *atomic.Int64
	read int64
}

func (c *countingReader) Read(b []byte) (int, error) {
	k, err := c.r.Read(b)
	c.read += int64(k)
	c.n.Add(int64(k))
	return k, err
}

// MissingContent asks the coordinator which of refs it lacks.
func (c *Client) MissingContent(ctx context.Context, refs []api.ContentRef) ([]api.ContentRef, error) {
	var res api.MissingContentResult
	if err := c.postJSON(ctx, "/v1/content/missing", api.MissingContentRequest{Files: refs}, &res); err != nil {
		return nil, err
	}
	return res.Missing, nil
}

// PutContent uploads one file's content, streamed from r.
func (c *Client) PutContent(ctx context.Context, ref api.ContentRef, r io.Reader) error {
	return c.doStream(ctx, http.MethodPut, "/v1/content/"+ref.SHA256, api.ContentDataType, r, ref.Size, nil)
}

// PutScene uploads a scene's manifest (UploadScene sends its files first).
func (c *Client) PutScene(ctx context.Context, version string, manifest []byte) error {
	return c.doRaw(ctx, http.MethodPut, "/v1/scenes/"+version, api.ManifestType, manifest, nil)
}
