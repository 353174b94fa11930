package elasticache

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
)

// TestTokenIsTheSignedConnectRequest signs with fixed credentials and a
// fixed clock, then checks the token against SigV4 query signing worked
// out here, independently of the SDK: the connect action for the user, a
// lifetime of 900 s, the credential scope of the elasticache service,
// and the signature a verifier computes from the canonical request.
func TestTokenIsTheSignedConnectRequest(t *testing.T) {
	at := time.Date(2026, 12, 1, 22, 39, 0, 0, time.UTC)
	for _, serverless := range []bool{false, true} {
		s := &Signer{CacheName: "rl-cache", UserID: "rl-user", Region: "eu-west-1", Serverless: serverless,
			Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", ""),
			Now:         func() time.Time { return at }}
		user, tok, err := s.Auth(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if user != "rl-user" {
			t.Errorf("user %q, want the user id", user)
		}
		host, rawQuery, ok := strings.Cut(tok, "/?")
		if !ok || host != "rl-cache" || strings.Contains(tok, "://") {
			t.Fatalf("token %q: want rl-cache/?QUERY, no scheme", tok)
		}
		q, err := url.ParseQuery(rawQuery)
		if err != nil {
			t.Fatal(err)
		}
		want := map[string]string{
			"Action": "connect", "User": "rl-user", "X-Amz-Algorithm": "AWS4-HMAC-SHA256",
			"X-Amz-Credential": "AKIDEXAMPLE/20261201/eu-west-1/elasticache/aws4_request",
			"X-Amz-Date":       "20261201T223900Z", "X-Amz-Expires": "900", "X-Amz-SignedHeaders": "host",
		}
		if serverless {
			want["ResourceType"] = "ServerlessCache"
		}
		for k, v := range want {
			if q.Get(k) != v {
				t.Errorf("serverless=%v: %s = %q, want %q", serverless, k, q.Get(k), v)
			}
		}
		if _, has := q["ResourceType"]; has != serverless {
			t.Errorf("serverless=%v: ResourceType present = %v", serverless, has)
		}
		sig := q.Get("X-Amz-Signature")
		q.Del("X-Amz-Signature")
		if wantSig := sigV4Query("GET", "rl-cache", q, "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", "20261201", "eu-west-1", "elasticache"); sig != wantSig {
			t.Errorf("serverless=%v: signature %s, want %s", serverless, sig, wantSig)
		}
	}
}

// sigV4Query is AWS Signature Version 4 for a presigned request (query
// parameters, the host header signed, an empty payload), as AWS documents
// it.
func sigV4Query(method, host string, q url.Values, secret, day, region, service string) string {
	keys := make([]string, 0, len(q))
	for k := range q {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var parts []string
	for _, k := range keys {
		parts = append(parts, uriEncode(k)+"="+uriEncode(q.Get(k)))
	}
	payload := sha256.Sum256(nil)
	canonical := strings.Join([]string{method, "/", strings.Join(parts, "&"), "host:" + host + "\n", "host", hex.EncodeToString(payload[:])}, "\n")
	sum := sha256.Sum256([]byte(canonical))
	scope := day + "/" + region + "/" + service + "/aws4_request"
	toSign := "AWS4-HMAC-SHA256\n" + q.Get("X-Amz-Date") + "\n" + scope + "\n" + hex.EncodeToString(sum[:])
	mac := func(key []byte, s string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(s))
		return h.Sum(nil)
	}
	k := mac(mac(mac(mac([]byte("AWS4"+secret), day), region), service), "aws4_request")
	return hex.EncodeToString(mac(k, toSign))
}

// uriEncode is SigV4's encoding: every byte but A-Z a-z 0-9 - _ . ~ as %XX.
func uriEncode(s string) string {
	var b strings.Builder
	for _, c := range []byte(s) {
		if c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
		} else {
			b.WriteString("%" + strings.ToUpper(hex.EncodeToString([]byte{c})))
		}
	}
	return b.String()
}

func TestTokenWithoutCredentialsIsAnError(t *testing.T) {
	s := &Signer{CacheName: "c", UserID: "u", Region: "eu-west-1",
		Credentials: aws.CredentialsProviderFunc(func(context.Context) (aws.Credentials, error) {
			return aws.Credentials{}, context.DeadlineExceeded
		})}
	if _, _, err := s.Auth(context.Background()); err == nil || !strings.Contains(err.Error(), "AWS credentials") {
		t.Errorf("Auth = %v, want an error naming the AWS credentials", err)
	}
}

func TestNewReadsTheRegionAndRequiresNames(t *testing.T) {
	t.Setenv("AWS_REGION", "ap-south-1")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	s, err := New(context.Background(), Options{CacheName: "c", UserID: "u"})
	if err != nil || s.Region != "ap-south-1" {
		t.Fatalf("New = %+v, %v; want the region of AWS_REGION", s, err)
	}
	if s, err := New(context.Background(), Options{CacheName: "c", UserID: "u", Region: "us-east-2"}); err != nil || s.Region != "us-east-2" {
		t.Errorf("New with a region = %+v, %v; want it", s, err)
	}
	if _, err := New(context.Background(), Options{UserID: "u"}); err == nil {
		t.Error("New without a cache name: no error")
	}
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	if _, err := New(context.Background(), Options{CacheName: "c", UserID: "u"}); err == nil || !strings.Contains(err.Error(), "region") {
		t.Errorf("New without any region = %v, want an error naming the region", err)
	}
}
