package server

import (
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
)

func TestHealth(t *testing.T) {
	redisDown := false
	h := &Health{}
	h.AddCheck("redis", func() error {
		if redisDown {
			return errors.New("connection refused")
		}
		return nil
	})
	check := func(wantCode int, wantBody string) {
		t.Helper()
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthcheck", nil))
		if rec.Code != wantCode || !strings.Contains(rec.Body.String(), wantBody) {
			t.Errorf("/healthcheck = %d %q, want %d containing %q", rec.Code, rec.Body.String(), wantCode, wantBody)
		}
	}
	check(200, "OK")
	redisDown = true
	check(500, "redis: connection refused")
	redisDown = false
	check(200, "OK")
	h.Stopping()
	check(500, "shutting down")
}
