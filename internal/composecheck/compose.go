// Package composecheck reads the Docker deployment (docker-compose.yml, the Dockerfile,
// deploy/nats/nats.conf) as Docker would, without a Docker engine, so the e2e tests can check
// it: the compose file is parsed as compose reads it (interpolation, merge keys), the
// Dockerfile's stages for the binaries and users they provide, and Check and CheckDockerfile
// say where the two disagree with each other or with what the repository pins elsewhere. A
// World runs the stack's services as local processes from the compose file's own command
// lines, entrypoint script, environment and healthchecks, with every container's filesystem a
// directory whose mounts are symlinks to shared volume directories.
package composecheck

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// TilefarmBinaries are the binaries the tilefarm image provides; every other executable comes
// from another image.
var TilefarmBinaries = []string{"coordinator", "tileworker"}

// File is a compose file, as far as the deployment uses it.
type File struct {
	Services map[string]*Service `yaml:"services"`
	Volumes  map[string]any      `yaml:"volumes"`
	Secrets  map[string]struct {
		File string `yaml:"file"`
	} `yaml:"secrets"`
}

// Service is one service of a compose file.
type Service struct {
	Image         string   `yaml:"image"`
	Build         *Build   `yaml:"build"`
	Entrypoint    Argv     `yaml:"entrypoint"`
	Command       Argv     `yaml:"command"`
	Environment   Env      `yaml:"environment"`
	Volumes       []Mount  `yaml:"volumes"`
	Secrets       []string `yaml:"secrets"`
	Ports         []string `yaml:"ports"`
	ContainerName string   `yaml:"container_name"`
	DependsOn     map[string]struct {
		Condition string `yaml:"condition"`
	} `yaml:"depends_on"`
	Healthcheck *struct {
		Test Argv `yaml:"test"`
	} `yaml:"healthcheck"`
	Deploy struct {
		Replicas *int `yaml:"replicas"`
	} `yaml:"deploy"`
	Restart string `yaml:"restart"`
}

// Build is a service's build section; a plain string is its context.
type Build struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
	Target     string `yaml:"target"`
}

// UnmarshalYAML reads the long form or a lone context.
func (b *Build) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain Build
	return n.Decode((*plain)(b))
}

// Argv is a command in exec (list) form: exactly the arguments the process gets.
type Argv []string

// UnmarshalYAML refuses the shell (string) form, whose arguments a shell would split.
func (a *Argv) UnmarshalYAML(n *yaml.Node) error {
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

// Env is a service's environment, from a map or a list of NAME=VALUE.
type Env map[string]string

// UnmarshalYAML reads either form.
func (e *Env) UnmarshalYAML(n *yaml.Node) error {
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

// List is the environment as NAME=VALUE entries, as a process takes it.
func (e Env) List() []string {
	var l []string
	for k, v := range e {
		l = append(l, k+"="+v)
	}
	return l
}

// Mount is a volume entry: named volume, bind mount or anonymous volume.
type Mount struct {
	Type     string // volume, bind
	Source   string // volume name or host path; empty for an anonymous volume
	Target   string
	ReadOnly bool
}

// UnmarshalYAML reads the long form or SOURCE:TARGET[:MODE].
func (m *Mount) UnmarshalYAML(n *yaml.Node) error {
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
		*m = Mount{Type: long.Type, Source: long.Source, Target: long.Target, ReadOnly: long.ReadOnly}
		return nil
	}
	parts := strings.Split(n.Value, ":")
	switch len(parts) {
	case 1:
		*m = Mount{Type: "volume", Target: parts[0]}
		return nil
	case 2, 3:
		*m = Mount{Type: "volume", Source: parts[0], Target: parts[1]}
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

// Load reads the docker-compose.yml of the repository at root with env as the environment,
// interpolating the way compose does: ${VAR}, ${VAR:-default}, and $$ for a literal $.
func Load(root string, env map[string]string) (*File, error) {
	data, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		return nil, err
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("docker-compose.yml: %w", err)
	}
	if err := interpolateNode(&doc, env, map[*yaml.Node]bool{}); err != nil {
		return nil, fmt.Errorf("docker-compose.yml: %w", err)
	}
	var cf File
	if err := doc.Decode(&cf); err != nil {
		return nil, fmt.Errorf("docker-compose.yml: %w", err)
	}
	return &cf, nil
}

func interpolateNode(n *yaml.Node, env map[string]string, seen map[*yaml.Node]bool) error {
	if seen[n] {
		return nil
	}
	seen[n] = true
	switch n.Kind {
	case yaml.ScalarNode:
		v, err := Interpolate(n.Value, env)
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

// Interpolate substitutes env into s as compose does. A variable without a default must be
// set, since the file must work with nothing set, and a bare $ is refused, since compose
// would substitute it.
func Interpolate(s string, env map[string]string) (string, error) {
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

// Executable is the program a service runs, and its arguments. An entrypoint may only be a
// shell script that runs the command ("$@"): the command is then what the program gets.
func Executable(name string, s *Service) (exe string, args []string, err error) {
	if len(s.Entrypoint) > 0 {
		if len(s.Entrypoint) != 4 || s.Entrypoint[0] != "/bin/sh" || s.Entrypoint[1] != "-c" || !strings.Contains(s.Entrypoint[2], `"$@"`) {
			return "", nil, fmt.Errorf("service %s: an entrypoint must be [/bin/sh, -c, SCRIPT running \"$@\", NAME], got %q", name, []string(s.Entrypoint))
		}
	}
	if len(s.Command) == 0 {
		return "", nil, fmt.Errorf("service %s has no command", name)
	}
	return s.Command[0], s.Command[1:], nil
}

// FlagValue is the value of --name in args.
func FlagValue(args []string, name string) (string, bool) {
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

// InputFlags name files a process reads and some volume or secret must provide.
var InputFlags = []string{"nats-creds", "api-token-file", "nats-ca", "nats-cert", "nats-key"}

// MountFor is the mount a container path lies on.
func MountFor(s *Service, p string) (Mount, bool) {
	var best Mount
	found := false
	for _, m := range s.Volumes {
		if (p == m.Target || strings.HasPrefix(p, strings.TrimSuffix(m.Target, "/")+"/")) && len(m.Target) >= len(best.Target) {
			best, found = m, true
		}
	}
	for _, sec := range s.Secrets {
		if target := "/run/secrets/" + sec; p == target {
			return Mount{Type: "secret", Source: sec, Target: target, ReadOnly: true}, true
		}
	}
	return best, found
}
