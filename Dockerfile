# Multi-stage build of the rate limit service. The build steps are the
# Makefile's `make build` (CGO off, -trimpath), so `make build` proves them
# on machines without a container engine.
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
# The server is /bin/ratelimit, where envoyproxy/ratelimit's image has it:
# Envoy Gateway's generated Deployment, Istio's sample and most Helm charts
# set `command: [/bin/ratelimit]`, which replaces the entrypoint, and
# distroless has no shell to add a link at run time. /usr/local/bin/server
# stays, as a link, for what was written against this image's older path.
# The server is built with profile-guided optimisation (cmd/server/release.pgo,
# from the load benchmark's profiles: about 2% less CPU a request); make build
# and the tests build without it, so a cold build compiles everything once.
RUN CGO_ENABLED=0 go build -trimpath -buildvcs=auto -pgo=cmd/server/release.pgo -o /out/bin/ratelimit ./cmd/server \
 && mkdir -p /out/usr/local/bin \
 && CGO_ENABLED=0 go build -trimpath -buildvcs=auto -o /out/usr/local/bin/config-check ./cmd/config-check \
 && CGO_ENABLED=0 go build -trimpath -buildvcs=auto -o /out/usr/local/bin/client ./cmd/client \
 && ln -s /bin/ratelimit /out/usr/local/bin/server

# Static binaries on distroless, as its unprivileged "nonroot" user, named by
# number: a pod with runAsNonRoot can only check a numeric user, and the
# kubelet refuses to start an image whose USER is a name. The manifests'
# runAsUser must match (examples/manifests_test.go checks it).
FROM gcr.io/distroless/static-debian12:nonroot
# Directories, so that the link is copied as a link.
COPY --from=build /out/bin/ /bin/
COPY --from=build /out/usr/local/bin/ /usr/local/bin/
# The example config at the default RUNTIME_ROOT/RUNTIME_APPDIRECTORY, so the
# image answers out of the box; mount your own (a ConfigMap) over it.
COPY examples/ratelimit-config.yaml /srv/runtime_data/current/config/ratelimit-config.yaml
USER 65532:65532
# 8080: HTTP (/healthcheck, /json, /metrics); 8081: gRPC (RLS). The debug
# port (6070) listens on loopback unless DEBUG_HOST is set.
EXPOSE 8080 8081
ENTRYPOINT ["/bin/ratelimit"]
