//go:build linux

package e2e

import (
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/tilefarm/tilefarm/internal/composecheck"
	"github.com/tilefarm/tilefarm/internal/farmtest"
	"github.com/tilefarm/tilefarm/internal/natstest"
)

// The Docker deployment (Dockerfile, docker-compose.yml, deploy/nats/nats.conf) is checked
// without a Docker engine (internal/composecheck): the compose file is parsed as compose reads
// it, its command lines are given to the real binaries, the Dockerfile's stages are checked
// against it, and the stack is started from the compose file's own command lines, entrypoint
// script, environment and healthchecks.

// composeVariants are the environments the compose file must work in: none set, and workers
// built with Blender.
var composeVariants = []map[string]string{{}, {"TILEWORKER_TARGET": "tileworker-blender"}}

// repoRoot is the repository the deployment files are in.
func repoRoot() string {
	p, _ := filepath.Abs("../..")
	return p
}

// loadCompose reads docker-compose.yml with env as the environment.
func loadCompose(t *testing.T, env map[string]string) *composecheck.File {
	t.Helper()
	cf, err := composecheck.Load(repoRoot(), env)
	if err != nil {
		t.Fatal(err)
	}
	return cf
}

// executable is the program a service runs and its arguments (composecheck.Executable).
func executable(t *testing.T, name string, s *composecheck.Service) (exe string, args []string) {
	t.Helper()
	exe, args, err := composecheck.Executable(name, s)
	if err != nil {
		t.Fatal(err)
	}
	return exe, args
}

// The compose file and the Dockerfile agree: every service the farm needs is there, built from
// the stage that provides its program, as a non-root user; every file a command line reads is
// on a volume written by a step it waits for; volumes are declared; what test.sh and go.mod pin
// is what the images run.
func TestComposeFileMatchesDockerfile(t *testing.T) {
	t.Parallel()
	df, err := composecheck.ParseDockerfile(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	for _, env := range composeVariants {
		t.Run(fmt.Sprintf("env=%v", env), func(t *testing.T) {
			for _, err := range composecheck.Check(repoRoot(), loadCompose(t, env), df, env) {
				t.Error(err)
			}
		})
	}
	for _, err := range composecheck.CheckDockerfile(repoRoot(), df) {
		t.Error(err)
	}
}

// ---- command lines ----

// Every tilefarm command line of the compose file is one the real binary accepts: flags are
// parsed before --help is honoured, so an unknown flag or a bad value exits 2 and a good line
// prints the usage and exits 0.
func TestComposeCommandLinesParse(t *testing.T) {
	t.Parallel()
	seen := map[string]bool{}
	for _, env := range composeVariants {
		cf := loadCompose(t, env)
		for _, name := range []string{"credentials", "coordinator", "tileworker"} {
			exe, args := executable(t, name, cf.Services[name])
			if !slices.Contains(composecheck.TilefarmBinaries, exe) {
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
	for _, exe := range composecheck.TilefarmBinaries {
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

// The compose stack runs: the credentials step's own script makes every file the other
// services read (and keeps them on a second run), nats-server accepts deploy/nats/nats.conf
// with the accounts block it wrote and refuses clients without credentials, MinIO,
// the coordinator and two workers start from the compose file's command lines, environment
// and volumes, each healthcheck fails before its service is up and passes once it is, and a
// job renders frames equal to the local reference.
func TestComposeStackRunsWithoutDocker(t *testing.T) {
	t.Parallel()
	cf := loadCompose(t, nil)
	w := composecheck.NewWorld(t, repoRoot(), cf)
	natsBin := serverBinary(t, natstest.EnvBinary, "nats-server")

	// nats-server refuses the configuration until the credentials step has written the
	// accounts block it includes.
	nc := w.Container("nats", 0)
	natsExe, natsArgs := executable(t, "nats", nc.Service)
	if natsExe != "nats-server" {
		t.Fatalf("the nats service runs %s", natsExe)
	}
	natsCmd := nc.RewriteArgs(natsArgs)
	if out, err := exec.Command(natsBin, append(slices.Clone(natsCmd), "-t")...).CombinedOutput(); err == nil {
		t.Fatalf("nats-server -t accepted the configuration with no accounts block yet:\n%s", out)
	}

	// The credentials step, as its entrypoint runs it, twice: a restart of the stack.
	cc := w.Container("credentials", 0)
	runCredentials := func() {
		t.Helper()
		exe, args := executable(t, "credentials", cc.Service)
		ep := cc.Service.Entrypoint
		cmd := exec.Command(ep[0], append([]string{ep[1], cc.RewriteScript(ep[2]), ep[3], exe}, cc.RewriteArgs(args)...)...)
		cmd.Env = append(os.Environ(), "PATH="+bins.Dir+string(os.PathListSeparator)+os.Getenv("PATH"))
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("the credentials step failed: %v\n%s", err, out)
		}
	}
	runCredentials()
	readers := map[string]*composecheck.Container{}
	for _, name := range []string{"coordinator", "tileworker"} {
		readers[name] = w.Container(name, 0)
	}
	snapshot := func() map[string]string {
		t.Helper()
		files := map[string]string{}
		for name, c := range readers {
			for _, flag := range composecheck.InputFlags {
				p, ok := composecheck.FlagValue(c.Service.Command, flag)
				if !ok {
					continue
				}
				fi, err := os.Stat(c.Path(p))
				if err != nil {
					t.Fatalf("service %s: --%s %s is not there after the credentials step: %v", name, flag, p, err)
				}
				if fi.Mode().Perm()&0o077 != 0 {
					t.Errorf("service %s: %s has mode %v; a credential must be 0600", name, p, fi.Mode().Perm())
				}
				b, _ := os.ReadFile(c.Path(p))
				files[name+" "+p] = string(b)
			}
		}
		b, err := os.ReadFile(nc.Path("/etc/nats/accounts/accounts.conf"))
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
	for _, flag := range composecheck.InputFlags {
		secret, ok := composecheck.FlagValue(readers["coordinator"].Service.Command, flag)
		if !ok {
			continue
		}
		for target, dir := range readers["tileworker"].Sources {
			if _, err := os.Stat(filepath.Join(dir, filepath.Base(secret))); err == nil {
				t.Errorf("the tileworker's mount %s holds the coordinator's %s", target, filepath.Base(secret))
			}
		}
	}

	if out, err := exec.Command(natsBin, append(slices.Clone(natsCmd), "-t")...).CombinedOutput(); err != nil {
		t.Fatalf("nats-server -t %v: %v\n%s", natsCmd, err, out)
	}

	// NATS on loopback ports: -a, -p and -m override the configuration's listeners.
	client, monitor, err := composecheck.NATSConfPorts(repoRoot())
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.HealthyBefore(client, monitor); err == nil {
		t.Fatalf("the nats healthcheck passed before nats-server started")
	}
	natsArgsRun := append(slices.Clone(natsCmd), "-a", "127.0.0.1", "-p", composecheck.Port(nc.Listen(client)), "-m", composecheck.Port(nc.Listen(monitor)))
	nc.WaitHealthy(startBinary(t, "nats", natsBin, nil, natsArgsRun...))
	if conn, err := nats.Connect("nats://"+nc.Listens[client], nats.MaxReconnects(0)); err == nil {
		conn.Close()
		t.Errorf("NATS accepted a client without credentials")
	}

	mc := w.Container("minio", 0)
	minioExe, minioArgs := executable(t, "minio", mc.Service)
	if minioExe != "minio" {
		t.Fatalf("the minio service runs %s", minioExe)
	}
	minioCmd := mc.RewriteArgs(minioArgs)
	if err := mc.Healthy(); err == nil {
		t.Fatalf("the minio healthcheck passed before MinIO started")
	}
	mc.WaitHealthy(startBinary(t, "minio", serverBinary(t, "TILEFARM_MINIO", "minio"), mc.Service.Environment.List(), minioCmd...))

	coord := readers["coordinator"]
	exe, args := executable(t, "coordinator", coord.Service)
	coordCmd := coord.RewriteArgs(args)
	if err := coord.Healthy(); err == nil {
		t.Fatalf("the coordinator healthcheck passed before the coordinator started")
	}
	coord.WaitHealthy(startEnv(t, coord.Service.Environment.List(), exe, coordCmd...))

	replicas := *cf.Services["tileworker"].Deploy.Replicas
	for i := range replicas {
		wc := readers["tileworker"]
		if i > 0 {
			wc = w.Container("tileworker", i)
		}
		exe, args := executable(t, "tileworker", wc.Service)
		wcmd := wc.RewriteArgs(args)
		if err := wc.Healthy(); err == nil {
			t.Fatalf("the tileworker healthcheck passed before the worker started")
		}
		wc.WaitHealthy(startEnv(t, wc.Service.Environment.List(), exe, wcmd...))
	}

	// A job through the API, with the token the credentials step made.
	tokenFile, _ := composecheck.FlagValue(coord.Service.Command, "api-token-file")
	token, err := os.ReadFile(coord.Path(tokenFile))
	if err != nil {
		t.Fatal(err)
	}
	listen, _ := composecheck.FlagValue(coord.Service.Command, "listen")
	f := &farmProc{t: t, Farm: &farmtest.Farm{HTTP: coord.Listens[composecheck.Port(listen)], Env: []string{"TILEFARM_API_TOKEN=" + strings.TrimSpace(string(token))}}}
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
