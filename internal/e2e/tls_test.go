//go:build linux

package e2e

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// writeCert writes a PEM certificate and key for the addresses ips (none: 127.0.0.1) signed
// by parent (self-signed when parent is nil) and returns the certificate and key.
func writeCert(t *testing.T, dir, name string, isCA bool, parent *x509.Certificate, parentKey *ecdsa.PrivateKey, ips ...string) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	if len(ips) == 0 {
		ips = []string{"127.0.0.1"}
	}
	var addrs []net.IP
	for _, ip := range ips {
		addrs = append(addrs, net.ParseIP(ip))
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  addrs,
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IsCA:         isCA, BasicConstraintsValid: true,
	}
	signer, signerKey := tmpl, key
	if parent != nil {
		signer, signerKey = parent, parentKey
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signerKey)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	kb, _ := x509.MarshalECPrivateKey(key)
	if err := os.WriteFile(filepath.Join(dir, name+".pem"), pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, name+"-key.pem"), pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}
	return cert, key
}

// The embedded JetStream serves render nodes over TLS: a worker trusting the farm's CA
// renders; one that does not is refused by its own TLS check and renders nothing.
func TestEmbeddedNATSOverTLS(t *testing.T) {
	t.Parallel()
	scene := example("shot")
	pki := t.TempDir()
	ca, caKey := writeCert(t, pki, "ca", true, nil, nil)
	writeCert(t, pki, "server", false, ca, caKey)
	f := startServe(t, t.TempDir(), "--nats-cert", filepath.Join(pki, "server.pem"), "--nats-key", filepath.Join(pki, "server-key.pem"))
	untrusting := f.worker("untrusting", t.TempDir())
	st, _ := f.submit(append([]string{scene, "--frames", "8"}, small...)...)
	if _, err := untrusting.WaitLog(t.Context(), regexp.MustCompile(`(?i)x509|certificate`), 0, 30*time.Second); err != nil {
		t.Fatalf("a worker without the CA did not report the TLS failure: %v\n%s", err, untrusting.Log())
	}
	if s, _ := f.status(st.JobID); s.TilesCompleted != 0 {
		t.Fatalf("a worker that cannot verify the server rendered %d tiles", s.TilesCompleted)
	}
	trusting := f.worker("trusting", t.TempDir(), "--nats-ca", filepath.Join(pki, "ca.pem"))
	if done := f.waitDone(st.JobID, 2*time.Minute); done.State != "completed" {
		t.Fatalf("job over TLS: %+v", done)
	}
	if strings.Contains(untrusting.Log(), "worker started") {
		t.Fatalf("the untrusting worker joined the farm:\n%s", untrusting.Log())
	}
	_ = trusting
	outputsEqualReference(t, f, st.JobID, scene, []int{8}, small...)
}
