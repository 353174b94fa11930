package tlsclient

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/openrls/ratelimit/src/tlstest"
)

func TestConfig(t *testing.T) {
	dir := t.TempDir()
	ca := tlstest.NewCA(t, "ca")
	crt, key := ca.Issue(t, "client", "client.local")
	caFile := tlstest.Write(t, dir, "ca.pem", ca.PEM)
	crtFile, keyFile := tlstest.Write(t, dir, "c.crt", crt), tlstest.Write(t, dir, "c.key", key)
	garbage := tlstest.Write(t, dir, "garbage.pem", []byte("not a certificate"))
	for _, tc := range []struct {
		name                string
		ca, cert, key, want string // want: "" for success, else part of the error
	}{
		{"system roots, no certificate", "", "", "", ""},
		{"a CA and a client certificate", caFile, crtFile, keyFile, ""},
		{"a missing CA file", filepath.Join(dir, "nope.pem"), "", "", "read CA"},
		{"a CA file without certificates", garbage, "", "", "no certificate in " + garbage},
		{"a certificate without its key", caFile, crtFile, garbage, "load client certificate"},
	} {
		cfg, err := Config(tc.ca, tc.cert, tc.key)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.name, err)
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
			t.Errorf("%s: error %v, want %q", tc.name, err, tc.want)
		case tc.want == "" && (tc.ca != "") != (cfg.RootCAs != nil) || tc.want == "" && (tc.cert != "") != (len(cfg.Certificates) == 1):
			t.Errorf("%s: config %+v", tc.name, cfg)
		}
	}
}
