package cli

import (
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/tilefarm/tilefarm/internal/api"
	"github.com/tilefarm/tilefarm/internal/notify"
)

// Receivers are refused before anything starts: serve with --notify but no secret to sign with,
// or with a URL no notification can be posted to, or a --notify-allow that is not CIDRs, and
// submit with such a URL (before it reads
// or uploads the scene: the server here is unreachable, which would be exit 75). A secret
// shorter than 16 characters is not used. No message repeats a URL's credentials.
func TestNotifyFlagsAreCheckedBeforeAnythingStarts(t *testing.T) {
	t.Setenv(notify.EnvSecret, "")
	data := t.TempDir()
	short := filepath.Join(t.TempDir(), "secret")
	if err := os.WriteFile(short, []byte("tiny\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		code int
		says string
	}{
		{[]string{"serve", "--data", data, "--notify", "https://hooks.example.com/x"}, api.ExitUsage, "without a secret"},
		{[]string{"serve", "--data", data, "--notify", "ftp://ops:hunter2@example.com/x", "--notify-secret-file", short}, api.ExitUsage, "http or https"},
		{[]string{"serve", "--data", data, "--notify-secret-file", short}, api.ExitFailed, "shorter than 16"},
		{[]string{"submit", shotScene, "--frames", "1", "--notify", "hooks.example.com/x", "--server", "http://127.0.0.1:1"}, api.ExitUsage, "http or https"},
		{[]string{"serve", "--data", data, "--notify-allow", "127.0.0.0/8,localhost"}, api.ExitUsage, `--notify-allow: "localhost" is not a CIDR`},
	} {
		code, _, stderr := run(t, c.args...)
		if code != c.code || !strings.Contains(stderr, c.says) || strings.Contains(stderr, "hunter2") {
			t.Errorf("%v: exit %d, stderr %q; want %d saying %q", c.args, code, stderr, c.code, c.says)
		}
	}
	if entries, _ := os.ReadDir(data); len(entries) != 0 {
		t.Errorf("a refused serve left %d files in --data", len(entries))
	}
}

// serve --notify-allow takes CIDRs and single addresses, comma-separated and repeated, into the
// notifier's configuration, which checkNotify and the notifier's dialer both use.
func TestNotifyAllowFlagTakesCIDRs(t *testing.T) {
	fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
	f := addNotifyFlags(fs)
	if err := fs.Parse([]string{"--notify-allow", "127.0.0.0/8,::1", "--notify-allow", "169.254.169.254"}); err != nil {
		t.Fatal(err)
	}
	cfg, err := f.config()
	if err != nil {
		t.Fatal(err)
	}
	want := []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("169.254.169.254/32")}
	if !slices.Equal(cfg.Allow, want) {
		t.Fatalf("Allow = %v, want %v", cfg.Allow, want)
	}
	if !strings.Contains(fs.Lookup("notify-allow").Usage, "loopback") || !strings.Contains(fs.Lookup("notify-allow").Usage, "169.254.169.254") {
		t.Errorf("--notify-allow's help does not say what is refused by default: %s", fs.Lookup("notify-allow").Usage)
	}
}
