package redis

import (
	"strings"
	"testing"
)

func TestParseAddress(t *testing.T) {
	tests := []struct {
		in      string
		want    Address
		wantErr string
	}{
		{in: "127.0.0.1:6379", want: Address{Addr: "127.0.0.1:6379"}},
		{in: "/var/run/redis.sock", want: Address{Addr: "/var/run/redis.sock"}},
		{in: "redis://localhost:6380", want: Address{Addr: "localhost:6380", URL: true}},
		{in: "redis://localhost", want: Address{Addr: "localhost:6379", URL: true}},
		{in: "redis://[::1]:6380/3", want: Address{Addr: "[::1]:6380", DB: 3, URL: true}},
		{in: "redis://:pw@h:1/2", want: Address{Addr: "h:1", Password: "pw", DB: 2, URL: true}},
		{in: "redis://alice:pw@h:1", want: Address{Addr: "h:1", User: "alice", Password: "pw", URL: true}},
		{in: "redis://alice@h:1", want: Address{Addr: "h:1", User: "alice", URL: true}},
		{in: "redis://h:1?password=pw&username=bob&db=4", want: Address{Addr: "h:1", User: "bob", Password: "pw", DB: 4, URL: true}},
		// The user info wins over the query, the path over db=.
		{in: "redis://al:p1@h:1/5?password=p2&username=bob&db=4", want: Address{Addr: "h:1", User: "al", Password: "p1", DB: 5, URL: true}},
		{in: "redis://:p%40ss%3Aw@h:1", want: Address{Addr: "h:1", Password: "p@ss:w", URL: true}},
		{in: "rediss://:pw@h:1", want: Address{Addr: "h:1", Password: "pw", TLS: true, URL: true}},
		{in: "REDIS://h:1", want: Address{Addr: "h:1", URL: true}},
		{in: "http://h:1", wantErr: `unknown scheme "http"`},
		{in: "redis://:pw@", wantErr: "no host"},
		{in: "redis://:pw@h:1/x", wantErr: `database "x" is not a number`},
		{in: "redis://:pw@h:1/-1", wantErr: `database "-1" is not a number`},
		{in: "redis://:pw@h:99999", wantErr: "is not a port number"},
		{in: "redis://:pw@h:1 2", wantErr: "not a valid URL"},
	}
	for _, tt := range tests {
		got, err := ParseAddress(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseAddress(%q) error = %v, want %q", tt.in, err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "pw") {
				t.Errorf("ParseAddress(%q) error %q shows the password", tt.in, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseAddress(%q) = %+v, %v, want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestCheckAddress(t *testing.T) {
	tests := []struct {
		addr, network string
		url           bool
		wantErr       string
	}{
		{"127.0.0.1:6379", "tcp", false, ""},
		{"[::1]:6379", "tcp", false, ""},
		{"localhost", "tcp", false, "want host:port"},
		{"a:b:c", "tcp", false, "too many colons"},
		{"h:x", "tcp", false, `port "x" is not a port number`},
		{"h:0", "tcp", false, "is not a port number"},
		{"/run/redis.sock", "unix", false, ""},
		{"", "unix", false, "empty socket path"},
		{"h:1", "unix", true, "the socket type is unix"},
	}
	for _, tt := range tests {
		err := checkAddress(Address{Addr: tt.addr, URL: tt.url}, tt.network)
		if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("CheckAddress(%q, %s) = %v, want %q", tt.addr, tt.network, err, tt.wantErr)
		}
	}
}

func TestMaskURL(t *testing.T) {
	tests := []struct{ in, want string }{
		{"127.0.0.1:6379", "127.0.0.1:6379"},
		{"redis://h:1/2", "redis://h:1/2"},
		{"redis://:s3cret@h:1/2", "redis://:****@h:1/2"},
		{"redis://al:s3cret@h:1", "redis://al:****@h:1"},
		{"redis://al@h:1", "redis://al@h:1"},
		{"redis://:s3@cr@et@h:1", "redis://:****@h:1"},
		{"redis://h:1?db=2&password=s3cret&x=1", "redis://h:1?db=2&password=****&x=1"},
		{"redis://h:1?pass%77ord=s3cret", "redis://h:1?pass%77ord=****"},
		{"mymaster,redis://:s3cret@h:1,redis://:s3cret@h:2", "mymaster,redis://:****@h:1,redis://:****@h:2"},
	}
	for _, tt := range tests {
		if got := MaskURL(tt.in); got != tt.want {
			t.Errorf("MaskURL(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}

// TestDeployment: what each type makes of a URL list, and the lists that
// can never be dialed, as start-up errors without the password.
func TestDeployment(t *testing.T) {
	tests := []struct {
		o       ClientOptions
		want    deployment
		wantErr string
	}{
		{o: ClientOptions{URL: "redis://:pw@h:1/2"}, want: deployment{addrs: []string{"h:1"}, pass: "pw", db: 2}},
		{o: ClientOptions{URL: "h:1", Type: "single"}, want: deployment{addrs: []string{"h:1"}}},
		{o: ClientOptions{URL: "/s.sock", Network: "unix"}, want: deployment{addrs: []string{"/s.sock"}}},
		{o: ClientOptions{URL: "m,redis://:pw@h:1/1,redis://:pw@h:2/1", Type: "sentinel"},
			want: deployment{master: "m", addrs: []string{"h:1", "h:2"}, pass: "pw", db: 1}},
		{o: ClientOptions{URL: "redis://u:pw@h:1,h:2", Type: "cluster"}, want: deployment{addrs: []string{"h:1", "h:2"}, user: "u", pass: "pw"}},
		{o: ClientOptions{URL: "redis://h:1/2,redis://h:2/2", Type: "cluster"}, wantErr: "Redis Cluster has database 0 only"},
		{o: ClientOptions{URL: "redis://:pw@h:1,redis://:other@h:2", Type: "cluster"}, wantErr: "other credentials"},
		{o: ClientOptions{URL: "h:1,h:2"}, wantErr: "single wants one address"},
		{o: ClientOptions{URL: "m", Type: "sentinel"}, wantErr: "sentinel wants master-name"},
		{o: ClientOptions{URL: " , "}, wantErr: "empty"},
		{o: ClientOptions{URL: "a:b:c"}, wantErr: "too many colons"},
		{o: ClientOptions{URL: "redis://:pw@h:1", Network: "unix"}, wantErr: "the socket type is unix"},
		{o: ClientOptions{URL: "h:1", Type: "ring"}, wantErr: `unknown type "ring"`},
	}
	for _, tt := range tests {
		got, err := tt.o.deployment()
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || strings.Contains(err.Error(), "pw") {
				t.Errorf("%+v: error = %v, want %q without the password", tt.o, err, tt.wantErr)
			}
			continue
		}
		if err != nil || strings.Join(got.addrs, ",") != strings.Join(tt.want.addrs, ",") || got.master != tt.want.master ||
			got.user != tt.want.user || got.pass != tt.want.pass || got.db != tt.want.db || got.tls != tt.want.tls {
			t.Errorf("%+v: = %+v, %v, want %+v", tt.o, got, err, tt.want)
		}
	}
}
