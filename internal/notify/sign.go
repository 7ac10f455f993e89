package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// Headers of a webhook delivery.
const (
	// SignatureHeader carries "sha256=" and the hex HMAC-SHA256, under the farm's secret, of
	// the string "<timestamp>.<body>": the TimestampHeader's value, a dot and the body as
	// sent. A receiver computes it over what it received and compares.
	SignatureHeader = "X-Tilefarm-Signature"
	// TimestampHeader carries the unix seconds of the attempt, decimal: signed with the body,
	// so a receiver can refuse a delivery recorded and replayed later (Verify).
	TimestampHeader = "X-Tilefarm-Timestamp"
	// EventHeader and IDHeader repeat the body's type and id, for routing without parsing.
	EventHeader = "X-Tilefarm-Event"
	IDHeader    = "X-Tilefarm-Event-Id"
)

// DefaultTolerance is how far from a receiver's clock Verify takes a delivery's timestamp to
// be: a retry is signed afresh at each attempt, so only a replay or a skewed clock is older.
const DefaultTolerance = 5 * time.Minute

// Errors of Verify: a signature that is not the body's under the secret, and a valid one
// whose timestamp is too far from the receiver's clock (a replay, or a clock that is off).
var (
	ErrBadSignature   = errors.New("bad notification signature")
	ErrStaleTimestamp = errors.New("stale notification timestamp")
)

// EnvSecret is the environment variable serve reads the signing secret from when no
// --notify-secret-file is given.
const EnvSecret = "TILEFARM_NOTIFY_SECRET"

// minSecret is the shortest secret accepted: a short one could be guessed from signatures.
const minSecret = 16

// Timestamp is the value of TimestampHeader for an attempt made at t: its unix seconds.
func Timestamp(t time.Time) string { return strconv.FormatInt(t.Unix(), 10) }

// Sign is the value of SignatureHeader for body sent with the TimestampHeader timestamp, under
// secret: the HMAC-SHA256 of "<timestamp>.<body>", so neither can be changed without the other.
func Sign(secret []byte, timestamp string, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write([]byte(timestamp))
	mac.Write([]byte{'.'})
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify is what a receiver written in Go does with each delivery: it checks, in constant
// time, that signature (SignatureHeader) is Sign of body and timestamp (TimestampHeader) under
// secret, else ErrBadSignature, and then that the timestamp is within tolerance of now, either
// way, else ErrStaleTimestamp: a delivery captured and sent again later is refused. A
// tolerance of 0 or less is DefaultTolerance. Both errors are wrapped with what was wrong.
func Verify(secret, body []byte, timestamp, signature string, now time.Time, tolerance time.Duration) error {
	if timestamp == "" {
		return fmt.Errorf("%w: no %s", ErrBadSignature, TimestampHeader)
	}
	if !hmac.Equal([]byte(signature), []byte(Sign(secret, timestamp, body))) {
		return fmt.Errorf("%w: not the HMAC-SHA256 of the timestamp and body under the secret", ErrBadSignature)
	}
	sec, err := strconv.ParseInt(timestamp, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: timestamp %q is not unix seconds", ErrBadSignature, timestamp)
	}
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	if d := now.Sub(time.Unix(sec, 0)); d > tolerance || d < -tolerance {
		return fmt.Errorf("%w: signed at %s, %v from now, more than %v", ErrStaleTimestamp, time.Unix(sec, 0).UTC().Format(time.RFC3339), d.Round(time.Second), tolerance)
	}
	return nil
}

// Secret reads the signing secret from file, else from EnvSecret; empty when neither is set.
// Surrounding white space is not part of it.
func Secret(file string) ([]byte, error) {
	raw := os.Getenv(EnvSecret)
	from := EnvSecret
	if file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("reading the notification secret: %w", err)
		}
		raw, from = string(data), file
	}
	s := strings.TrimSpace(raw)
	if s == "" && file == "" {
		return nil, nil
	}
	if len(s) < minSecret {
		return nil, fmt.Errorf("the notification secret in %s is shorter than %d characters", from, minSecret)
	}
	return []byte(s), nil
}
