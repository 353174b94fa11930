module github.com/openrls/ratelimit

go 1.26.8
