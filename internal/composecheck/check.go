package composecheck

import (
	"cmp"
	"fmt"
	"maps"
	"net"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
)

// problems collects what a check finds.
type problems []error

func (p *problems) add(format string, args ...any) { *p = append(*p, fmt.Errorf(format, args...)) }

// Check checks the compose file cf, read with env, against the Dockerfile df of the
// repository at root: every service the farm needs is there, built from the stage that
// provides its program, as a non-root user; every file a command line reads is on a volume
// written by a step it waits for; volumes are declared; the NATS image is the server go.mod
// pins. It returns every problem found; one that leaves nothing more to read (a service
// missing, a command line it cannot take apart) ends the list.
func Check(root string, cf *File, df *Dockerfile, env map[string]string) []error {
	var p problems
	for _, want := range []string{"credentials", "nats", "minio", "coordinator", "tileworker"} {
		if cf.Services[want] == nil {
			p.add("no %s service", want)
		}
	}
	if len(p) > 0 {
		return p
	}
	names := slices.Sorted(maps.Keys(cf.Services))
	var farm []string
	for _, name := range names {
		s := cf.Services[name]
		exe, args, err := Executable(name, s)
		if err != nil {
			return append(p, err)
		}
		if slices.Contains(TilefarmBinaries, exe) {
			farm = append(farm, name)
		}
		// Built here: the target stage must provide the program and run as a non-root user.
		if s.Build != nil {
			if ctx := filepath.Clean(filepath.Join(root, s.Build.Context)); ctx != root {
				p.add("service %s builds from %s, not the repository root", name, ctx)
			}
			if s.Build.Dockerfile != "" && s.Build.Dockerfile != "Dockerfile" {
				p.add("service %s builds from %s, not the Dockerfile", name, s.Build.Dockerfile)
			}
			st := df.ByName[s.Build.Target]
			if st == nil {
				p.add("service %s builds target %q, which the Dockerfile does not have", name, s.Build.Target)
				continue
			}
			from, src, ok := st.Provides("/usr/local/bin/" + exe)
			if !ok {
				p.add("service %s runs %s, but stage %s puts no /usr/local/bin/%s", name, exe, st.Name, exe)
			} else if builder := df.ByName[from]; builder == nil {
				p.add("stage %s copies %s from %q, which is no stage of the Dockerfile", st.Name, exe, from)
			} else if path.Base(src) != exe {
				p.add("stage %s installs %s as %s", st.Name, src, exe)
			} else if want := buildsWhat(exe); !slices.ContainsFunc(builder.AllRuns(), func(r string) bool { return strings.Contains(r, want) }) {
				p.add("stage %s, which %s is copied from, does not build %s", builder.Name, exe, want)
			}
			if u := st.EffectiveUser(); !regexp.MustCompile(`^[1-9][0-9]*(:[0-9]+)?$`).MatchString(u) {
				p.add("stage %s runs as user %q, not a numeric non-root UID", st.Name, u)
			}
			needsShell := len(s.Entrypoint) > 0 || (s.Healthcheck != nil && slices.Contains([]string{"bash", "sh", "/bin/sh"}, healthProgram(s)))
			if needsShell && !st.HasShell() {
				p.add("service %s needs a shell, but stage %s is based on %s", name, st.Name, st.RootImage())
			}
			if name == "tileworker" {
				wantBlender := env["TILEWORKER_TARGET"] == "tileworker-blender"
				hasBlender := slices.ContainsFunc(st.AllRuns(), func(r string) bool { return strings.Contains(r, "blender") })
				if st.Name != cmp.Or(env["TILEWORKER_TARGET"], "tilefarm") || hasBlender != wantBlender {
					p.add("with %v the workers build stage %s (Blender installed: %v)", env, st.Name, hasBlender)
				}
			}
		} else if slices.Contains(TilefarmBinaries, exe) {
			p.add("service %s runs %s from image %q, not built from the Dockerfile", name, exe, s.Image)
		}

		for _, m := range s.Volumes {
			switch m.Type {
			case "volume":
				if m.Source == "" {
					continue
				}
				if _, ok := cf.Volumes[m.Source]; !ok {
					p.add("service %s mounts volume %s, which is not declared", name, m.Source)
				}
			case "bind":
				if _, err := os.Stat(filepath.Join(root, m.Source)); err != nil {
					p.add("service %s mounts %s: %v", name, m.Source, err)
				}
			}
		}
		for _, sec := range s.Secrets {
			if _, ok := cf.Secrets[sec]; !ok {
				p.add("service %s uses secret %s, which is not declared", name, sec)
			}
		}
		// Every file a command line reads is on a volume another service writes, and that
		// service has finished before this one starts.
		for _, flag := range InputFlags {
			fp, ok := FlagValue(args, flag)
			if !ok {
				continue
			}
			m, ok := MountFor(s, fp)
			switch {
			case !ok:
				p.add("service %s: --%s %s is on no volume or secret", name, flag, fp)
			case m.Type == "volume" && m.Source != "":
				writer := writerOf(cf, m.Source, name)
				if writer == "" {
					p.add("service %s: --%s %s is on volume %s, which no other service writes", name, flag, fp, m.Source)
				} else if c := s.DependsOn[writer].Condition; c != "service_completed_successfully" {
					p.add("service %s reads %s from %s's volume %s but does not wait for it to complete (depends_on condition %q)", name, fp, writer, m.Source, c)
				}
			case m.Type == "volume":
				p.add("service %s: --%s %s is on an anonymous volume, which nothing fills", name, flag, fp)
			}
		}
		// A service it connects to is up (healthy) before it starts, directly or through
		// what it waits for.
		for _, a := range args {
			for _, raw := range strings.Split(a, ",") {
				u, err := url.Parse(raw)
				if err != nil || !strings.Contains(raw, "://") || cf.Services[u.Hostname()] == nil {
					continue
				}
				if !waitsHealthy(cf, name, u.Hostname(), map[string]bool{}) {
					p.add("service %s connects to %s but does not wait for it to be healthy", name, u.Hostname())
				}
			}
		}
		for dep, d := range s.DependsOn {
			ds := cf.Services[dep]
			switch {
			case ds == nil:
				p.add("service %s depends on %s, which does not exist", name, dep)
			case d.Condition == "service_healthy" && ds.Healthcheck == nil:
				p.add("service %s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
		if oneShot(cf, name) {
			if s.Restart != "no" {
				p.add("one-shot service %s has restart %q, want \"no\"", name, s.Restart)
			}
		} else {
			if !slices.Contains([]string{"always", "unless-stopped", "on-failure"}, s.Restart) {
				p.add("service %s has restart %q: a farm process must come back", name, s.Restart)
			}
			if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD" {
				p.add("service %s has no healthcheck in exec form ([CMD, ...])", name)
			}
		}
	}
	if !slices.Equal(farm, []string{"coordinator", "credentials", "tileworker"}) {
		p.add("services running the tilefarm binaries: %v, want coordinator, credentials, tileworker", farm)
	}
	for v := range cf.Volumes {
		if !slices.ContainsFunc(names, func(n string) bool {
			return slices.ContainsFunc(cf.Services[n].Volumes, func(m Mount) bool { return m.Source == v })
		}) {
			p.add("volume %s is declared but no service mounts it", v)
		}
	}

	coord, worker, minio := cf.Services["coordinator"], cf.Services["tileworker"], cf.Services["minio"]
	// The coordinator's database must outlive its container.
	if data, ok := FlagValue(coord.Command, "data"); !ok {
		p.add("coordinator serve has no --data")
	} else if m, ok := MountFor(coord, data); !ok || m.Type != "volume" || m.Source == "" || m.ReadOnly {
		p.add("coordinator --data %s is not on a writable named volume (%+v)", data, m)
	}
	// Workers scale: no fixed name, no published port, two by default.
	if r := worker.Deploy.Replicas; r == nil || *r != 2 {
		p.add("tileworker deploy.replicas is not 2")
	}
	if worker.ContainerName != "" || len(worker.Ports) > 0 {
		p.add("tileworker has container_name %q and ports %v: it could not be scaled", worker.ContainerName, worker.Ports)
	}
	// Both farm processes talk to the same NATS and store, with MinIO's own keys.
	for _, flag := range []string{"nats", "store"} {
		a, _ := FlagValue(coord.Command, flag)
		b, _ := FlagValue(worker.Command, flag)
		if a == "" || a != b {
			p.add("--%s: coordinator %q, tileworker %q", flag, a, b)
		}
	}
	for _, s := range []*Service{coord, worker} {
		if s.Environment["AWS_ACCESS_KEY_ID"] == "" || s.Environment["AWS_ACCESS_KEY_ID"] != minio.Environment["MINIO_ROOT_USER"] ||
			s.Environment["AWS_SECRET_ACCESS_KEY"] == "" || s.Environment["AWS_SECRET_ACCESS_KEY"] != minio.Environment["MINIO_ROOT_PASSWORD"] {
			p.add("S3 keys %v do not match MinIO's root user", s.Environment)
		}
	}
	// The NATS image is the server version go.mod pins, the one the tests build and run.
	nv, err := GoModVersion(root, "github.com/nats-io/nats-server/v2")
	if err != nil {
		return append(p, err)
	}
	nv = strings.TrimPrefix(nv, "v")
	if img := cf.Services["nats"].Image; img != "nats:"+nv+"-alpine" {
		p.add("nats image %q, want nats:%s-alpine (go.mod's nats-server)", img, nv)
	}
	return p
}

// buildsWhat is what the stage a binary is copied from must build.
func buildsWhat(exe string) string {
	if slices.Contains(TilefarmBinaries, exe) {
		return "./cmd/" + exe
	}
	return "github.com/" + exe + "/" + exe + "@"
}

func healthProgram(s *Service) string {
	if len(s.Healthcheck.Test) < 2 {
		return ""
	}
	return s.Healthcheck.Test[1]
}

// writerOf is a service other than reader that mounts volume read-write.
func writerOf(cf *File, volume, reader string) string {
	for name, s := range cf.Services {
		if name == reader {
			continue
		}
		for _, m := range s.Volumes {
			if m.Source == volume && !m.ReadOnly {
				return name
			}
		}
	}
	return ""
}

// waitsHealthy reports whether from waits for target to be healthy, directly or through
// services it waits for.
func waitsHealthy(cf *File, from, target string, seen map[string]bool) bool {
	if seen[from] {
		return false
	}
	seen[from] = true
	for dep, d := range cf.Services[from].DependsOn {
		if d.Condition == "service_healthy" && (dep == target || waitsHealthy(cf, dep, target, seen)) {
			return true
		}
	}
	return false
}

// oneShot reports whether some service waits for name to complete.
func oneShot(cf *File, name string) bool {
	for _, s := range cf.Services {
		if s.DependsOn[name].Condition == "service_completed_successfully" {
			return true
		}
	}
	return false
}

// CheckDockerfile checks the Dockerfile df of the repository at root: a plain build makes the
// image without Blender, working in /data; the Blender stage installs test.sh's Blender; the
// MinIO build is test.sh's MinIO; the farm's binaries are built static, trimmed and on the Go
// release the project uses; and no secret is baked into an image. A problem that leaves
// nothing more to read ends the list.
func CheckDockerfile(root string, df *Dockerfile) []error {
	var p problems
	last := df.Stages[len(df.Stages)-1]
	if last.Name != "tilefarm" {
		p.add("the last stage (what a plain docker build makes) is %q, want tilefarm", last.Name)
	}
	for _, r := range last.AllRuns() {
		if strings.Contains(r, "blender") {
			p.add("the default image installs Blender: %s", r)
		}
	}
	if last.EffectiveWorkdir() != "/data" {
		p.add("WORKDIR of the default image is %q, want /data", last.EffectiveWorkdir())
	}
	bl := df.ByName["tileworker-blender"]
	if bl == nil {
		return append(p, fmt.Errorf("no tileworker-blender stage"))
	}
	pkg, err := Pinned(root, "BLENDER_PACKAGE")
	if err != nil {
		return append(p, err)
	}
	if !slices.ContainsFunc(bl.AllRuns(), func(r string) bool { return strings.Contains(r, "apt-get install") && strings.Contains(r, pkg) }) {
		p.add("stage tileworker-blender does not apt-get install %s, test.sh's Blender", pkg)
	}
	if _, _, ok := bl.Provides("/usr/local/bin/tileworker"); !ok {
		p.add("stage tileworker-blender has no tileworker")
	}
	mv, err := Pinned(root, "MINIO_VERSION")
	if err != nil {
		return append(p, err)
	}
	if st := df.ByName["minio-build"]; st == nil || st.Args["MINIO_VERSION"] != mv {
		p.add("the MinIO build is not test.sh's MinIO %s", mv)
	}
	for _, name := range []string{"tilefarm", "tileworker-blender"} {
		from, _, _ := df.ByName[name].Provides("/usr/local/bin/coordinator")
		b := df.ByName[from]
		if b == nil {
			p.add("stage %s has no coordinator", name)
			continue
		}
		runs := strings.Join(b.AllRuns(), "\n")
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "--mount=type=cache,target=/go/pkg/mod"} {
			if !strings.Contains(runs, want) {
				p.add("stage %s builds without %s", b.Name, want)
			}
		}
		if !strings.HasPrefix(b.RootImage(), "golang:") || df.Args["GO_VERSION"] != "1.26" {
			p.add("stage %s builds on %s with GO_VERSION %q, want golang:1.26", b.Name, b.RootImage(), df.Args["GO_VERSION"])
		}
	}
	secretish := regexp.MustCompile(`(?i)token|secret|password|passwd|creds|aws_|nats_user|nats_pass`)
	for _, st := range df.Stages {
		for _, e := range st.Envs {
			if secretish.MatchString(e) {
				p.add("stage %s sets %s in the image", st.Name, e)
			}
		}
		for a := range st.Args {
			if secretish.MatchString(a) {
				p.add("stage %s takes build argument %s: a secret would stay in the image history", st.Name, a)
			}
		}
		for f := range st.Files {
			if secretish.MatchString(f) {
				p.add("stage %s copies %s into the image", st.Name, f)
			}
		}
	}
	return p
}

// Pinned reads NAME=VALUE (or NAME="VALUE") from the repository's test.sh: what the test
// command installs.
func Pinned(root, name string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "test.sh"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^` + name + `="?([^"\s]+)"?$`).FindSubmatch(data)
	if m == nil {
		return "", fmt.Errorf("test.sh sets no %s", name)
	}
	return string(m[1]), nil
}

// GoModVersion is the version of module the repository's go.mod requires.
func GoModVersion(root, module string) (string, error) {
	data, err := os.ReadFile(filepath.Join(root, "go.mod"))
	if err != nil {
		return "", err
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(module) + `\s+(v\S+)`).FindSubmatch(data)
	if m == nil {
		return "", fmt.Errorf("go.mod does not require %s", module)
	}
	return string(m[1]), nil
}

var natsConfAddr = regexp.MustCompile(`(?m)^(listen|http):\s*(\S+)\s*$`)

// NATSConfPorts reads the client and monitoring ports of the repository's
// deploy/nats/nats.conf.
func NATSConfPorts(root string) (client, monitor string, err error) {
	data, err := os.ReadFile(filepath.Join(root, "deploy/nats/nats.conf"))
	if err != nil {
		return "", "", err
	}
	for _, m := range natsConfAddr.FindAllStringSubmatch(string(data), -1) {
		_, port, err := net.SplitHostPort(m[2])
		if err != nil {
			return "", "", fmt.Errorf("nats.conf %s: %w", m[1], err)
		}
		if m[1] == "listen" {
			client = port
		} else {
			monitor = port
		}
	}
	if client == "" || monitor == "" {
		return "", "", fmt.Errorf("nats.conf must set listen and http (client %q, monitoring %q)", client, monitor)
	}
	return client, monitor, nil
}
