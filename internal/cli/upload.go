package cli

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/tilefarm/tilefarm/internal/bundle"
	"github.com/tilefarm/tilefarm/internal/client"
)

// uploadScene sends what the farm lacks of scene b to s (client.UploadScene), drawing the
// upload's bytes and files on w as it goes (quiet: none), then one line saying what was sent
// and what the farm had already (docs/design.md, "Scenes by content").
func uploadScene(ctx context.Context, s client.SceneStore, b *bundle.Bundle, w io.Writer, quiet bool) (client.UploadReport, error) {
	var p client.UploadProgress
	bar := newProgress(w, quiet)
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(200 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				if total := p.BytesTotal.Load(); total > 0 {
					bar.show(p.Bytes.Load(), total, uploadLine(&p))
				}
			}
		}
	}()
	rep, err := client.UploadScene(ctx, s, b, 0, &p)
	close(done)
	<-stopped
	if err != nil {
		return rep, err
	}
	if p.BytesTotal.Load() > 0 {
		bar.show(p.Bytes.Load(), p.BytesTotal.Load(), uploadLine(&p))
		bar.done()
	}
	fmt.Fprintf(w, "%s: %s\n", b.Name, uploadSummary(rep))
	return rep, nil
}

// uploadLine is the upload's progress: bytes and files sent of what the farm lacked.
func uploadLine(p *client.UploadProgress) string {
	return fmt.Sprintf("uploading %s of %s, %d/%d files", humanBytes(p.Bytes.Load()), humanBytes(p.BytesTotal.Load()), p.Files.Load(), p.FilesTotal.Load())
}

// uploadSummary says what an upload sent and what the farm already had.
func uploadSummary(r client.UploadReport) string {
	shared := ""
	if r.SharedFiles > 0 {
		shared = fmt.Sprintf(", %d on the share", r.SharedFiles)
	}
	if !r.ManifestSent {
		return fmt.Sprintf("the farm has this scene already (%d files, %s%s): nothing sent", r.Files, humanBytes(r.Bytes), shared)
	}
	return fmt.Sprintf("sent %d of %d files (%s of %s%s) and the manifest; the farm had the rest", r.SentFiles, r.Files, humanBytes(r.SentBytes), humanBytes(r.Bytes), shared)
}

// humanBytes writes n in B, KiB, MiB, GiB or TiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit && exp < 3; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGT"[exp])
}
