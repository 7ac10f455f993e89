package composecheck

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Stage is one stage of a Dockerfile, as far as the checks read it.
type Stage struct {
	Name, From string
	Base       *Stage            // the earlier stage FROM names, if any
	Files      map[string]string // path in the image -> stage it is copied from
	Copied     map[string]string // path in the image -> its path in that stage
	User       string
	Workdir    string
	Runs       []string
	Args       map[string]string
	Envs       []string
}

// Provides reports which stage the stage or its bases copy the image path p from, and its
// path there.
func (s *Stage) Provides(p string) (from, src string, ok bool) {
	for st := s; st != nil; st = st.Base {
		if f, ok := st.Files[p]; ok {
			return f, st.Copied[p], true
		}
	}
	return "", "", false
}

// RootImage is the image the stage's chain of bases starts from.
func (s *Stage) RootImage() string {
	if s.Base != nil {
		return s.Base.RootImage()
	}
	return s.From
}

// EffectiveUser is the user the stage runs as, its own or its bases'.
func (s *Stage) EffectiveUser() string {
	for st := s; st != nil; st = st.Base {
		if st.User != "" {
			return st.User
		}
	}
	return ""
}

// EffectiveWorkdir is the stage's working directory, its own or its bases'.
func (s *Stage) EffectiveWorkdir() string {
	for st := s; st != nil; st = st.Base {
		if st.Workdir != "" {
			return st.Workdir
		}
	}
	return ""
}

// AllRuns are the RUN lines of the stage's bases, then its own.
func (s *Stage) AllRuns() []string {
	if s.Base == nil {
		return s.Runs
	}
	return append(slices.Clone(s.Base.AllRuns()), s.Runs...)
}

// HasShell reports whether the stage's base image has /bin/sh and bash: a Debian image.
func (s *Stage) HasShell() bool {
	img := s.RootImage()
	return strings.HasPrefix(img, "debian:")
}

// Dockerfile is a parsed Dockerfile: its stages in order and by name.
type Dockerfile struct {
	Stages []*Stage
	ByName map[string]*Stage
	Args   map[string]string // ARGs before the first FROM
}

// ParseDockerfile reads the Dockerfile of the repository at root.
func ParseDockerfile(root string) (*Dockerfile, error) {
	f, err := os.Open(filepath.Join(root, "Dockerfile"))
	if err != nil {
		return nil, err
	}
	defer f.Close()
	df := &Dockerfile{ByName: map[string]*Stage{}, Args: map[string]string{}}
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
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading the Dockerfile: %w", err)
	}
	if cont.Len() > 0 {
		return nil, errors.New("Dockerfile ends inside a continued line")
	}
	var cur *Stage
	for _, l := range lines {
		fields := strings.Fields(l)
		instr, rest := strings.ToUpper(fields[0]), fields[1:]
		if cur == nil && instr != "FROM" && instr != "ARG" {
			return nil, fmt.Errorf("Dockerfile: %s before the first FROM", instr)
		}
		switch instr {
		case "ARG":
			k, v, _ := strings.Cut(rest[0], "=")
			if cur == nil {
				df.Args[k] = v
			} else {
				cur.Args[k] = v
			}
		case "FROM":
			for len(rest) > 0 && strings.HasPrefix(rest[0], "--") {
				rest = rest[1:]
			}
			st := &Stage{From: rest[0], Files: map[string]string{}, Copied: map[string]string{}, Args: map[string]string{}}
			if len(rest) == 3 && strings.EqualFold(rest[1], "AS") {
				st.Name = rest[2]
			} else if len(rest) != 1 {
				return nil, fmt.Errorf("Dockerfile: cannot read %q", l)
			}
			st.Base = df.ByName[st.From]
			if st.Name != "" {
				if df.ByName[st.Name] != nil {
					return nil, fmt.Errorf("Dockerfile: two stages named %s", st.Name)
				}
				df.ByName[st.Name] = st
			}
			df.Stages = append(df.Stages, st)
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
				return nil, fmt.Errorf("Dockerfile: cannot read %q", l)
			}
			srcs, dest := rest[:len(rest)-1], rest[len(rest)-1]
			for _, src := range srcs {
				p := dest
				if strings.HasSuffix(dest, "/") || len(srcs) > 1 {
					p = path.Join(dest, path.Base(src))
				}
				cur.Files[p], cur.Copied[p] = from, src
			}
		case "USER":
			cur.User = rest[0]
		case "WORKDIR":
			cur.Workdir = rest[0]
		case "RUN":
			cur.Runs = append(cur.Runs, strings.Join(rest, " "))
		case "ENV":
			k, _, _ := strings.Cut(rest[0], "=")
			cur.Envs = append(cur.Envs, k)
		}
	}
	if len(df.Stages) == 0 {
		return nil, errors.New("Dockerfile has no stage")
	}
	return df, nil
}
