package rlqstest

import (
	"context"
	"fmt"
	"time"

	rlqsv3 "github.com/envoyproxy/go-control-plane/envoy/service/rate_limit_quota/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/durationpb"
)

// Stall opens a stream to the RLQS server at target as a peer that reads
// little (gRPC's smallest flow-control windows, not grown by its
// estimates) and reports 3,000 buckets of key in domain on it, then reads
// nothing: each renewal of those buckets is a message of over 100 KB, so
// two fill the windows and the server's write quota, and the next send
// blocks. It returns the stream, to read once the stall is seen, and what
// closes its connection.
func Stall(ctx context.Context, target, domain, key string) (grpc.BidiStreamingClient[rlqsv3.RateLimitQuotaUsageReports, rlqsv3.RateLimitQuotaResponse], func(), error) {
	slow, err := grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(64<<10), grpc.WithInitialConnWindowSize(64<<10))
	if err != nil {
		return nil, nil, fmt.Errorf("rlqstest: a slow connection to %s: %w", target, err)
	}
	st, err := rlqsv3.NewRateLimitQuotaServiceClient(slow).StreamRateLimitQuotas(ctx)
	if err != nil {
		slow.Close()
		return nil, nil, fmt.Errorf("rlqstest: a stream on the slow connection: %w", err)
	}
	report := &rlqsv3.RateLimitQuotaUsageReports{Domain: domain}
	for i := range 3000 {
		report.BucketQuotaUsages = append(report.BucketQuotaUsages, &rlqsv3.RateLimitQuotaUsageReports_BucketQuotaUsage{
			BucketId:    &rlqsv3.BucketId{Bucket: map[string]string{key: fmt.Sprintf("%s-%04d", key, i)}},
			TimeElapsed: durationpb.New(time.Second), NumRequestsAllowed: 5})
	}
	if err := st.Send(report); err != nil {
		slow.Close()
		return nil, nil, fmt.Errorf("rlqstest: the report of 3,000 buckets: %w", err)
	}
	return st, func() { slow.Close() }, nil
}
