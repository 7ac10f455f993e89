package cli

import (
	"time"

	"github.com/spf13/pflag"

	"github.com/tilefarm/tilefarm/internal/notify"
)

// notifyFlags are serve's notification flags (docs/operations.md, "Notifications").
type notifyFlags struct {
	urls       []string
	secretFile string
	giveUp     time.Duration
	timeout    time.Duration
	allow      []string
}

func addNotifyFlags(fs *pflag.FlagSet) *notifyFlags {
	f := &notifyFlags{}
	fs.StringArrayVar(&f.urls, "notify", nil, "post every job's events (completed, failed, cancelled) to this http(s) `URL`, signed with the notification secret (repeatable)")
	fs.StringVar(&f.secretFile, "notify-secret-file", "", "`FILE` holding the secret that signs every notification (X-Tilefarm-Signature), or set "+notify.EnvSecret+"; without one, no job may have receivers")
	fs.DurationVar(&f.giveUp, "notify-give-up-after", notify.DefaultGiveUpAfter, "how long after an event its deliveries are retried (with backoff) before they are dropped with a log line")
	fs.DurationVar(&f.timeout, "notify-timeout", notify.DefaultTimeout, "how long one delivery attempt (a POST, a NATS publish) may take")
	fs.StringSliceVar(&f.allow, "notify-allow", nil, "let a job's own receivers (submit --notify) reach addresses in this `CIDR` (or address; repeatable or comma-separated), "+
		"which they may not by default: loopback (127.0.0.0/8, ::1), link-local (169.254.0.0/16, fe80::/10) with the cloud metadata service (169.254.169.254, fd00:ec2::254), "+
		"and the unspecified address (0.0.0.0, ::); checked at submit and at every connection. E.g. 127.0.0.0/8 for a test farm's receivers on this host. --notify URLs are the operator's and may reach any address")
	return f
}

// config is the notifier's configuration; serve refuses receivers without a secret to sign
// for them with, and a --notify-allow that is not CIDRs.
func (f *notifyFlags) config() (notify.Config, error) {
	if f.giveUp <= 0 || f.timeout <= 0 {
		return notify.Config{}, usagef("--notify-give-up-after and --notify-timeout must be positive")
	}
	for _, u := range f.urls {
		if err := notify.CheckURL(u); err != nil {
			return notify.Config{}, usagef("--notify: %v", err)
		}
	}
	allow, err := notify.ParseAllow(f.allow)
	if err != nil {
		return notify.Config{}, usagef("--notify-allow: %v", err)
	}
	secret, err := notify.Secret(f.secretFile)
	if err != nil {
		return notify.Config{}, err
	}
	if len(f.urls) > 0 && secret == nil {
		return notify.Config{}, usagef("refusing --notify without a secret to sign notifications with: set --notify-secret-file or %s", notify.EnvSecret)
	}
	return notify.Config{URLs: f.urls, Secret: secret, GiveUpAfter: f.giveUp, Timeout: f.timeout, Allow: allow}, nil
}
