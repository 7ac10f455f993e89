package cli

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/client"
	"github.com/tilefarm/tilefarm/internal/layout"
)

// moviePath is where `outputs --movie PATH` writes the movie: PATH with the movie's extension
// added when it has none. Another extension is a usage mistake: the movie is a WebM whatever
// the file is called.
func moviePath(path string) (string, error) {
	switch ext := filepath.Ext(path); {
	case ext == "":
		return path + layout.MovieExt, nil
	case strings.EqualFold(ext, layout.MovieExt):
		return path, nil
	default:
		return "", usagef("--movie %q: the preview movie is a WebM (VP9): name it %s, or give no extension", path, layout.MovieExt)
	}
}

// writeMovie writes job st's preview movie to path (moviePath's) once it is ready. While it
// is not, the error says why, with the exit code of the contract: 3 while it is pending (the
// job renders, or a worker encodes it), 1 when it failed or there is none.
func writeMovie(ctx context.Context, c *client.Client, st api.Status, path string) error {
	switch m := st.Movie; m.State {
	case api.MovieReady:
	case api.MoviePending:
		return fmt.Errorf("%w: job %s is %s (%d/%d frames); its movie is pending: %s", api.ErrMovieNotReady, st.JobID, st.State,
			st.FramesCompleted, st.FramesTotal, m.Reason)
	case api.MovieFailed:
		return fmt.Errorf("the preview movie of job %s failed: %s", st.JobID, m.Reason)
	default:
		return fmt.Errorf("job %s has no preview movie: %s", st.JobID, m.Reason)
	}
	data, err := c.Movie(ctx, st.JobID)
	if err != nil {
		return fmt.Errorf("fetching the movie of job %s: %w", st.JobID, err)
	}
	return writeFile(path, data)
}
