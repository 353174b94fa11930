// Package elasticache makes the passwords of AWS ElastiCache (and
// MemoryDB) IAM authentication: a SigV4 presigned request to connect as a
// user, valid for 15 minutes, signed locally with whatever credentials
// the AWS SDK's default chain resolves (environment, shared files, web
// identity, ECS and EKS Pod Identity, EC2 instance roles). Redis clients
// sign one for every new connection (REDIS_AWS_IAM_AUTH); ElastiCache ends
// a connection after 12 hours, so the client recycles connections before
// then.
package elasticache

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	v4 "github.com/aws/aws-sdk-go-v2/aws/signer/v4"
	"github.com/aws/aws-sdk-go-v2/config"
)

// tokenLifetime is how long a token may be used to authenticate: the
// most ElastiCache accepts.
const tokenLifetime = 15 * time.Minute

// MaxConnAge is how long a connection may be kept: under the 12 hours
// after which ElastiCache closes connections authenticated by IAM.
const MaxConnAge = 11 * time.Hour

// emptyPayload is the SHA-256 of an empty body, what a presigned GET signs.
const emptyPayload = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"

// Signer makes tokens for one user of one cache.
type Signer struct {
	// CacheName is the replication group or serverless cache's name (not
	// its endpoint), and UserID the ElastiCache user's id, which is also
	// the user name the connection authenticates as.
	CacheName, UserID string
	// Region is the cache's AWS region.
	Region string
	// Serverless marks a serverless cache (its tokens name the resource
	// type).
	Serverless bool
	// Credentials are the AWS credentials that sign.
	Credentials aws.CredentialsProvider
	// Now is the signing clock; nil means time.Now.
	Now func() time.Time
}

// Options are what a user sets (REDIS_AWS_IAM_*).
type Options struct {
	CacheName, UserID, Region string
	Serverless                bool
}

// New returns a Signer whose credentials come from the AWS SDK's default
// chain, and whose region, unless set, from its configuration too
// (AWS_REGION, the shared config file). It reads local configuration
// only; credentials are fetched when a token is first signed, so a
// service can start while they cannot yet be had.
func New(ctx context.Context, o Options) (*Signer, error) {
	if o.CacheName == "" || o.UserID == "" {
		return nil, errors.New("the cache name and the user id are both required")
	}
	var opts []func(*config.LoadOptions) error
	if o.Region != "" {
		opts = append(opts, config.WithRegion(o.Region))
	}
	cfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration: %w", err)
	}
	if cfg.Region == "" {
		return nil, errors.New("no AWS region: set it, or AWS_REGION")
	}
	return &Signer{CacheName: o.CacheName, UserID: o.UserID, Region: cfg.Region, Serverless: o.Serverless, Credentials: cfg.Credentials}, nil
}

// Token signs a password for a new connection: the presigned request's
// URL without its scheme, as ElastiCache reads it.
func (s *Signer) Token(ctx context.Context) (string, error) {
	creds, err := s.Credentials.Retrieve(ctx)
	if err != nil {
		return "", fmt.Errorf("elasticache IAM: AWS credentials: %w", err)
	}
	q := url.Values{"Action": {"connect"}, "User": {s.UserID}}
	if s.Serverless {
		q.Set("ResourceType", "ServerlessCache")
	}
	q.Set("X-Amz-Expires", fmt.Sprint(int(tokenLifetime/time.Second)))
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+s.CacheName+"/?"+q.Encode(), nil)
	if err != nil {
		return "", fmt.Errorf("elasticache IAM: cache name %q: %w", s.CacheName, err)
	}
	now := time.Now
	if s.Now != nil {
		now = s.Now
	}
	signed, _, err := v4.NewSigner().PresignHTTP(ctx, creds, req, emptyPayload, "elasticache", s.Region, now().UTC())
	if err != nil {
		return "", fmt.Errorf("elasticache IAM: signing: %w", err)
	}
	return strings.TrimPrefix(signed, "http://"), nil
}

// Auth is a Redis client's credentials function: the user id and a fresh
// token, asked for every new connection.
func (s *Signer) Auth(ctx context.Context) (user, pass string, err error) {
	t, err := s.Token(ctx)
	return s.UserID, t, err
}
