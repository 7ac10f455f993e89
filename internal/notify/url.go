package notify

import (
	"errors"
	"fmt"
	"net/url"
)

// Limits of a job's receivers.
const (
	MaxURLs   = 8
	maxURLLen = 2048
)

// CheckURL checks that raw is a receiver a notification can be posted to: an absolute http or
// https URL with a host. Its error names the URL redacted.
func CheckURL(raw string) error {
	if len(raw) > maxURLLen {
		return fmt.Errorf("notification URL of %d bytes: at most %d", len(raw), maxURLLen)
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL whole
		}
		return fmt.Errorf("notification URL is not a URL: %w", err)
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return fmt.Errorf("notification URL %s: want an http or https URL", Redact(raw))
	case u.Host == "":
		return fmt.Errorf("notification URL %s: no host", Redact(raw))
	}
	return nil
}

// CheckURLs checks a list of receivers: each a CheckURL, at most MaxURLs.
func CheckURLs(urls []string) error {
	if len(urls) > MaxURLs {
		return fmt.Errorf("%d notification URLs: at most %d", len(urls), MaxURLs)
	}
	for _, u := range urls {
		if err := CheckURL(u); err != nil {
			return err
		}
	}
	return nil
}

// Redact is raw as logs, errors and status show it: without its user information and query,
// which often carry credentials, and without its fragment.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	if u.User != nil {
		u.User = url.User("REDACTED")
	}
	if u.RawQuery != "" {
		u.RawQuery = "REDACTED"
	}
	u.Fragment, u.RawFragment = "", ""
	return u.String()
}
