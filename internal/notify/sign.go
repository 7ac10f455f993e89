package notify

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"strings"
)

// Headers of a webhook delivery.
const (
	// SignatureHeader carries "sha256=" and the hex HMAC-SHA256 of the body under the farm's
	// secret: a receiver computes it over the body it received and compares.
	SignatureHeader = "X-Tilefarm-Signature"
	// EventHeader and IDHeader repeat the body's type and id, for routing without parsing.
	EventHeader = "X-Tilefarm-Event"
	IDHeader    = "X-Tilefarm-Event-Id"
)

// EnvSecret is the environment variable serve reads the signing secret from when no
// --notify-secret-file is given.
const EnvSecret = "TILEFARM_NOTIFY_SECRET"

// minSecret is the shortest secret accepted: a short one could be guessed from signatures.
const minSecret = 16

// Sign is the value of SignatureHeader for body under secret.
func Sign(secret, body []byte) string {
	mac := hmac.New(sha256.New, secret)
	mac.Write(body)
	return "sha256=" + hex.EncodeToString(mac.Sum(nil))
}

// Verify reports whether header is body's signature under secret, in constant time: what a
// receiver written in Go does with each delivery.
func Verify(secret, body []byte, header string) bool {
	return hmac.Equal([]byte(header), []byte(Sign(secret, body)))
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
