package server

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"sync"
	"time"
)

// TLSOptions are the gRPC server's certificate files.
type TLSOptions struct {
	CertFile, KeyFile string
	// ClientCAFile, when set, requires clients to present a certificate
	// signed by it (mTLS); ClientSAN, when set, further requires that name
	// among the client certificate's DNS names.
	ClientCAFile string
	ClientSAN    string
	// OnReloadError, when set, hears about files that changed but cannot
	// be loaded (a half-written or garbage certificate): once per change,
	// while the previous certificate keeps serving.
	OnReloadError func(error)
}

// certFiles serves a certificate (and client CA) from files, reloading them
// when their modification time changes, checked at most once a second on a
// handshake. A rotation (cert-manager, a Secret update) therefore needs no
// restart, and a half-written file keeps the old certificate serving.
type certFiles struct {
	o       TLSOptions
	every   time.Duration
	mu      sync.Mutex
	checked time.Time
	stamp   string
	// failed is the stamp of files that did not load, so that a broken
	// rotation is reported once, not on every handshake.
	failed string
	cert   *tls.Certificate
	pool   *x509.CertPool
}

// NewTLSConfig returns the server TLS config for o. It fails if the files
// cannot be loaded now.
func NewTLSConfig(o TLSOptions) (*tls.Config, error) { return newTLSConfig(o, time.Second) }

// newTLSConfig checks the files at most once per every (tests use 0).
func newTLSConfig(o TLSOptions, every time.Duration) (*tls.Config, error) {
	cf := &certFiles{o: o, every: every}
	if err := cf.load(); err != nil {
		return nil, err
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12}
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			cf.refresh()
			c := base.Clone()
			cf.mu.Lock()
			c.Certificates = []tls.Certificate{*cf.cert}
			if cf.pool != nil {
				c.ClientAuth = tls.RequireAndVerifyClientCert
				c.ClientCAs = cf.pool
				c.VerifyPeerCertificate = cf.checkSAN
			}
			cf.mu.Unlock()
			return c, nil
		},
	}, nil
}

func (cf *certFiles) refresh() {
	cf.mu.Lock()
	due := time.Since(cf.checked) >= cf.every
	cf.mu.Unlock()
	if due {
		// Keep serving the old files if the new ones are broken.
		if stamp, err := cf.loadStamped(); err != nil && cf.o.OnReloadError != nil {
			cf.mu.Lock()
			first := stamp != cf.failed
			cf.failed = stamp
			cf.mu.Unlock()
			if first {
				cf.o.OnReloadError(err)
			}
		}
	}
}

func (cf *certFiles) load() error {
	_, err := cf.loadStamped()
	return err
}

// loadStamped loads the files if their stamp (names, modification times,
// sizes) changed, and returns the stamp it saw.
func (cf *certFiles) loadStamped() (string, error) {
	stamp := ""
	for _, f := range []string{cf.o.CertFile, cf.o.KeyFile, cf.o.ClientCAFile} {
		if f == "" {
			continue
		}
		fi, err := os.Stat(f)
		if err != nil {
			return stamp, fmt.Errorf("tls: %w", err)
		}
		stamp += fmt.Sprintf("%s:%d:%d;", f, fi.ModTime().UnixNano(), fi.Size())
	}
	cf.mu.Lock()
	cf.checked = time.Now()
	same := stamp == cf.stamp
	cf.mu.Unlock()
	if same {
		return stamp, nil
	}
	cert, err := tls.LoadX509KeyPair(cf.o.CertFile, cf.o.KeyFile)
	if err != nil {
		return stamp, fmt.Errorf("tls: load server certificate: %w", err)
	}
	var pool *x509.CertPool
	if cf.o.ClientCAFile != "" {
		pem, err := os.ReadFile(cf.o.ClientCAFile)
		if err != nil {
			return stamp, fmt.Errorf("tls: read client CA: %w", err)
		}
		pool = x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return stamp, fmt.Errorf("tls: no certificate in %s", cf.o.ClientCAFile)
		}
	}
	cf.mu.Lock()
	cf.cert, cf.pool, cf.stamp, cf.failed = &cert, pool, stamp, ""
	cf.mu.Unlock()
	return stamp, nil
}

// checkSAN runs after chain verification: the client must carry ClientSAN.
func (cf *certFiles) checkSAN(_ [][]byte, chains [][]*x509.Certificate) error {
	if cf.o.ClientSAN == "" {
		return nil
	}
	if len(chains) == 0 || len(chains[0]) == 0 {
		return errors.New("tls: no verified client certificate")
	}
	if !slices.Contains(chains[0][0].DNSNames, cf.o.ClientSAN) {
		return fmt.Errorf("tls: client certificate lacks the name %q", cf.o.ClientSAN)
	}
	return nil
}
