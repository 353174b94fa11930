// Package tlsclient builds the TLS config of the service's own clients
// (Redis, the xDS management server) from certificate files.
package tlsclient

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// Config trusts the CAs in caFile (the system roots when it is empty) and,
// when certFile is set, presents that certificate with keyFile's key.
func Config(caFile, certFile, keyFile string) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("read CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("no certificate in %s", caFile)
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("load client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
