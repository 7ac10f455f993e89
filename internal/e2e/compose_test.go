package e2e

import (
	"bufio"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.yaml.in/yaml/v3"

	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/natstest"
	"github.com/tilefarm/tilefarm/internal/proctest"
)

// The Docker deployment (Dockerfile, docker-compose.yml, deploy/nats/nats.conf) is checked
// without a Docker engine: the compose file is parsed as compose reads it (interpolation, merge
// keys), its command lines are given to the real binaries, the Dockerfile's stages are parsed
// for the binaries and users they provide, and the stack is started from the compose file's own
// command lines, entrypoint script, environment and healthchecks, with every container's
// filesystem a directory whose mounts are symlinks to shared volume directories.

// The binaries the tilefarm image provides; every other executable comes from another image.
var tilefarmBinaries = []string{"coordinator", "tileworker"}

// composeVariants are the environments the compose file must work in: none set, and workers
// built with Blender.
var composeVariants = []map[string]string{{}, {"TILEWORKER_TARGET": "tileworker-blender"}}

func repoPath(name string) string {
	p, _ := filepath.Abs(filepath.Join("../..", name))
	return p
}

// ---- the compose file ----

type composeFile struct {
	Services map[string]*composeService `yaml:"services"`
	Volumes  map[string]any             `yaml:"volumes"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

type composeService struct {
	Image         string         `yaml:"image"`
	Build         *composeBuild  `yaml:"build"`
	Entrypoint    argv           `yaml:"entrypoint"`
	Command       argv           `yaml:"command"`
	Environment   composeEnv     `yaml:"environment"`
	Volumes       []composeMount `yaml:"volumes"`
	Secrets       []string       `yaml:"secrets"`
	Ports         []string       `yaml:"ports"`
	ContainerName string         `yaml:"container_name"`
	DependsOn     map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test argv `yaml:"test"`
	} `yaml:"healthcheck"`
	Deploy struct {
		Replicas *int `yaml:"replicas"`
	} `yaml:"deploy"`
	Restart string `yaml:"restart"`
}

type composeBuild struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
	Target     string `yaml:"target"`
}

func (b *composeBuild) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain composeBuild
	return n.Decode((*plain)(b))
}

// argv is a command in exec (list) form: exactly the arguments the process gets.
type argv []string

func (a *argv) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.SequenceNode {
		return fmt.Errorf("line %d: write the command as a list (exec form), not %q", n.Line, n.Value)
	}
	var s []string
	if err := n.Decode(&s); err != nil {
		return err
	}
	*a = s
	return nil
}

type composeEnv map[string]string

func (e *composeEnv) UnmarshalYAML(n *yaml.Node) error {
	m := map[string]string{}
	if n.Kind == yaml.SequenceNode {
		var list []string
		if err := n.Decode(&list); err != nil {
			return err
		}
		for _, kv := range list {
			k, v, _ := strings.Cut(kv, "=")
			m[k] = v
		}
	} else if err := n.Decode(&m); err != nil {
		return err
	}
	*e = m
	return nil
}

// composeMount is a volume entry: named volume, bind mount or anonymous volume.
type composeMount struct {
	Type     string // volume, bind
	Source   string // volume name or host path; empty for an anonymous volume
	Target   string
	ReadOnly bool
}

func (m *composeMount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.MappingNode {
		var long struct {
			Type     string `yaml:"type"`
			Source   string `yaml:"source"`
			Target   string `yaml:"target"`
			ReadOnly bool   `yaml:"read_only"`
		}
		if err := n.Decode(&long); err != nil {
			return err
		}
		*m = composeMount{Type: long.Type, Source: long.Source, Target: long.Target, ReadOnly: long.ReadOnly}
		return nil
	}
	parts := strings.Split(n.Value, ":")
	switch len(parts) {
	case 1:
		*m = composeMount{Type: "volume", Target: parts[0]}
		return nil
	case 2, 3:
		*m = composeMount{Type: "volume", Source: parts[0], Target: parts[1]}
		if len(parts) == 3 {
			m.ReadOnly = slices.Contains(strings.Split(parts[2], ","), "ro")
		}
		if strings.HasPrefix(m.Source, ".") || strings.HasPrefix(m.Source, "/") || strings.HasPrefix(m.Source, "~") {
			m.Type = "bind"
		}
		return nil
	}
	return fmt.Errorf("line %d: volume %q: want SOURCE:TARGET[:MODE]", n.Line, n.Value)
}

// loadCompose reads docker-compose.yml with env as the environment, interpolating the way
// compose does: ${VAR}, ${VAR:-default}, and $$ for a literal $.
func loadCompose(t *testing.T, env map[string]string) *composeFile {
	t.Helper()
	data, err := os.ReadFile(repoPath("docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	if err := interpolateNode(&doc, env, map[*yaml.Node]bool{}); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	var cf composeFile
	if err := doc.Decode(&cf); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return &cf
}

func interpolateNode(n *yaml.Node, env map[string]string, seen map[*yaml.Node]bool) error {
	if seen[n] {
		return nil
	}
	seen[n] = true
	switch n.Kind {
	case yaml.ScalarNode:
		v, err := interpolate(n.Value, env)
		if err != nil {
			return fmt.Errorf("line %d: %w", n.Line, err)
		}
		n.Value = v
	case yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 { // values only, as compose does
			if err := interpolateNode(n.Content[i], env, seen); err != nil {
				return err
			}
		}
	case yaml.DocumentNode, yaml.SequenceNode:
		for _, c := range n.Content {
			if err := interpolateNode(c, env, seen); err != nil {
				return err
			}
		}
	}
	// An alias is interpolated where its anchor is defined.
	return nil
}

var varName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func interpolate(s string, env map[string]string) (string, error) {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] != '$' {
			b.WriteByte(s[i])
			continue
		}
		switch {
		case i+1 < len(s) && s[i+1] == '$':
			b.WriteByte('$')
			i++
		case i+1 < len(s) && s[i+1] == '{':
			end := strings.IndexByte(s[i+2:], '}')
			if end < 0 {
				return "", fmt.Errorf("unterminated ${ in %q", s)
			}
			expr := s[i+2 : i+2+end]
			name, def, hasDef := expr, "", false
			if k := strings.Index(expr, ":-"); k >= 0 {
				name, def, hasDef = expr[:k], expr[k+2:], true
			}
			if !varName.MatchString(name) {
				return "", fmt.Errorf("unsupported substitution ${%s} in %q", expr, s)
			}
			switch v := env[name]; {
			case v != "":
				b.WriteString(v)
			case hasDef:
				b.WriteString(def)
			default:
				return "", fmt.Errorf("${%s} has no default: the file must work with nothing set", name)
			}
			i += 2 + end
		default:
			return "", fmt.Errorf("a bare $ in %q: compose would substitute it; write $$ for a literal $", s)
		}
	}
	return b.String(), nil
}

// ---- the Dockerfile ----

type dockerStage struct {
	name, from string
	base       *dockerStage      // the earlier stage FROM names, if any
	files      map[string]string // path in the image -> stage it is copied from
	copied     map[string]string // path in the image -> its path in that stage
	user       string
	workdir    string
	runs       []string
	args       map[string]string
	envs       []string
}

func (s *dockerStage) provides(p string) (from, src string, ok bool) {
	for st := s; st != nil; st = st.base {
		if f, ok := st.files[p]; ok {
			return f, st.copied[p], true
		}
	}
	return "", "", false
}

func (s *dockerStage) rootImage() string {
	if s.base != nil {
		return s.base.rootImage()
	}
	return s.from
}

func (s *dockerStage) effectiveUser() string {
	for st := s; st != nil; st = st.base {
		if st.user != "" {
			return st.user
		}
	}
	return ""
}

func (s *dockerStage) effectiveWorkdir() string {
	for st := s; st != nil; st = st.base {
		if st.workdir != "" {
			return st.workdir
		}
	}
	return ""
}

func (s *dockerStage) allRuns() []string {
	if s.base == nil {
		return s.runs
	}
	return append(slices.Clone(s.base.allRuns()), s.runs...)
}

// hasShell reports whether the stage's base image has /bin/sh and bash: a Debian image.
func (s *dockerStage) hasShell() bool {
	img := s.rootImage()
	return strings.HasPrefix(img, "debian:")
}

type dockerfile struct {
	stages []*dockerStage
	byName map[string]*dockerStage
	args   map[string]string // ARGs before the first FROM
}

func parseDockerfile(t *testing.T) *dockerfile {
	t.Helper()
	f, err := os.Open(repoPath("Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	df := &dockerfile{byName: map[string]*dockerStage{}, args: map[string]string{}}
	var lines []string
	var cont strings.Builder
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		l := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(l, "#") || (l == "" && cont.Len() == 0) {
			continue
		}
		if rest, ok := strings.CutSuffix(l, `\`); ok {
			cont.WriteString(rest + " ")
			continue
		}
		cont.WriteString(l)
		lines = append(lines, cont.String())
		cont.Reset()
	}
	if cont.Len() > 0 {
		t.Fatalf("Dockerfile ends inside a continued line")
	}
	var cur *dockerStage
	for _, l := range lines {
		fields := strings.Fields(l)
		instr, rest := strings.ToUpper(fields[0]), fields[1:]
		if cur == nil && instr != "FROM" && instr != "ARG" {
			t.Fatalf("Dockerfile: %s before the first FROM", instr)
		}
		switch instr {
		case "ARG":
			k, v, _ := strings.Cut(rest[0], "=")
			if cur == nil {
				df.args[k] = v
			} else {
				cur.args[k] = v
			}
		case "FROM":
			for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
				rest = rest[1:]
			}
			st := &dockerStage{from: rest[0], files: map[string]string{}, copied: map[string]string{}, args: map[string]string{}}
			if len(rest) == 3 && strings.EqualFold(rest[1], "AS") {
				st.name = rest[2]
			} else if len(rest) != 1 {
				t.Fatalf("Dockerfile: cannot read %q", l)
			}
			st.base = df.byName[st.from]
			if st.name != "" {
				if df.byName[st.name] != nil {
					t.Fatalf("Dockerfile: two stages named %s", st.name)
				}
				df.byName[st.name] = st
			}
			df.stages = append(df.stages, st)
			cur = st
		case "COPY":
			from := ""
			for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
				if v, ok := strings.CutPrefix(rest[0], "--from="); ok {
					from = v
				}
				rest = rest[1:]
			}
			if len(rest) < 2 || strings.HasPrefix(rest[0], "[") {
				t.Fatalf("Dockerfile: cannot read %q", l)
			}
			srcs, dest := rest[:len(rest)-1], rest[len(rest)-1]
			for _, src := range srcs {
				p := dest
				if strings.HasSuffix(dest, "/") || len(srcs) > 1 {
					p = path.Join(dest, path.Base(src))
				}
				cur.files[p], cur.copied[p] = from, src
			}
		case "USER":
			cur.user = rest[0]
		case "WORKDIR":
			cur.workdir = rest[0]
		case "RUN":
			cur.runs = append(cur.runs, strings.Join(rest, " "))
		case "ENV":
			k, _, _ := strings.Cut(rest[0], "=")
			cur.envs = append(cur.envs, k)
		}
	}
	if len(df.stages) == 0 {
		t.Fatal("Dockerfile has no stage")
	}
	return df
}

// ---- what the repository pins elsewhere ----

// pinned reads NAME=VALUE (or NAME="VALUE") from test.sh.
func pinned(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(repoPath("test.sh"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + name + `="?([^"\s]+)"?$`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("test.sh sets no %s", name)
	}
	return string(m[1])
}

func goModVersion(t *testing.T, module string) string {
	t.Helper()
	data, err := os.ReadFile(repoPath("go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*` + regexp.QuoteMeta(module) + `\s+(v\S+)`).FindSubmatch(data)
	if m == nil {
		t.Fatalf("go.mod does not require %s", module)
	}
	return string(m[1])
}

// ---- reading a service ----

// executable is the program a service runs, and its arguments. An entrypoint may only be a
// shell script that runs the command ("$@"): the command is then what the program gets.
func executable(t *testing.T, name string, s *composeService) (exe string, args []string) {
	t.Helper()
	if len(s.Entrypoint) > 0 {
		if len(s.Entrypoint) != 4 || s.Entrypoint[0] != "/bin/sh" || s.Entrypoint[1] != "-c" || !strings.Contains(s.Entrypoint[2], `"$@"`) {
			t.Fatalf("service %s: an entrypoint must be [/bin/sh, -c, SCRIPT running \"$@\", NAME], got %q", name, []string(s.Entrypoint))
		}
	}
	if len(s.Command) == 0 {
		t.Fatalf("service %s has no command", name)
	}
	return s.Command[0], s.Command[1:]
}

// flagValue is the value of --name in args.
func flagValue(args []string, name string) (string, bool) {
	for i, a := range args {
		if a == "--"+name && i+1 < len(args) {
			return args[i+1], true
		}
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

// inputFlags name files a process reads and some volume or secret must provide.
var inputFlags = []string{"nats-creds", "api-token-file", "nats-ca", "nats-cert", "nats-key"}

// mountFor is the mount a container path lies on.
func mountFor(s *composeService, p string) (composeMount, bool) {
	var best composeMount
	found := false
	for _, m := range s.Volumes {
		if (p == m.Target || strings.HasPrefix(p, strings.TrimSuffix(m.Target, "/")+"/")) && len(m.Target) >= len(best.Target) {
			best, found = m, true
		}
	}
	for _, sec := range s.Secrets {
		if target := "/run/secrets/" + sec; p == target {
			return composeMount{Type: "secret", Source: sec, Target: target, ReadOnly: true}, true
		}
	}
	return best, found
}

var listenAddr = regexp.MustCompile(`^(0\.0\.0\.0)?:([0-9]+)$`)

var natsConfAddr = regexp.MustCompile(`(?m)^(listen|http):\s*(\S+)\s*$`)

// natsConfPorts reads the client and monitoring ports of deploy/nats/nats.conf.
func natsConfPorts(t *testing.T) (client, monitor string) {
	t.Helper()
	data, err := os.ReadFile(repoPath("deploy/nats/nats.conf"))
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range natsConfAddr.FindAllStringSubmatch(string(data), -1) {
		_, port, err := net.SplitHostPort(m[2])
		if err != nil {
			t.Fatalf("nats.conf %s: %v", m[1], err)
		}
		if m[1] == "listen" {
			client = port
		} else {
			monitor = port
		}
	}
	if client == "" || monitor == "" {
		t.Fatalf("nats.conf must set listen and http (client %q, monitoring %q)", client, monitor)
	}
	return client, monitor
}

// ---- static checks ----

// The compose file and the Dockerfile agree: every service the farm needs is there, built from
// the stage that provides its program, as a non-root user; every file a command line reads is
// on a volume written by a step it waits for; volumes are declared; what test.sh and go.mod pin
// is what the images run.
func TestComposeFileMatchesDockerfile(t *testing.T) {
	df := parseDockerfile(t)
	for _, env := range composeVariants {
		t.Run(fmt.Sprintf("env=%v", env), func(t *testing.T) { checkCompose(t, loadCompose(t, env), df, env) })
	}
	checkDockerfile(t, df)
}

func checkCompose(t *testing.T, cf *composeFile, df *dockerfile, env map[string]string) {
	for _, want := range []string{"credentials", "nats", "minio", "coordinator", "tileworker"} {
		if cf.Services[want] == nil {
			t.Errorf("no %s service", want)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	names := slices.Sorted(maps.Keys(cf.Services))
	var farm []string
	for _, name := range names {
		s := cf.Services[name]
		exe, args := executable(t, name, s)
		if slices.Contains(tilefarmBinaries, exe) {
			farm = append(farm, name)
		}
		// Built here: the target stage must provide the program and run as a non-root user.
		if s.Build != nil {
			if ctx := filepath.Clean(filepath.Join(repoPath("."), s.Build.Context)); ctx != repoPath(".") {
				t.Errorf("service %s builds from %s, not the repository root", name, ctx)
			}
			if s.Build.Dockerfile != "" && s.Build.Dockerfile != "Dockerfile" {
				t.Errorf("service %s builds from %s, not the Dockerfile", name, s.Build.Dockerfile)
			}
			st := df.byName[s.Build.Target]
			if st == nil {
				t.Errorf("service %s builds target %q, which the Dockerfile does not have", name, s.Build.Target)
				continue
			}
			from, src, ok := st.provides("/usr/local/bin/" + exe)
			if !ok {
				t.Errorf("service %s runs %s, but stage %s puts no /usr/local/bin/%s", name, exe, st.name, exe)
			} else if builder := df.byName[from]; builder == nil {
				t.Errorf("stage %s copies %s from %q, which is no stage of the Dockerfile", st.name, exe, from)
			} else if path.Base(src) != exe {
				t.Errorf("stage %s installs %s as %s", st.name, src, exe)
			} else if want := buildsWhat(exe); !slices.ContainsFunc(builder.allRuns(), func(r string) bool { return strings.Contains(r, want) }) {
				t.Errorf("stage %s, which %s is copied from, does not build %s", builder.name, exe, want)
			}
			if u := st.effectiveUser(); !regexp.MustCompile(`^[1-9][0-9]*(:[0-9]+)?$`).MatchString(u) {
				t.Errorf("stage %s runs as user %q, not a numeric non-root UID", st.name, u)
			}
			needsShell := len(s.Entrypoint) > 0 || (s.Healthcheck != nil && slices.Contains([]string{"bash", "sh", "/bin/sh"}, healthProgram(s)))
			if needsShell && !st.hasShell() {
				t.Errorf("service %s needs a shell, but stage %s is based on %s", name, st.name, st.rootImage())
			}
			if name == "tileworker" {
				wantBlender := env["TILEWORKER_TARGET"] == "tileworker-blender"
				hasBlender := slices.ContainsFunc(st.allRuns(), func(r string) bool { return strings.Contains(r, "blender") })
				if st.name != cmpOr(env["TILEWORKER_TARGET"], "tilefarm") || hasBlender != wantBlender {
					t.Errorf("with %v the workers build stage %s (Blender installed: %v)", env, st.name, hasBlender)
				}
			}
		} else if slices.Contains(tilefarmBinaries, exe) {
			t.Errorf("service %s runs %s from image %q, not built from the Dockerfile", name, exe, s.Image)
		}

		for _, m := range s.Volumes {
			switch m.Type {
			case "volume":
				if m.Source == "" {
					continue
				}
				if _, ok := cf.Volumes[m.Source]; !ok {
					t.Errorf("service %s mounts volume %s, which is not declared", name, m.Source)
				}
			case "bind":
				if _, err := os.Stat(filepath.Join(repoPath("."), m.Source)); err != nil {
					t.Errorf("service %s mounts %s: %v", name, m.Source, err)
				}
			}
		}
		for _, sec := range s.Secrets {
			if _, ok := cf.Secrets[sec]; !ok {
				t.Errorf("service %s uses secret %s, which is not declared", name, sec)
			}
		}
		// Every file a command line reads is on a volume another service writes, and that
		// service has finished before this one starts.
		for _, flag := range inputFlags {
			p, ok := flagValue(args, flag)
			if !ok {
				continue
			}
			m, ok := mountFor(s, p)
			switch {
			case !ok:
				t.Errorf("service %s: --%s %s is on no volume or secret", name, flag, p)
			case m.Type == "volume" && m.Source != "":
				writer := writerOf(cf, m.Source, name)
				if writer == "" {
					t.Errorf("service %s: --%s %s is on volume %s, which no other service writes", name, flag, p, m.Source)
				} else if c := s.DependsOn[writer].Condition; c != "service_completed_successfully" {
					t.Errorf("service %s reads %s from %s's volume %s but does not wait for it to complete (depends_on condition %q)", name, p, writer, m.Source, c)
				}
			case m.Type == "volume":
				t.Errorf("service %s: --%s %s is on an anonymous volume, which nothing fills", name, flag, p)
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
					t.Errorf("service %s connects to %s but does not wait for it to be healthy", name, u.Hostname())
				}
			}
		}
		for dep, d := range s.DependsOn {
			ds := cf.Services[dep]
			switch {
			case ds == nil:
				t.Errorf("service %s depends on %s, which does not exist", name, dep)
			case d.Condition == "service_healthy" && ds.Healthcheck == nil:
				t.Errorf("service %s waits for %s to be healthy, which has no healthcheck", name, dep)
			}
		}
		if oneShot(cf, name) {
			if s.Restart != "no" {
				t.Errorf("one-shot service %s has restart %q, want \"no\"", name, s.Restart)
			}
		} else {
			if !slices.Contains([]string{"always", "unless-stopped", "on-failure"}, s.Restart) {
				t.Errorf("service %s has restart %q: a farm process must come back", name, s.Restart)
			}
			if s.Healthcheck == nil || len(s.Healthcheck.Test) < 2 || s.Healthcheck.Test[0] != "CMD" {
				t.Errorf("service %s has no healthcheck in exec form ([CMD, ...])", name)
			}
		}
	}
	if !slices.Equal(farm, []string{"coordinator", "credentials", "tileworker"}) {
		t.Errorf("services running the tilefarm binaries: %v, want coordinator, credentials, tileworker", farm)
	}
	for v := range cf.Volumes {
		if !slices.ContainsFunc(names, func(n string) bool {
			return slices.ContainsFunc(cf.Services[n].Volumes, func(m composeMount) bool { return m.Source == v })
		}) {
			t.Errorf("volume %s is declared but no service mounts it", v)
		}
	}

	coord, worker, minio := cf.Services["coordinator"], cf.Services["tileworker"], cf.Services["minio"]
	// The coordinator's database must outlive its container.
	if data, ok := flagValue(coord.Command, "data"); !ok {
		t.Errorf("coordinator serve has no --data")
	} else if m, ok := mountFor(coord, data); !ok || m.Type != "volume" || m.Source == "" || m.ReadOnly {
		t.Errorf("coordinator --data %s is not on a writable named volume (%+v)", data, m)
	}
	// Workers scale: no fixed name, no published port, two by default.
	if r := worker.Deploy.Replicas; r == nil || *r != 2 {
		t.Errorf("tileworker deploy.replicas is not 2")
	}
	if worker.ContainerName != "" || len(worker.Ports) > 0 {
		t.Errorf("tileworker has container_name %q and ports %v: it could not be scaled", worker.ContainerName, worker.Ports)
	}
	// Both farm processes talk to the same NATS and store, with MinIO's own keys.
	for _, flag := range []string{"nats", "store"} {
		a, _ := flagValue(coord.Command, flag)
		b, _ := flagValue(worker.Command, flag)
		if a == "" || a != b {
			t.Errorf("--%s: coordinator %q, tileworker %q", flag, a, b)
		}
	}
	for _, s := range []*composeService{coord, worker} {
		if s.Environment["AWS_ACCESS_KEY_ID"] == "" || s.Environment["AWS_ACCESS_KEY_ID"] != minio.Environment["MINIO_ROOT_USER"] ||
			s.Environment["AWS_SECRET_ACCESS_KEY"] == "" || s.Environment["AWS_SECRET_ACCESS_KEY"] != minio.Environment["MINIO_ROOT_PASSWORD"] {
			t.Errorf("S3 keys %v do not match MinIO's root user", s.Environment)
		}
	}
	// The NATS image is the server version go.mod pins, the one the tests build and run.
	nv := strings.TrimPrefix(goModVersion(t, "github.com/nats-io/nats-server/v2"), "v")
	if img := cf.Services["nats"].Image; img != "nats:"+nv+"-alpine" {
		t.Errorf("nats image %q, want nats:%s-alpine (go.mod's nats-server)", img, nv)
	}
}

// buildsWhat is what the stage a binary is copied from must build.
func buildsWhat(exe string) string {
	if slices.Contains(tilefarmBinaries, exe) {
		return "./cmd/" + exe
	}
	return "github.com/" + exe + "/" + exe + "@"
}

func healthProgram(s *composeService) string {
	if len(s.Healthcheck.Test) < 2 {
		return ""
	}
	return s.Healthcheck.Test[1]
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// writerOf is a service other than reader that mounts volume read-write.
func writerOf(cf *composeFile, volume, reader string) string {
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
func waitsHealthy(cf *composeFile, from, target string, seen map[string]bool) bool {
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
func oneShot(cf *composeFile, name string) bool {
	for _, s := range cf.Services {
		if s.DependsOn[name].Condition == "service_completed_successfully" {
			return true
		}
	}
	return false
}

func checkDockerfile(t *testing.T, df *dockerfile) {
	last := df.stages[len(df.stages)-1]
	if last.name != "tilefarm" {
		t.Errorf("the last stage (what a plain docker build makes) is %q, want tilefarm", last.name)
	}
	for _, r := range last.allRuns() {
		if strings.Contains(r, "blender") {
			t.Errorf("the default image installs Blender: %s", r)
		}
	}
	if last.effectiveWorkdir() != "/data" {
		t.Errorf("WORKDIR of the default image is %q, want /data", last.effectiveWorkdir())
	}
	bl := df.byName["tileworker-blender"]
	if bl == nil {
		t.Fatalf("no tileworker-blender stage")
	}
	pkg := pinned(t, "BLENDER_PACKAGE")
	if !slices.ContainsFunc(bl.allRuns(), func(r string) bool { return strings.Contains(r, "apt-get install") && strings.Contains(r, pkg) }) {
		t.Errorf("stage tileworker-blender does not apt-get install %s, test.sh's Blender", pkg)
	}
	if _, _, ok := bl.provides("/usr/local/bin/tileworker"); !ok {
		t.Errorf("stage tileworker-blender has no tileworker")
	}
	mv := pinned(t, "MINIO_VERSION")
	if st := df.byName["minio-build"]; st == nil || st.args["MINIO_VERSION"] != mv {
		t.Errorf("the MinIO build is not test.sh's MinIO %s", mv)
	}
	for _, name := range []string{"tilefarm", "tileworker-blender"} {
		from, _, _ := df.byName[name].provides("/usr/local/bin/coordinator")
		b := df.byName[from]
		if b == nil {
			t.Errorf("stage %s has no coordinator", name)
			continue
		}
		runs := strings.Join(b.allRuns(), "\n")
		for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "--mount=type=cache,target=/go/pkg/mod"} {
			if !strings.Contains(runs, want) {
				t.Errorf("stage %s builds without %s", b.name, want)
			}
		}
		if !strings.HasPrefix(b.rootImage(), "golang:") || df.args["GO_VERSION"] != "1.26" {
			t.Errorf("stage %s builds on %s with GO_VERSION %q, want golang:1.26", b.name, b.rootImage(), df.args["GO_VERSION"])
		}
	}
	secretish := regexp.MustCompile(`(?i)token|secret|password|passwd|creds|aws_|nats_user|nats_pass`)
	for _, st := range df.stages {
		for _, e := range st.envs {
			if secretish.MatchString(e) {
				t.Errorf("stage %s sets %s in the image", st.name, e)
			}
		}
		for a := range st.args {
			if secretish.MatchString(a) {
				t.Errorf("stage %s takes build argument %s: a secret would stay in the image history", st.name, a)
			}
		}
		for p := range st.files {
			if secretish.MatchString(p) {
				t.Errorf("stage %s copies %s into the image", st.name, p)
			}
		}
	}
}

// ---- command lines ----

// Every tilefarm command line of the compose file is one the real binary accepts: flags are
// parsed before --help is honoured, so an unknown flag or a bad value exits 2 and a good line
// prints the usage and exits 0.
func TestComposeCommandLinesParse(t *testing.T) {
	seen := map[string]bool{}
	for _, env := range composeVariants {
		cf := loadCompose(t, env)
		for _, name := range []string{"credentials", "coordinator", "tileworker"} {
			exe, args := executable(t, name, cf.Services[name])
			if !slices.Contains(tilefarmBinaries, exe) {
				t.Fatalf("service %s runs %s, not a tilefarm binary", name, exe)
			}
			key := exe + "\x00" + strings.Join(args, "\x00")
			if seen[key] {
				continue
			}
			seen[key] = true
			r := run(t, exe, append(slices.Clone(args), "--help")...)
			if r.code != 0 || !strings.Contains(r.stderr+r.stdout, "Usage:") {
				t.Errorf("service %s: %s %q --help: %s", name, exe, args, r)
			}
		}
	}
	// The check above means something only while a bad flag fails before --help is read.
	for _, exe := range tilefarmBinaries {
		args := []string{"--no-such-flag", "x", "--help"}
		if exe == "coordinator" {
			args = append([]string{"serve"}, args...)
		}
		if r := run(t, exe, args...); r.code != 2 {
			t.Errorf("%s %q: want exit 2 (flags parsed before --help), got %s", exe, args, r)
		}
	}
}

// ---- the stack, without Docker ----

// composeWorld gives each container a root directory: its mounts are symlinks to one
// directory per named volume (shared between containers, as compose shares them) or to the
// repository's files; container paths in command lines and scripts are rewritten under the
// root, listen addresses to free loopback ports, and service host names to those ports.
type composeWorld struct {
	t       *testing.T
	dir     string
	cf      *composeFile
	volumes map[string]string // volume name -> its directory
	addrs   map[string]string // "service:port" -> loopback host:port
}

type container struct {
	w       *composeWorld
	service string
	s       *composeService
	root    string
	listens map[string]string // container port -> loopback host:port
	sources map[string]string // mount target -> the volume directory mounted there
}

func newComposeWorld(t *testing.T, cf *composeFile) *composeWorld {
	return &composeWorld{t: t, dir: t.TempDir(), cf: cf, volumes: map[string]string{}, addrs: map[string]string{}}
}

func (w *composeWorld) container(service string, replica int) *container {
	w.t.Helper()
	s := w.cf.Services[service]
	c := &container{w: w, service: service, s: s, root: filepath.Join(w.dir, "containers", fmt.Sprintf("%s-%d", service, replica)), listens: map[string]string{}, sources: map[string]string{}}
	for _, m := range s.Volumes {
		var src string
		switch {
		case m.Type == "bind":
			src = filepath.Join(repoPath("."), m.Source)
		case m.Source == "":
			src = filepath.Join(c.root+".anon", m.Target)
		default:
			if w.volumes[m.Source] == "" {
				w.volumes[m.Source] = filepath.Join(w.dir, "volumes", m.Source)
			}
			src = w.volumes[m.Source]
		}
		if m.Type != "bind" {
			if err := os.MkdirAll(src, 0o755); err != nil {
				w.t.Fatal(err)
			}
			c.sources[m.Target] = src
		}
		link := filepath.Join(c.root, m.Target)
		if err := os.MkdirAll(filepath.Dir(link), 0o755); err != nil {
			w.t.Fatal(err)
		}
		if err := os.Symlink(src, link); err != nil {
			w.t.Fatal(err)
		}
	}
	if err := os.MkdirAll(c.root, 0o755); err != nil {
		w.t.Fatal(err)
	}
	return c
}

// path is where a container path lies on this machine: in the volume directory mounted there
// (a process sees a mount as a directory, not a symlink), else under the root, where a bind
// mount of a file is a symlink next to the container's other files there.
func (c *container) path(p string) string {
	if m, ok := mountFor(c.s, p); ok && c.sources[m.Target] != "" {
		rel, _ := filepath.Rel(m.Target, p)
		return filepath.Join(c.sources[m.Target], rel)
	}
	return filepath.Join(c.root, p)
}

// rewriteArgs maps a command line onto this machine.
func (c *container) rewriteArgs(args []string) []string {
	c.w.t.Helper()
	out := make([]string, len(args))
	for i, a := range args {
		switch {
		case strings.HasPrefix(a, "/"):
			out[i] = c.path(a)
		case strings.Contains(a, "://"):
			out[i] = c.w.rewriteURLs(c.service, a)
		case listenAddr.MatchString(a):
			port := listenAddr.FindStringSubmatch(a)[2]
			out[i] = c.listen(port)
		default:
			out[i] = a
		}
	}
	return out
}

// listen gives the container port a free loopback port.
func (c *container) listen(port string) string {
	c.w.t.Helper()
	addr := freePort(c.w.t)
	c.listens[port] = addr
	if _, ok := c.w.addrs[c.service+":"+port]; !ok {
		c.w.addrs[c.service+":"+port] = addr
	}
	return addr
}

// rewriteURLs points URLs naming a compose service at that service's loopback port; a URL
// naming a service on a port it does not listen on fails the test.
func (w *composeWorld) rewriteURLs(from, list string) string {
	w.t.Helper()
	parts := strings.Split(list, ",")
	for i, p := range parts {
		u, err := url.Parse(p)
		if err != nil || w.cf.Services[u.Hostname()] == nil {
			continue
		}
		addr, ok := w.addrs[u.Host]
		if !ok {
			w.t.Fatalf("service %s connects to %s, but %s does not listen on port %s", from, p, u.Hostname(), u.Port())
		}
		u.Host = addr
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// rewriteScript maps the container paths of a shell script under the root: every mount
// target, where it starts a path.
func (c *container) rewriteScript(script string) string {
	var targets []string
	for _, m := range c.s.Volumes {
		targets = append(targets, regexp.QuoteMeta(m.Target))
	}
	sort.Slice(targets, func(i, j int) bool { return len(targets[i]) > len(targets[j]) })
	re := regexp.MustCompile(strings.Join(targets, "|"))
	var b strings.Builder
	last := 0
	for _, loc := range re.FindAllStringIndex(script, -1) {
		before := loc[0] == 0 || strings.ContainsRune(" \t\n\"'=(", rune(script[loc[0]-1]))
		after := loc[1] == len(script) || strings.ContainsRune("/ \t\n\"';)", rune(script[loc[1]]))
		if !before || !after {
			continue
		}
		b.WriteString(script[last:loc[0]])
		b.WriteString(c.path(script[loc[0]:loc[1]]))
		last = loc[1]
	}
	b.WriteString(script[last:])
	return b.String()
}

var probePort = regexp.MustCompile(`/dev/tcp/127\.0\.0\.1/([0-9]+)|//127\.0\.0\.1:([0-9]+)/`)

// healthy runs the service's healthcheck against this container's ports.
func (c *container) healthy() error {
	c.w.t.Helper()
	test := c.s.Healthcheck.Test[1:]
	var rewritten []string
	for _, a := range test {
		a = probePort.ReplaceAllStringFunc(a, func(m string) string {
			sub := probePort.FindStringSubmatch(m)
			probed := sub[1] + sub[2]
			addr, ok := c.listens[probed]
			if !ok {
				c.w.t.Fatalf("service %s: the healthcheck probes port %s, which the service does not listen on (%v)", c.service, probed, c.listens)
			}
			if sub[1] != "" {
				return "/dev/tcp/127.0.0.1/" + port(addr)
			}
			return "//127.0.0.1:" + port(addr) + "/"
		})
		rewritten = append(rewritten, a)
	}
	if len(rewritten) == 0 {
		c.w.t.Fatalf("service %s: empty healthcheck", c.service)
	}
	if rewritten[0] == "wget" { // the NATS image's wget; not every machine has one
		u := rewritten[len(rewritten)-1]
		resp, err := http.Get(u)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET %s: %s", u, resp.Status)
		}
		return nil
	}
	out, err := exec.Command(rewritten[0], rewritten[1:]...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// waitHealthy polls the healthcheck until it passes, and fails at once if p, the service's
// process, dies first.
func (c *container) waitHealthy(p *proctest.Proc) {
	c.w.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		err := c.healthy()
		if err == nil {
			return
		}
		if p.Exited() {
			c.w.t.Fatalf("service %s exited before it was healthy:\n%s", c.service, p.Log())
		}
		if time.Now().After(deadline) {
			c.w.t.Fatalf("service %s never became healthy (%v):\n%s", c.service, err, p.Log())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// serverBinary finds nats-server or MinIO as the test command provides them.
func serverBinary(t *testing.T, env, name string) string {
	t.Helper()
	if p := os.Getenv(env); p != "" {
		return p
	}
	p, err := exec.LookPath(name)
	if err != nil {
		t.Fatalf("no %s: set %s (the README's test command does)", name, env)
	}
	return p
}

// launch starts a server program for the rest of the test.
func (c *container) launch(binary string, args []string, env []string) *proctest.Proc {
	c.w.t.Helper()
	p, err := proctest.Start(c.service, binary, c.root+".log", env, args...)
	if err != nil {
		c.w.t.Fatal(err)
	}
	killAtEnd(c.w.t, p, c.service)
	return p
}

func envList(m map[string]string) []string {
	var l []string
	for k, v := range m {
		l = append(l, k+"="+v)
	}
	return l
}

// The compose stack runs: the credentials step's own script makes every file the other
// services read (and keeps them on a second run), nats-server accepts deploy/nats/nats.conf
// with the accounts block it wrote and refuses clients without credentials, MinIO,
// the coordinator and two workers start from the compose file's command lines, environment
// and volumes, each healthcheck fails before its service is up and passes once it is, and a
// job renders frames equal to the local reference.
func TestComposeStackRunsWithoutDocker(t *testing.T) {
	cf := loadCompose(t, nil)
	w := newComposeWorld(t, cf)
	natsBin := serverBinary(t, natstest.EnvBinary, "nats-server")

	// nats-server refuses the configuration until the credentials step has written the
	// accounts block it includes.
	nc := w.container("nats", 0)
	natsExe, natsArgs := executable(t, "nats", nc.s)
	if natsExe != "nats-server" {
		t.Fatalf("the nats service runs %s", natsExe)
	}
	natsCmd := nc.rewriteArgs(natsArgs)
	if out, err := exec.Command(natsBin, append(slices.Clone(natsCmd), "-t")...).CombinedOutput(); err == nil {
		t.Fatalf("nats-server -t accepted the configuration with no accounts block yet:\n%s", out)
	}

	// The credentials step, as its entrypoint runs it, twice: a restart of the stack.
	cc := w.container("credentials", 0)
	runCredentials := func() {
		t.Helper()
		exe, args := executable(t, "credentials", cc.s)
		ep := cc.s.Entrypoint
		cmd := exec.Command(ep[0], append([]string{ep[1], cc.rewriteScript(ep[2]), ep[3], exe}, cc.rewriteArgs(args)...)...)
		cmd.Env = append(os.Environ(), "PATH="+bins.Dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the credentials step failed: %v\n%s", err, out)
		}
	}
	runCredentials()
	readers := map[string]*container{}
	for _, name := range []string{"coordinator", "tileworker"} {
		readers[name] = w.container(name, 0)
	}
	snapshot := func() map[string]string {
		t.Helper()
		files := map[string]string{}
		for name, c := range readers {
			for _, flag := range inputFlags {
				p, ok := flagValue(c.s.Command, flag)
				if !ok {
					continue
				}
				fi, err := os.Stat(c.path(p))
				if err != nil {
					t.Fatalf("service %s: --%s %s is not there after the credentials step: %v", name, flag, p, err)
				}
				if fi.Mode().Perm()&0o077 != 0 {
					t.Errorf("service %s: %s has mode %v; a credential must be 0600", name, p, fi.Mode().Perm())
				}
				b, _ := os.ReadFile(c.path(p))
				files[name+" "+p] = string(b)
			}
		}
		b, err := os.ReadFile(nc.path("/etc/nats/accounts/accounts.conf"))
		if err != nil {
			t.Fatalf("no accounts block where nats.conf includes it: %v", err)
		}
		files["accounts"] = string(b)
		return files
	}
	first := snapshot()
	if len(first) < 4 {
		t.Fatalf("the command lines read %d files, want the coordinator's credentials and token and the workers' credentials: %v", len(first)-1, slices.Sorted(maps.Keys(first)))
	}
	runCredentials()
	if second := snapshot(); !maps.Equal(first, second) {
		t.Errorf("a second run of the credentials step changed the credentials, the token or the accounts block")
	}
	// A worker holds its own credential and nothing of the coordinator's.
	for _, flag := range inputFlags {
		secret, ok := flagValue(readers["coordinator"].s.Command, flag)
		if !ok {
			continue
		}
		for target, dir := range readers["tileworker"].sources {
			if _, err := os.Stat(filepath.Join(dir, filepath.Base(secret))); err == nil {
				t.Errorf("the tileworker's mount %s holds the coordinator's %s", target, filepath.Base(secret))
			}
		}
	}

	if out, err := exec.Command(natsBin, append(slices.Clone(natsCmd), "-t")...).CombinedOutput(); err != nil {
		t.Fatalf("nats-server -t %v: %v\n%s", natsCmd, err, out)
	}

	// NATS on loopback ports: -a, -p and -m override the configuration's listeners.
	client, monitor := natsConfPorts(t)
	if err := nc.healthyBefore(client, monitor); err == nil {
		t.Fatalf("the nats healthcheck passed before nats-server started")
	}
	natsArgsRun := append(slices.Clone(natsCmd), "-a", "127.0.0.1", "-p", port(nc.listen(client)), "-m", port(nc.listen(monitor)))
	nc.waitHealthy(nc.launch(natsBin, natsArgsRun, nil))
	if conn, err := nats.Connect("nats://"+nc.listens[client], nats.MaxReconnects(0)); err == nil {
		conn.Close()
		t.Errorf("NATS accepted a client without credentials")
	}

	mc := w.container("minio", 0)
	minioExe, minioArgs := executable(t, "minio", mc.s)
	if minioExe != "minio" {
		t.Fatalf("the minio service runs %s", minioExe)
	}
	minioCmd := mc.rewriteArgs(minioArgs)
	if err := mc.healthy(); err == nil {
		t.Fatalf("the minio healthcheck passed before MinIO started")
	}
	mc.waitHealthy(mc.launch(serverBinary(t, "TILEFARM_MINIO", "minio"), minioCmd, envList(mc.s.Environment)))

	coord := readers["coordinator"]
	exe, args := executable(t, "coordinator", coord.s)
	coordCmd := coord.rewriteArgs(args)
	if err := coord.healthy(); err == nil {
		t.Fatalf("the coordinator healthcheck passed before the coordinator started")
	}
	coord.waitHealthy(startEnv(t, envList(coord.s.Environment), exe, coordCmd...))

	replicas := *cf.Services["tileworker"].Deploy.Replicas
	for i := range replicas {
		wc := readers["tileworker"]
		if i > 0 {
			wc = w.container("tileworker", i)
		}
		exe, args := executable(t, "tileworker", wc.s)
		wcmd := wc.rewriteArgs(args)
		if err := wc.healthy(); err == nil {
			t.Fatalf("the tileworker healthcheck passed before the worker started")
		}
		wc.waitHealthy(startEnv(t, envList(wc.s.Environment), exe, wcmd...))
	}

	// A job through the API, with the token the credentials step made.
	tokenFile, _ := flagValue(coord.s.Command, "api-token-file")
	token, err := os.ReadFile(coord.path(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	f := &farmProc{t: t, Farm: &farmtest.Farm{HTTP: coord.listens[port(flagOr(coord.s.Command, "listen"))], Env: []string{"TILEFARM_API_TOKEN=" + strings.TrimSpace(string(token))}}}
	scene := example("shot")
	st, r := f.submit(append([]string{scene, "--frames", "1-2"}, small...)...)
	if st.JobID == "" {
		t.Fatalf("submit: %s", r)
	}
	if done := f.waitDone(st.JobID, 3*time.Minute); done.State != "completed" {
		t.Fatalf("job %s ended %s", st.JobID, done.State)
	}
	outputsEqualReference(t, f, st.JobID, scene, []int{1, 2}, small...)
}

// healthyBefore runs the healthcheck with the ports given loopback addresses nobody listens on.
func (c *container) healthyBefore(ports ...string) error {
	for _, p := range ports {
		c.listens[p] = freePort(c.w.t)
	}
	defer clear(c.listens)
	return c.healthy()
}

func port(addr string) string {
	_, p, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	return p
}

func flagOr(args []string, name string) string {
	v, _ := flagValue(args, name)
	return v
}
