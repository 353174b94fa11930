package redis

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/openrls/ratelimit/src/regularfile"
)

// maxCredentialBytes bounds what a credentials file is read for: a
// password or an IAM token is far shorter, and a path pointed at a large
// file (or /dev/zero) must not take the memory.
const maxCredentialBytes = 64 << 10

// FileCredentials is a Credentials function that reads path again for
// every new connection: "password" or "user:password" (REDIS_AUTH_FILE),
// surrounding white space and a trailing newline trimmed. A secret that
// Vault, a Kubernetes Secret mount or a token refresher rewrites then
// applies to the next connection, without a restart. Errors name the
// file, never its content.
func FileCredentials(path string) func(ctx context.Context) (user, pass string, err error) {
	return func(context.Context) (string, string, error) {
		return ReadCredentials(path)
	}
}

// ReadCredentials reads a credentials file as FileCredentials does. It
// never blocks on a FIFO or reads a device without end (regularfile).
func ReadCredentials(path string) (user, pass string, err error) {
	b, err := regularfile.Read(path, maxCredentialBytes)
	if err != nil {
		return "", "", fmt.Errorf("credentials file: %w", err)
	}
	s := strings.TrimSpace(string(b))
	if s == "" {
		return "", "", errors.New("credentials file " + path + ": empty")
	}
	if strings.ContainsAny(s, "\r\n") {
		return "", "", fmt.Errorf("credentials file %s: more than one line (want password or user:password)", path)
	}
	user, pass = splitAuth(s)
	if pass == "" {
		return "", "", fmt.Errorf("credentials file %s: no password after the user", path)
	}
	return user, pass, nil
}
