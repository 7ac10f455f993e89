package queue

import (
	"bufio"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"
)

// permissionRow is a row of docs/reliability.md's table of a worker identity's permissions.
type permissionRow struct{ verdict, subject string }

// documentedPermissions reads the table of a worker identity's permissions from
// docs/reliability.md: its rows whose first cell says what a worker may or is refused.
func documentedPermissions(t *testing.T) []permissionRow {
	t.Helper()
	f, err := os.Open("../../docs/reliability.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []permissionRow
	for sc := bufio.NewScanner(f); sc.Scan(); {
		cells := strings.Split(sc.Text(), "|")
		if len(cells) < 4 {
			continue
		}
		verdict, subject := strings.TrimSpace(cells[1]), strings.Trim(strings.TrimSpace(cells[2]), "`")
		if strings.HasPrefix(verdict, "may ") || strings.HasPrefix(verdict, "is refused ") {
			rows = append(rows, permissionRow{verdict, subject})
		}
	}
	if len(rows) == 0 {
		t.Fatal("docs/reliability.md has no table of a worker identity's permissions")
	}
	return rows
}

// concrete is a subject matching the pattern, as a client would publish or subscribe: a
// wildcard token becomes a plain one.
func concrete(pattern string) string {
	pattern = strings.ReplaceAll(pattern, "*", "x")
	if strings.HasSuffix(pattern, ">") {
		pattern = strings.TrimSuffix(pattern, ">") + "x.y"
	}
	return pattern
}

func newUser(t *testing.T) (nkeys.KeyPair, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, err := kp.PublicKey()
	if err != nil {
		t.Fatal(err)
	}
	return kp, pub
}

// Property: a worker identity may publish and subscribe to exactly what docs/reliability.md's
// table lists, no more: the table's allowed rows are WorkerPublish and WorkerSubscribe, and on
// a live server with AccountConfig every allowed row works and every refused row is refused,
// among them the coordinator's inbox and another worker's.
func TestWorkerPermissionsAreTheDocumentedOnes(t *testing.T) {
	rows := documentedPermissions(t)
	_, coordPub := newUser(t)
	me, mePub := newUser(t)
	_, otherPub := newUser(t)
	placeholders := strings.NewReplacer("<its key>", mePub, "<another key>", otherPub)
	var allowPub, allowSub []string
	for i := range rows {
		rows[i].subject = placeholders.Replace(rows[i].subject)
		switch rows[i].verdict {
		case "may publish":
			allowPub = append(allowPub, rows[i].subject)
		case "may subscribe":
			allowSub = append(allowSub, rows[i].subject)
		}
	}
	slices.Sort(allowPub)
	if code := slices.Sorted(slices.Values(WorkerPublish())); !slices.Equal(code, allowPub) {
		t.Fatalf("WorkerPublish and the documented table differ:\ncode: %q\ndocs: %q", code, allowPub)
	}
	if code := WorkerSubscribe(mePub); !slices.Equal(code, allowSub) {
		t.Fatalf("WorkerSubscribe and the documented table differ:\ncode: %q\ndocs: %q", code, allowSub)
	}

	emb, err := StartEmbedded(t.Context(), t.TempDir(), "", WithConfig(AccountConfig(coordPub, mePub, otherPub)))
	if err != nil {
		t.Fatal(err)
	}
	defer emb.Shutdown()
	var mu sync.Mutex
	var violations []string
	sign := func(nonce []byte) ([]byte, error) { return me.Sign(nonce) }
	nc, err := nats.Connect(emb.ClientURL(), nats.Nkey(mePub, sign), nats.CustomInboxPrefix(WorkerInboxPrefix(mePub)),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			violations = append(violations, err.Error())
			mu.Unlock()
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	var refused []string
	for _, r := range rows {
		subject := concrete(r.subject)
		var err error
		if strings.HasSuffix(r.verdict, "publish") || strings.HasSuffix(r.verdict, "publishing") {
			err = nc.Publish(subject, []byte("{}"))
		} else {
			_, err = nc.SubscribeSync(subject)
		}
		if err != nil {
			t.Fatalf("%s %s: %v", r.verdict, subject, err)
		}
		if strings.HasPrefix(r.verdict, "is refused") {
			refused = append(refused, subject)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	violated := func(subject string) bool {
		mu.Lock()
		defer mu.Unlock()
		return slices.ContainsFunc(violations, func(v string) bool {
			return strings.Contains(v, "Permissions Violation") && strings.Contains(v, `"`+subject+`"`)
		})
	}
	for _, subject := range refused {
		for deadline := time.Now().Add(5 * time.Second); !violated(subject); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("a worker identity was not refused %q (violations: %q)", subject, violations)
			}
		}
	}
	for _, r := range rows {
		if strings.HasPrefix(r.verdict, "may") && violated(concrete(r.subject)) {
			t.Fatalf("a worker identity was refused what it may do: %s %s", r.verdict, r.subject)
		}
	}
	// Its own inbox works end to end: a request's reply reaches it.
	if _, err := nc.Request("$JS.API.INFO", nil, 5*time.Second); err != nil {
		t.Fatalf("a request of the worker identity got no reply in its own inbox: %v", err)
	}
}
