package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
)

// errSize is wrapped by the error of a PutStream whose reader ended before, or ran past, the
// size it was given: a caller's mistake, not worth retrying.
var errSize = errors.New("stream size mismatch")

// sizedReader passes on exactly size bytes of r, and is how both stores read a PutStream: it
// turns every way an upload's source can go wrong (an error, an early EOF, bytes past size, a
// cancelled ctx) into a Read error before the store can commit the object. The Read that
// hands over the last byte first checks that r is drained, so an error r gives only at EOF (a
// hash verified at the end) fails that very Read: a consumer that stops once it has size bytes
// (minio-go fills a buffer of exactly the part's size and never reads again) still sees it.
//
// A failure comes with no bytes (0, err) and sticks: io.ReadFull-like loops, minio-go's among
// them, drop an error that arrives with the bytes that fill their buffer.
type sizedReader struct {
	ctx  context.Context
	r    io.Reader
	size int64 // the bytes promised
	n    int64 // the bytes read from r so far
	err  error // sticky: the failure, or io.EOF once size bytes were read and r was drained
}

func newSizedReader(ctx context.Context, r io.Reader, size int64) *sizedReader {
	return &sizedReader{ctx: ctx, r: r, size: size}
}

func (s *sizedReader) Read(p []byte) (int, error) {
	if s.err != nil {
		return 0, s.err
	}
	if err := s.ctx.Err(); err != nil {
		return 0, s.fail(err)
	}
	rem := s.size - s.n
	if rem == 0 { // only for size 0: otherwise the Read of the last byte drained r
		if err := s.drain(); err != nil {
			return 0, s.fail(err)
		}
		return 0, s.err
	}
	if len(p) == 0 {
		return 0, nil
	}
	if int64(len(p)) > rem {
		p = p[:rem]
	}
	n, err := s.r.Read(p)
	s.n += int64(n)
	switch {
	case err != nil && err != io.EOF:
		return 0, s.fail(fmt.Errorf("reading the upload: %w", err))
	case s.n < s.size && err == io.EOF:
		return 0, s.fail(fmt.Errorf("%w: the reader ended after %d of %d bytes", errSize, s.n, s.size))
	case s.n < s.size:
		return n, nil
	}
	if err != io.EOF { // r said nothing of its end yet: ask it
		if err := s.drain(); err != nil {
			return 0, s.fail(err)
		}
	}
	// A cancel that came while r was read still stops the upload: this is its last chance.
	if err := s.ctx.Err(); err != nil {
		return 0, s.fail(err)
	}
	s.err = io.EOF
	return n, nil
}

// drain checks, size bytes in, that r ends there cleanly, and marks the stream done if so.
func (s *sizedReader) drain() error {
	var b [1]byte
	for range 100 { // a reader may return (0, nil) a few times; io.ReadFull's tolerance
		n, err := s.r.Read(b[:])
		switch {
		case n > 0:
			return fmt.Errorf("%w: the reader holds more than %d bytes", errSize, s.size)
		case err == io.EOF:
			s.err = io.EOF
			return nil
		case err != nil:
			return fmt.Errorf("reading the upload: %w", err)
		}
	}
	return fmt.Errorf("reading the upload: %w", io.ErrNoProgress)
}

func (s *sizedReader) fail(err error) error {
	s.err = err
	return err
}

// ctxReader is an open object on the filesystem whose reads fail once ctx is done, as an S3
// download's do, so a caller cancels a long read the same way on either store.
type ctxReader struct {
	ctx context.Context
	io.ReadCloser
}

func (r *ctxReader) Read(p []byte) (int, error) {
	if err := r.ctx.Err(); err != nil {
		return 0, err
	}
	return r.ReadCloser.Read(p)
}
