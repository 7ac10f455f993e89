package composecheck

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

func TestInterpolate(t *testing.T) {
	env := map[string]string{"SET": "value", "EMPTY": ""}
	for _, c := range []struct{ in, want, err string }{
		{in: "plain", want: "plain"},
		{in: "${SET}", want: "value"},
		{in: "a-${SET:-x}-b", want: "a-value-b"},
		{in: "${UNSET:-fallback}", want: "fallback"},
		{in: "${EMPTY:-fallback}", want: "fallback"},
		{in: "$$HOME", want: "$HOME"},
		{in: "${UNSET}", err: "has no default"},
		{in: "$HOME", err: "bare $"},
		{in: "${SET", err: "unterminated"},
		{in: "${SET:?error}", err: "unsupported"},
	} {
		got, err := Interpolate(c.in, env)
		switch {
		case c.err != "" && (err == nil || !strings.Contains(err.Error(), c.err)):
			t.Errorf("Interpolate(%q) = %q, %v; want an error saying %q", c.in, got, err, c.err)
		case c.err == "" && (err != nil || got != c.want):
			t.Errorf("Interpolate(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

func TestServiceForms(t *testing.T) {
	var s Service
	doc := `
build: .
command: [coordinator, serve, --data=/data]
environment: [A=1, B=2]
volumes:
  - data:/data
  - ./deploy/nats:/etc/nats:ro
  - /scratch
  - {type: volume, source: creds, target: /creds, read_only: true}
`
	if err := yaml.Unmarshal([]byte(doc), &s); err != nil {
		t.Fatal(err)
	}
	if s.Build == nil || s.Build.Context != "." {
		t.Errorf("build %+v, want context .", s.Build)
	}
	if v, ok := FlagValue(s.Command, "data"); !ok || v != "/data" {
		t.Errorf("--data = %q, %v", v, ok)
	}
	if s.Environment["A"] != "1" || s.Environment["B"] != "2" {
		t.Errorf("environment %v", s.Environment)
	}
	want := []Mount{{"volume", "data", "/data", false}, {"bind", "./deploy/nats", "/etc/nats", true},
		{"volume", "", "/scratch", false}, {"volume", "creds", "/creds", true}}
	if len(s.Volumes) != len(want) {
		t.Fatalf("volumes %+v, want %+v", s.Volumes, want)
	}
	for i := range want {
		if s.Volumes[i] != want[i] {
			t.Errorf("volume %d is %+v, want %+v", i, s.Volumes[i], want[i])
		}
	}
	if m, ok := MountFor(&s, "/etc/nats/nats.conf"); !ok || m.Source != "./deploy/nats" {
		t.Errorf("/etc/nats/nats.conf is on %+v (%v)", m, ok)
	}
	if err := yaml.Unmarshal([]byte("command: coordinator serve"), &s); err == nil || !strings.Contains(err.Error(), "exec form") {
		t.Errorf("a command in shell form: %v, want an error asking for the exec form", err)
	}
}

func TestParseDockerfile(t *testing.T) {
	root := t.TempDir()
	df := `ARG GO_VERSION=1.26
FROM golang:${GO_VERSION} AS build
RUN go build \
    -o /out/coordinator ./cmd/coordinator
FROM debian:12 AS tilefarm
COPY --from=build /out/coordinator /usr/local/bin/
USER 1000:1000
FROM tilefarm AS more
WORKDIR /data
`
	if err := os.WriteFile(filepath.Join(root, "Dockerfile"), []byte(df), 0o644); err != nil {
		t.Fatal(err)
	}
	d, err := ParseDockerfile(root)
	if err != nil {
		t.Fatal(err)
	}
	if d.Args["GO_VERSION"] != "1.26" || len(d.Stages) != 3 {
		t.Fatalf("args %v, %d stages", d.Args, len(d.Stages))
	}
	more := d.ByName["more"]
	from, src, ok := more.Provides("/usr/local/bin/coordinator")
	if !ok || from != "build" || src != "/out/coordinator" {
		t.Errorf("coordinator provided from %q %q (%v)", from, src, ok)
	}
	if more.EffectiveUser() != "1000:1000" || more.EffectiveWorkdir() != "/data" || more.RootImage() != "debian:12" || !more.HasShell() {
		t.Errorf("stage more: user %q, workdir %q, image %q", more.EffectiveUser(), more.EffectiveWorkdir(), more.RootImage())
	}
	if runs := d.ByName["build"].AllRuns(); len(runs) != 1 || runs[0] != "go build -o /out/coordinator ./cmd/coordinator" {
		t.Errorf("runs %q", runs)
	}
	if err := os.WriteFile(filepath.Join(root, "Dockerfile"), []byte("RUN true\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := ParseDockerfile(root); err == nil {
		t.Error("a RUN before the first FROM was read")
	}
}
