package content

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

func TestVerifyingReader(t *testing.T) {
	data := pattern(10000, 3)
	ref := refOf(data)
	other := pattern(10000, 4)
	tests := []struct {
		name    string
		content []byte
		want    Ref
		wrap    func(io.Reader) io.Reader
		ok      bool
	}{
		{"match", data, ref, nil, true},
		{"match one byte at a time", data, ref, iotest.OneByteReader, true},
		{"match with data and EOF together", data, ref, iotest.DataErrReader, true},
		{"match empty", nil, refOf(nil), nil, true},
		{"other digest", other, ref, nil, false},
		{"short", data[:len(data)-1], ref, nil, false},
		{"empty for content", nil, ref, nil, false},
		{"long", append(append([]byte{}, data...), 'x'), ref, nil, false},
		{"long one byte at a time", append(append([]byte{}, data...), 'x'), ref, iotest.OneByteReader, false},
		{"negative size", data, Ref{SHA256: ref.SHA256, Size: -1}, nil, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var r io.Reader = bytes.NewReader(tt.content)
			if tt.wrap != nil {
				r = tt.wrap(r)
			}
			v := VerifyingReader(r, tt.want)
			if tt.ok {
				// TestReader checks the reader ends with io.EOF itself, read in every way.
				if err := iotest.TestReader(v, tt.content); err != nil {
					t.Fatal(err)
				}
				return
			}
			got, err := io.ReadAll(v)
			if !errors.Is(err, ErrMismatch) {
				t.Fatalf("ReadAll = %d bytes, %v; want ErrMismatch", len(got), err)
			}
			if int64(len(got)) > max(tt.want.Size, 0) {
				t.Errorf("delivered %d bytes past the expected %d", len(got), tt.want.Size)
			}
			if _, err2 := v.Read(make([]byte, 10)); !errors.Is(err2, ErrMismatch) {
				t.Errorf("Read after the mismatch = %v, want ErrMismatch again", err2)
			}
		})
	}
}

// endless is a reader that never ends.
type endless struct{ n int64 }

func (e *endless) Read(p []byte) (int, error) {
	for i := range p {
		p[i] = 'z'
	}
	e.n += int64(len(p))
	return len(p), nil
}

// TestVerifyingReaderLongFailsAtOnce checks content longer than expected is refused as soon as
// it passes the size, not read to its end.
func TestVerifyingReaderLongFailsAtOnce(t *testing.T) {
	src := &endless{}
	want := Ref{SHA256: refOf([]byte("x")).SHA256, Size: 5000}
	_, err := io.Copy(io.Discard, VerifyingReader(src, want))
	if !errors.Is(err, ErrMismatch) {
		t.Fatalf("copy of an endless stream = %v, want ErrMismatch", err)
	}
	if src.n > want.Size+1 {
		t.Errorf("read %d bytes of the source, want at most %d", src.n, want.Size+1)
	}
}
